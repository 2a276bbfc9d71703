"""A real server serving an ONNX graph from a Burnpack file: answers, shared weights, reload."""

from __future__ import annotations

import os
import threading

import numpy as np
import onnxruntime
import pytest
from support import onnx_graphs, onnx_texts
from support.commands import cli
from support.processes import Background
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


def mapped_copy(pid: int) -> set[str]:
    """The files of a prepacked copy (under the tests' cache folder) that a process maps."""
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split()[-1] for line in maps if "/workerpool/onnx/" in line}


@pytest.mark.parametrize("cache", ["default", "off"])
def test_forked_workers_share_the_weights(tmp_path, cache_dir, cache):
    """Every worker has run all its layers and holds far less private memory than their 32 MiB:
    no copy at load nor while serving. On the prepacked copy the workers map its data file;
    with ``--cache-dir off`` they run on the Burnpack file's mapping, all of it resident (there
    prepacking would make a copy: 32 MiB of USS each). (About 6 MiB of USS each here.)"""
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp_of_size(32 * MiB))
    size = os.path.getsize(path)
    x = np.ones((1, 1024), np.float32)
    cache_args = ("--cache-dir", "off") if cache == "off" else ()
    with Server(path, "--threads-per-worker", "1", *cache_args, workers=WORKERS) as server, \
            workerpool.Client(server.endpoint) as client:
        idle = {w["pid"]: w["memory"] for w in server.status()["workers"]}
        while not all(w["served"] > 0 for w in server.status(memory=False)["workers"]):
            list(client.infer_many([x] * 2 * WORKERS, window=WORKERS))
        status = server.status()
        copies = {w["pid"]: mapped_copy(w["pid"]) for w in status["workers"]}
    for worker in status["workers"]:
        memory, before = worker["memory"], idle[worker["pid"]]
        if cache == "off":
            assert memory["weights_resident"] >= 0.95 * (size - MiB) and not copies[worker["pid"]]
        else:
            assert {os.path.basename(f) for f in copies[worker["pid"]]} == {"model.data"}
            assert str(cache_dir) in copies[worker["pid"]].pop()
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


def test_an_onnx_file_published_over_another_is_served_with_no_failed_request(tmp_path, cache_dir):
    """The new file is validated on views (the router does not wait for a prepacked copy); the
    first worker of the new generation makes its copy, on which the new generation serves."""
    old, new = onnx_graphs.mlp(seed=0), onnx_graphs.mlp(seed=1)
    served = onnx_graphs.write_onnx_bpk(tmp_path / "served.bpk", old)
    incoming = onnx_graphs.write_onnx_bpk(tmp_path / "incoming.bpk", new)
    x = np.random.default_rng(5).standard_normal((3, 16), dtype=np.float32)
    expected = {1: reference(old, {"x": x})[0], 2: reference(new, {"x": x})[0]}
    done = threading.Event()
    with Server(served, "--threads-per-worker", "1", workers=WORKERS) as server, \
            workerpool.Client(server.endpoint, retries=0) as client:

        def ask_until_done() -> list[workerpool.Result]:
            answers = []
            while not done.is_set() or not answers or answers[-1].generation != 2:
                answers.append(client.request(x))
            return answers

        asking = Background(ask_until_done)
        published = cli("publish", incoming, served, "--control", server.control, timeout=60)
        assert published.returncode == 0, published.stderr
        server.wait_for(lambda s: s["model"]["generation"] == 2
                        and all(w["generation"] == 2 for w in s["workers"]))
        done.set()
        answers = asking.join(60)
    assert {a.generation for a in answers} <= {1, 2} and answers[-1].generation == 2
    made = [name for name in os.listdir(cache_dir / "onnx") if name.startswith("served.bpk-")]
    assert len(made) == 2  # one copy for each generation's file
    for answer in answers:
        np.testing.assert_allclose(answer.outputs["y"], expected[answer.generation], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cache", ["default", "off"])
def test_a_pass_past_max_worker_memory_fails_alone_and_the_worker_keeps_serving(tmp_path, cache):
    """onnxruntime's arena keeps what it took when an allocation fails; it is given back, so that
    the next request has the memory it needs: on the prepacked copy and on views."""
    graph = onnx_graphs.mlp(width=256, hidden=4096)
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", graph)
    small, huge = np.ones((4, 256), np.float32), np.ones((4000, 256), np.float32)  # 64 MiB a layer
    cache_args = ("--cache-dir", "off") if cache == "off" else ()
    with Server(path, "--threads-per-worker", "1", "--max-worker-memory", "64MiB", "--max-batch", "4000",
                *cache_args, workers=1) as server, \
            workerpool.Client(server.endpoint, timeout=30, retries=0) as client:
        pid = client.request(small).worker_pid
        for _ in range(2):
            with pytest.raises(workerpool.InternalError, match="^MemoryError: onnx: onnxruntime ran out of memory"):
                client.request(huge)
            answer = client.request(small)
            assert answer.worker_pid == pid
            np.testing.assert_allclose(answer.outputs["y"], reference(graph, {"x": small})[0], rtol=1e-5, atol=1e-6)


def test_an_idle_worker_gives_back_what_its_last_pass_took(tmp_path):
    """A pass over 40,000 rows leaves onnxruntime's arena holding some 6 MiB of intermediate
    arrays, under the bound at which a pass gives it back at once; a second without a
    request, the worker gives it back. (The arena keeps the region of its first pass, a small
    one here.)"""
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp())
    x = np.ones((40_000, 16), np.float32)
    with Server(path, "--threads-per-worker", "1", "--max-message-size", "4MiB", "--max-batch", "40000",
                workers=1) as server, \
            workerpool.Client(server.endpoint) as client:
        client.infer(x[:4])
        rested = server.status()["workers"][0]["memory"]["anon"]
        assert client.infer(x)["y"].shape == (40_000, 8)
        grown = server.status()["workers"][0]["memory"]["anon"]
        assert grown > rested + 4 * MiB
        server.wait_for(lambda status: status["workers"][0]["memory"]["anon"] < rested + 2 * MiB,
                        memory=True)
