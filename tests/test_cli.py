"""The command line as a user meets it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import os

import pytest
from helpers import cli

from workerpool import burnpack


def test_inspect_table_of_the_burn_fixture(burn_mnist_path):
    done = cli("inspect", str(burn_mnist_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "aligned layout, 18 tensors" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("conv2.conv.weight"))
    assert row == ["conv2.conv.weight", "F32", "[64,", "64,", "3,", "3]", "147456", "5120", "yes"]
    assert "fc3.bias" in out and "1044736" in out  # fc3.bias's absolute offset
    assert "total: 1043240 bytes" in out
    assert "model: burn-mnist" in out


def test_inspect_json(burn_mnist_path):
    done = cli("inspect", str(burn_mnist_path), "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert set(info) == {"path", "version", "layout", "metadata", "scalars", "model", "total_bytes", "tensors"}
    assert (info["version"], info["layout"], info["model"]) == (1, "aligned", "burn-mnist")
    assert len(info["tensors"]) == 18
    fc1 = next(t for t in info["tensors"] if t["name"] == "fc1.weight")
    assert fc1 == {"name": "fc1.weight", "dtype": "F32", "shape": [1600, 128], "offset": 153856, "nbytes": 819200}


@pytest.mark.parametrize("content", [None, b"", b"NRUB\x02\x00\x00\x00\x00\x00", b"not a burnpack file"])
def test_inspect_invalid_or_missing_file_is_one_line(tmp_path, content):
    path = tmp_path / "bad.bpk"
    if content is not None:
        path.write_bytes(content)
    done = cli("inspect", str(path))
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"workerpool: error: {path}: "), done.stderr


def test_new_model_writes_a_recognised_mlp_of_about_the_size(tmp_path):
    out = tmp_path / "m.bpk"
    done = cli("new-model", str(out), "--size", "3MiB", "--seed", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"workerpool: wrote {out}: mlp ")
    assert abs(os.path.getsize(out) - 3 * 2**20) < 0.02 * 3 * 2**20
    pack = burnpack.read(out)
    assert pack.metadata["workerpool.model"] == "mlp"
    inspected = json.loads(cli("inspect", str(out), "--json").stdout)
    assert inspected["model"] == "mlp"


def test_new_model_bad_size_is_a_usage_error(tmp_path):
    done = cli("new-model", str(tmp_path / "m.bpk"), "--size", "lots")
    assert done.returncode == 2
    assert "invalid size 'lots'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "m.bpk").exists()


def test_help_explains_every_command():
    done = cli("--help")
    assert done.returncode == 0
    for command in ("serve", "status", "infer", "new-model", "inspect"):
        assert command in done.stdout


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--max-batch", "0", "must be at least 1"),
    ("--max-batch", "many", "invalid count 'many'"),
    ("--batch-wait", "-1", "not a number of milliseconds from 0 up"),
    ("--batch-wait", "soon", "invalid number of milliseconds 'soon'"),
])
def test_batching_options_refuse_nonsense_before_starting(small_model, option, value, message):
    done = cli("serve", small_model, option, value)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_version_and_the_command_list():
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("workerpool ")
    alone = cli()
    assert alone.returncode == 2 and "serve" in alone.stdout and "convert" in alone.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "m.bpk", "--bind", "127.0.0.1:5555"], "write tcp://127.0.0.1:5555"),
    (["new-model", "x.bpk", "--size", "0"], "--size: must be more than 0 bytes"),
    (["infer", "--inptu", "x.npy"], "required: --input"),
])
def test_usage_errors_are_one_line(args, message):
    done = cli(*args)
    assert done.returncode == 2 and message in done.stderr
    assert done.stderr.count("\n") == 1 and "usage:" not in done.stderr


def test_infer_says_at_once_that_nothing_listens_and_checks_its_output_first(tmp_path):
    import socket

    import numpy as np

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    done = cli("infer", "--input", tmp_path / "x.npy", "--endpoint", f"tcp://127.0.0.1:{port}", timeout=20)
    assert done.returncode == 1 and "nothing listens at" in done.stderr
    bad = cli("infer", "--input", tmp_path / "x.npy", "--output", tmp_path / "no" / "y.npy",
              "--endpoint", f"tcp://127.0.0.1:{port}")
    assert bad.returncode == 1 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_new_model_with_many_layers_says_so_in_one_short_line(tmp_path):
    done = cli("new-model", tmp_path / "deep.bpk", "--size", "2MiB", "--width", "64")
    assert done.returncode == 0 and done.stderr == ""  # no progress when not on a terminal
    line = done.stdout.strip()
    assert "\n" not in line and len(line) < 160 and " x 64 -> " in line, line
