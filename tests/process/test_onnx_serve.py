"""A real server serving an ONNX graph from a Burnpack file: answers, shared weights, reload."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime
import pytest
from support import onnx_graphs, onnx_texts
from support.server import Server

import workerpool
from workerpool import burnpack
from workerpool.models import onnx_layout

MiB = 1024 * 1024
WORKERS = 2


def reference(graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_a_client_gets_onnxruntimes_answers(tmp_path):
    graph = onnx_graphs.embedding()
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", graph)
    rng = np.random.default_rng(3)
    requests = [{"ids": rng.integers(0, 50, (rows, 7), dtype=np.int64),
                 "mask": np.ones((rows, 7), np.float32)} for rows in (1, 2, 3, 1)]
    with Server(path, "--threads-per-worker", "1", workers=WORKERS) as server, \
            workerpool.Client(server.endpoint) as client:
        assert [entry["name"] for entry in client.info()["inputs"]] == ["ids", "mask"]
        answers = list(client.infer_many(requests, window=4))
        with pytest.raises(workerpool.WorkerpoolError, match="outside"):
            client.infer({"ids": np.array([[50]]), "mask": np.ones((1, 1), np.float32)})
        again = client.infer(requests[0])  # the worker that refused it still serves
    for request, outputs in zip(requests, answers, strict=True):
        states, pooled = reference(graph, request)
        np.testing.assert_allclose(outputs["states"], states, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(outputs["pooled"], pooled, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(again["pooled"], answers[0]["pooled"])


def test_forked_workers_share_the_weights(tmp_path):
    """Every worker has run all its layers (the weights all resident) and holds far less private
    memory than their 32 MiB: no copy at load (prepacking makes one, 32 MiB of USS each) nor
    while serving. (About 6 MiB of USS each here.)"""
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp_of_size(32 * MiB))
    size = os.path.getsize(path)
    x = np.ones((1, 1024), np.float32)
    with Server(path, "--threads-per-worker", "1", workers=WORKERS) as server, \
            workerpool.Client(server.endpoint) as client:
        idle = {w["pid"]: w["memory"] for w in server.status()["workers"]}
        while not all(w["served"] > 0 for w in server.status(memory=False)["workers"]):
            list(client.infer_many([x] * 2 * WORKERS, window=WORKERS))
        status = server.status()
    for worker in status["workers"]:
        memory, before = worker["memory"], idle[worker["pid"]]
        assert memory["weights_resident"] >= 0.95 * (size - MiB)
        assert memory["uss"] < size / 3, memory
        assert memory["anon"] - before["anon"] < 8 * MiB, (memory, before)
        assert memory["uss"] - before["uss"] < 8 * MiB, (memory, before)


def test_a_corrupt_graph_is_refused_and_the_old_weights_keep_serving(tmp_path):
    graph = onnx_graphs.mlp()
    served = onnx_graphs.write_onnx_bpk(tmp_path / "served.bpk", graph)
    pack = burnpack.read(served)
    corrupt = dict(pack.tensors)
    corrupt[onnx_layout.GRAPH_TENSOR] = corrupt[onnx_layout.GRAPH_TENSOR][:-9]
    incoming = tmp_path / "incoming.bpk"
    burnpack.write(incoming, corrupt, metadata=pack.metadata)
    del pack, corrupt
    x = np.ones((2, 16), np.float32)
    with Server(served, workers=WORKERS) as server, workerpool.Client(server.endpoint) as client:
        os.rename(incoming, served)
        status = server.wait_for(lambda s: (s["model"]["last_reload"] or {}).get("result") == "refused")
        assert status["model"]["generation"] == 1
        assert status["model"]["last_reload"]["reason"].startswith("onnx: ")
        result = client.request(x)
    assert result.generation == 1
    np.testing.assert_allclose(result.outputs["y"], reference(graph, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_a_client_gets_the_embeddings_of_texts(tmp_path):
    graph = onnx_texts.encoder()
    path = onnx_texts.converted(tmp_path / "st", graph, "mean", True)
    texts = ["hello world", "the cat sat on a mat", "a text"]
    with Server(path, "--threads-per-worker", "1", workers=WORKERS) as server, \
            workerpool.Client(server.endpoint) as client:
        assert client.info()["inputs"][0]["dtype"] == "text"
        embedding = client.infer(texts)["embedding"]
    np.testing.assert_allclose(embedding, onnx_texts.reference(graph, texts, "mean", True),
                               rtol=1e-5, atol=1e-6)
