"""A missing optional dependency is one line naming the package and the extra that installs
it, never a traceback. Each test hides the package from a real command, as a venv without that
extra lacks it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.commands import cli
from support.onnx_graphs import mlp, write_onnx_bpk
from support.sockets import free_port

pytestmark = pytest.mark.process


def without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """The environment of a Python in which ``modules`` cannot be imported."""
    site = tmp_path / "without"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nfor name in {modules!r}:\n    sys.modules[name] = None\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def assert_one_line(done, *words: str, exit_code: int = 2) -> None:
    assert done.returncode == exit_code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def test_http_without_httptools_says_which_extra(tmp_path):
    model = tmp_path / "model.bpk"
    assert cli("new-model", model, "--size", "64KiB").returncode == 0
    done = cli("serve", "--workers", "1", "--bind", "tcp://127.0.0.1:*", "--http", f"127.0.0.1:{free_port()}", model,
               env=without(tmp_path, "httptools"), timeout=60)
    assert_one_line(done, "--http needs the httptools package", "pip install httptools", "'.[http]'")


def test_an_onnx_model_without_onnxruntime_says_which_extra(tmp_path):
    model = write_onnx_bpk(tmp_path / "onnx.bpk", mlp())
    done = cli("serve", "--workers", "1", "--bind", "tcp://127.0.0.1:*", model,
               env=without(tmp_path, "onnxruntime"), timeout=60)
    assert_one_line(done, "an ONNX model needs the onnxruntime package", "'.[onnx]'")


def test_converting_safetensors_without_safetensors_says_which_extra(tmp_path):
    source = tmp_path / "weights.safetensors"
    source.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    done = cli("convert", source, tmp_path / "out.bpk", env=without(tmp_path, "safetensors"))
    assert_one_line(done, "reading .safetensors needs the safetensors package", "'.[hf]'", exit_code=1)
