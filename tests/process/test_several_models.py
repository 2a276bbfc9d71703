"""Several models in one pool, end to end: every worker serves every model (or those it is
given), a request names its model through either door, a request's texts spread over the
workers, and each model lives its own life (new weights, refused weights, added, removed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from support.bert import tiny_bert, tiny_tokenizer
from support.commands import cli
from support.models import build_local
from support.server import Server
from support.sockets import free_port

import workerpool
from workerpool import models
from workerpool.linux.procfs import processes_mapping

WIDTH = 16
TEXTS = ["hello world", "a text", "hello", "world a text"]


@pytest.fixture
def served(tmp_path: Path) -> dict[str, Path]:
    """Three models: two mlps of different widths and a tiny text model with its tokenizer."""
    paths = {"narrow": tmp_path / "narrow.bpk", "wide": tmp_path / "wide.bpk", "embed": tmp_path / "tiny.bpk"}
    models.generate_mlp(paths["narrow"], 64 * 1024, width=WIDTH, seed=1)
    models.generate_mlp(paths["wide"], 256 * 1024, width=4 * WIDTH, seed=2)
    tiny_bert(paths["embed"], tokenizer=tiny_tokenizer())
    return paths


def several(paths: dict[str, Path], *args: str, workers: int = 2) -> Server:
    """A pool of ``paths``: the first by its file's name, the others as NAME=FILE."""
    names = list(paths)
    return Server(paths[names[0]], *(f"{name}={paths[name]}" for name in names[1:]), *args, workers=workers)


def post(url: str, document: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(document).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_every_worker_serves_every_model_through_both_doors(served):
    narrow, wide = build_local(served["narrow"]), build_local(served["wide"])
    port = free_port()
    x, y = np.ones((3, WIDTH), np.float32), np.ones((2, 4 * WIDTH), np.float32)
    with several(served, "--http", f"127.0.0.1:{port}") as server, \
            workerpool.Client(server.endpoint) as client:
        assert "serving narrow=" in server.ready_line and "models mlp, mlp, bert" in server.ready_line
        with pytest.raises(workerpool.ModelNotFound, match=r"must name one \(served: embed, narrow, wide\)"):
            client.infer(x)
        with pytest.raises(workerpool.ModelNotFound, match="no model named 'other'"):
            client.infer(x, model="other")
        np.testing.assert_allclose(client.infer(x, model="narrow"), narrow(x), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(client.infer(y, model="wide"), wide(y), rtol=1e-5, atol=1e-6)
        assert client.info(model="wide")["inputs"][0]["shape"] == [None, 4 * WIDTH]
        embedded = client.infer(TEXTS, model="embed")
        assert embedded["embedding"].shape == (4, 8)
        base = f"http://127.0.0.1:{port}"
        status, answer = post(f"{base}/v2/models/wide/infer", {"inputs": [
            {"name": "input", "shape": [2, 4 * WIDTH], "datatype": "FP32", "data": y.ravel().tolist()}]})
        assert status == 200 and np.allclose(np.array(answer["outputs"][0]["data"]), wide(y).ravel(), atol=1e-5)
        status, answer = post(f"{base}/v1/embeddings", {"model": "embed", "input": TEXTS})
        assert status == 200 and [item["index"] for item in answer["data"]] == [0, 1, 2, 3]
        np.testing.assert_allclose(np.array([item["embedding"] for item in answer["data"]]),
                                   embedded["embedding"], rtol=1e-5, atol=1e-6)
        status, answer = post(f"{base}/v1/embeddings", {"model": "narrow", "input": "hello"})
        assert status == 400 and "takes no texts" in answer["error"]["message"]
        assert [m["id"] for m in json.loads(get(f"{base}/v1/models")[1])["data"]] == ["narrow", "wide", "embed"]
        status, index = post(f"{base}/v2/repository/index", {})
        assert status == 200 and {(m["name"], m["state"]) for m in index} == {
            ("narrow", "READY"), ("wide", "READY"), ("embed", "READY")}
        assert get(f"{base}/v2/models/embed/ready")[0] == 200 and get(f"{base}/readyz")[0] == 200
        status = server.status()
        metrics = get(f"{base}/metrics")[1].decode()
    assert set(status["models"]) == {"narrow", "wide", "embed"} and status["model"] is None
    assert all(set(worker["models"]) == {"narrow", "wide", "embed"} for worker in status["workers"])
    assert {name: model["workers"] for name, model in status["models"].items()} == {
        "narrow": 2, "wide": 2, "embed": 2}
    assert 'workerpool_requests_total{code="ok",model="wide",route="zmq"} 2.0' in metrics  # and its info
    assert 'workerpool_requests_total{code="ok",model="wide",route="infer"} 1.0' in metrics
    assert 'workerpool_requests_total{code="bad_request",model="narrow",route="embeddings"} 1.0' in metrics
    assert 'workerpool_requests_total{code="model_not_found",model="",route="zmq"} 2.0' in metrics
    assert 'workerpool_generation{model="embed"} 1.0' in metrics


def test_a_request_of_many_texts_runs_in_parts_on_every_worker(served):
    texts = [TEXTS[i % 4] + " hello" * (i % 5) for i in range(400)]
    with Server(served["embed"], "--max-batch", "16", workers=2) as server, \
            workerpool.Client(server.endpoint) as client:
        together = client.infer(texts)["embedding"]
        alone = np.concatenate([client.infer(texts[i:i + 1])["embedding"] for i in (0, 7, 399)])
        rows = [worker["rows"] for worker in server.status()["workers"]]
    np.testing.assert_allclose(together[[0, 7, 399]], alone, rtol=1e-5, atol=1e-6)
    assert all(ran > 0 for ran in rows) and sum(rows) == 400 + 3  # each worker ran part of it


def test_a_model_given_fewer_workers_is_mapped_by_that_many(served):
    with several(served, "--workers", "wide=1", workers=3) as server, \
            workerpool.Client(server.endpoint) as client:
        status = server.status(memory=False)
        assert [sorted(worker["models"]) for worker in status["workers"]].count(["embed", "narrow", "wide"]) == 1
        assert status["models"]["wide"]["workers"] == 1 and status["models"]["narrow"]["workers"] == 3
        pids = {worker["pid"] for worker in status["workers"]}
        assert len(set(processes_mapping(str(served["wide"]))) & pids) == 1
        assert len(set(processes_mapping(str(served["narrow"]))) & pids) == 3
        for _ in range(4):
            client.infer(np.ones((1, 4 * WIDTH), np.float32), model="wide")
        victim = next(w["pid"] for w in status["workers"] if "wide" in w["models"])
        os.kill(victim, signal.SIGKILL)
        server.wait_for(lambda s: victim not in [w["pid"] for w in s["workers"]]
                        and s["models"]["wide"]["workers"] == 1 and len(s["workers"]) == 3
                        and all(w["state"] == "ready" for w in s["workers"]))
        assert client.infer(np.ones((1, 4 * WIDTH), np.float32), model="wide").shape == (1, 10)


def test_new_weights_for_one_model_reload_it_alone(served, tmp_path):
    update = tmp_path / "update.bpk"
    models.generate_mlp(update, 64 * 1024, width=WIDTH, seed=9)
    misfit = tmp_path / "misfit.bpk"
    models.generate_mlp(misfit, 64 * 1024, width=WIDTH + 1, seed=9)
    x = np.ones((1, WIDTH), np.float32)
    with several(served) as server, workerpool.Client(server.endpoint) as client:
        assert cli("publish", update, served["narrow"], "--control", server.control).returncode == 0
        status = server.wait_for(lambda s: s["models"]["narrow"]["generation"] == 2 and all(
            w["models"]["narrow"] == 2 for w in s["workers"]))
        assert {name: model["generation"] for name, model in status["models"].items()} == {
            "narrow": 2, "wide": 1, "embed": 1}
        assert all(w["models"]["wide"] == 1 for w in status["workers"])
        np.testing.assert_allclose(client.infer(x, model="narrow"), build_local(update)(x), rtol=1e-5, atol=1e-6)
        shutil.copyfile(misfit, tmp_path / "next.bpk")
        os.replace(tmp_path / "next.bpk", served["wide"])  # as publish --no-check would
        status = server.wait_for(lambda s: s["degraded"] is not None)
        assert status["degraded"].startswith("wide: new weights refused") and status["models"]["narrow"]["degraded"] is None
        assert status["models"]["wide"]["generation"] == 1
        assert client.infer(np.ones((1, 4 * WIDTH), np.float32), model="wide").shape == (1, 10)
        probe = cli("status", "--ready", "--control", server.control)
        assert probe.returncode == 1 and "wide: new weights refused" in probe.stderr


def test_models_are_added_and_removed_without_a_restart(served, tmp_path):
    extra = tmp_path / "extra.bpk"
    models.generate_mlp(extra, 64 * 1024, width=8, seed=5)
    pair = {"narrow": served["narrow"], "wide": served["wide"]}
    with several(pair) as server, workerpool.Client(server.endpoint) as client:
        pids = set(server.worker_pids())
        added = cli("models", "add", "extra=extra", "--control", server.control, timeout=60,
                    cwd=tmp_path)  # a path of the caller's directory, without .bpk, as serve takes it
        assert added.returncode == 0 and "every worker now serves extra=" in added.stdout, added.stderr
        assert client.infer(np.ones((1, 8), np.float32), model="extra").shape == (1, 10)
        assert set(server.worker_pids()) == pids  # no worker was restarted for it
        listed = cli("models", "--control", server.control)
        assert "extra: " in listed.stdout and "2 workers" in listed.stdout
        removed = cli("models", "remove", "wide", "--control", server.control)
        assert removed.returncode == 0, removed.stderr
        with pytest.raises(workerpool.ModelNotFound):
            client.infer(np.ones((1, 4 * WIDTH), np.float32), model="wide")
        server.wait_for(lambda s: all("wide" not in w["models"] for w in s["workers"]))
        served["wide"].unlink()  # a removed model's file is held by no process of the pool
        server.wait_for(lambda s: not processes_mapping_deleted(server, "wide.bpk"))
        refused = cli("models", "remove", "nothing", "--control", server.control)
        assert refused.returncode == 1 and "no model named 'nothing'" in refused.stderr


def processes_mapping_deleted(server: Server, name: str) -> list[int]:
    """The pool's processes that still map a deleted file called ``name`` (or hold it open)."""
    holding = []
    for process in server.descendants():
        try:
            maps = Path(f"/proc/{process.pid}/maps").read_text()
            fds = [os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{process.pid}/fd")]
        except OSError:
            continue
        if any(name in line and "(deleted)" in line for line in maps.splitlines()) or \
                any(name in target and "(deleted)" in target for target in fds):
            holding.append(process.pid)
    return holding


def test_a_folder_is_a_model_repository_read_again_on_sighup(served, tmp_path):
    folder = tmp_path / "repository"
    folder.mkdir()
    for name in ("narrow", "wide"):
        shutil.copyfile(served[name], folder / f"{name}.bpk")
    with Server(folder, workers=2) as server, workerpool.Client(server.endpoint) as client:
        assert sorted(server.status(memory=False)["models"]) == ["narrow", "wide"]
        shutil.copyfile(served["embed"], tmp_path / "incoming.bpk")
        os.replace(tmp_path / "incoming.bpk", folder / "embed.bpk")
        (folder / "wide.bpk").unlink()
        server.signal(signal.SIGHUP)
        server.wait_for(lambda s: sorted(s["models"]) == ["embed", "narrow"] and all(
            sorted(w["models"]) == ["embed", "narrow"] for w in s["workers"]))
        assert client.infer(TEXTS, model="embed")["embedding"].shape == (4, 8)
        with pytest.raises(workerpool.ModelNotFound):
            client.infer(np.ones((1, 4 * WIDTH), np.float32), model="wide")
        server.wait_for(lambda s: not processes_mapping_deleted(server, "wide.bpk"))
        (folder / "narrow.bpk").unlink()  # gone from the folder: the model goes, no weights were refused
        status = server.wait_for(lambda s: sorted(s["models"]) == ["embed"])
        assert status["degraded"] is None and server.status(memory=False)["degraded"] is None


def test_a_model_found_later_keeps_to_its_workers_when_others_are_replaced(served, tmp_path):
    """Its workers loaded it after they started: a replacement of another worker must not map it."""
    folder = tmp_path / "repository"
    folder.mkdir()
    shutil.copyfile(served["narrow"], folder / "narrow.bpk")
    with Server(folder, "--workers", "embed=1", workers=3) as server:
        shutil.copyfile(served["embed"], tmp_path / "incoming.bpk")
        os.replace(tmp_path / "incoming.bpk", folder / "embed.bpk")
        server.signal(signal.SIGHUP)
        status = server.wait_for(lambda s: "embed" in s["models"] and s["models"]["embed"]["workers"] == 1
                                 and not s["models"]["embed"]["reloading"])
        victim = next(w["pid"] for w in status["workers"] if "embed" not in w["models"])
        os.kill(victim, signal.SIGKILL)
        status = server.wait_for(lambda s: victim not in [w["pid"] for w in s["workers"]] and len(s["workers"]) == 3
                                 and all(w["state"] == "ready" for w in s["workers"]))
        assert [sorted(w["models"]) for w in status["workers"]].count(["embed", "narrow"]) == 1
