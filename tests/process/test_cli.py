"""The command line as a user meets it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import pty
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from support.bert import tiny_bert
from support.commands import cli
from support.keys import CurveKeys
from support.server import Server
from support.sockets import free_backend

import workerpool
from workerpool import burnpack, models, security
from workerpool.cli.main import build_parser


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


def test_help_explains_every_command():
    done = cli("--help")
    assert done.returncode == 0
    for command in ("serve", "status", "infer", "new-model", "inspect"):
        assert command in done.stdout


def test_version_and_the_command_list():
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("workerpool ")
    alone = cli()
    assert alone.returncode == 2 and "serve" in alone.stdout and "convert" in alone.stdout


@pytest.fixture
def x_npy(tmp_path) -> Path:
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    return tmp_path / "x.npy"


def test_what_is_not_an_endpoint_or_an_input_is_named(tmp_path, x_npy):
    (tmp_path / "first.py").write_text("print(1)\n")
    (tmp_path / "folder").mkdir()
    with open(tmp_path / "lies.npy", "wb") as f:  # a header claiming 400 GB, then 64 bytes
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                 "shape": (10**11,)})
        f.write(bytes(64))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "notes.zip", "w") as archive:
        archive.writestr("notes.txt", "not an array")
    cases = [
        (["infer", "--input", tmp_path / "first.py"], "first.py: not a .npy file (np.save writes one)"),
        (["infer", "--input", tmp_path / "none.npy"], "none.npy: cannot read it: No such file"),
        (["infer", "--input", tmp_path / "lies.npy"], "declares 400000000000 bytes of data, the file holds 64"),
        (["infer", "--input", tmp_path / "objects.npy"], "holds Python objects, which are never unpickled"),
        (["infer", "--input", tmp_path / "notes.zip"], "a zip archive but not an .npz of arrays"),
        (["status", "--control", f"ipc://{tmp_path}/folder"], "folder is a folder, not a socket"),
    ]
    for args, message in cases:
        done = cli(*args, timeout=30)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr


def test_infer_reads_its_input_from_a_pipe(x_npy):
    """``--input /dev/stdin`` (or a shell's ``<(...)``): read front to back, never seeked."""
    done = subprocess.run([sys.executable, "-m", "workerpool", "infer", "--input", "/dev/stdin",
                           "--endpoint", free_backend()], input=x_npy.read_bytes(),
                          capture_output=True, timeout=30, check=False)
    assert done.returncode == 1 and b"nothing listens at" in done.stderr, done.stderr  # loaded


def test_infer_says_at_once_that_nothing_listens_and_checks_its_output_first(tmp_path, x_npy):
    endpoint = free_backend()
    done = cli("infer", "--input", x_npy, "--endpoint", endpoint, "--timeout", "60", timeout=20)
    assert done.returncode == 1 and "nothing listens at" in done.stderr and "refused" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    bad = cli("infer", "--input", x_npy, "--output", tmp_path / "no" / "y.npy", "--endpoint", endpoint)
    assert bad.returncode == 1 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


@contextlib.contextmanager
def _listener(answer: bytes | None) -> Iterator[str]:
    """A loopback TCP port that accepts and then sends ``answer`` and closes, or stays silent."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = server.accept()
                accepted.append(peer)
                if answer is not None:
                    peer.sendall(answer)
                    peer.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)
        for peer in accepted:
            peer.close()


@pytest.mark.parametrize(("answer", "message"), [
    (None, "accepted the connection but sent nothing in 2 s"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "the peer does not speak ZeroMQ's protocol (wrong port?)"),
])
def test_infer_names_a_listener_that_is_not_a_workerpool_server(x_npy, answer, message):
    with _listener(answer) as endpoint:
        done = cli("infer", "--input", x_npy, "--endpoint", endpoint, "--timeout", "60", timeout=30)
    assert done.returncode == 1 and message in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_server_that_shakes_hands_but_never_answers_is_called_stuck_not_absent(x_npy, context):
    silent = context.socket(zmq.ROUTER)
    try:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        done = cli("infer", "--input", x_npy, "--endpoint", f"tcp://127.0.0.1:{port}",
                   "--timeout", "0.5", "--retries", "1", timeout=30)
    finally:
        silent.close(linger=0)
    assert done.returncode == 1 and "in 2 attempts of 0.5 s" in done.stderr
    assert "the server is there" in done.stderr and "overloaded or stuck" in done.stderr


def test_curve_key_mistakes_are_named_before_any_request(small_model, tmp_path, x_npy):
    keys = CurveKeys(tmp_path / "keys")
    allowed = keys.client("alice")
    _, stranger = security.generate(str(tmp_path / "strangers"), "mallory")
    _, other_server = security.generate(str(tmp_path / "other"), "server")
    # No worker ever takes the admitted request: a short drain stops the server without waiting.
    with Server(small_model, "--backend", free_backend(), *keys.serve_args(), "--graceful-timeout",
                "1", workers=0) as server:
        def infer(*key_args: str) -> subprocess.CompletedProcess[str]:
            return cli("infer", "--input", x_npy, "--endpoint", server.endpoint, "--timeout", "0.5",
                       "--retries", "0", *key_args, timeout=30)

        cases = [
            ((), "the server requires CURVE keys: give --curve-key and --curve-server-key"),
            (("--curve-key", stranger, "--curve-server-key", keys.server_public),
             "the server refused this client's key"),
            (("--curve-key", allowed, "--curve-server-key", other_server.removesuffix("_secret")),
             "is --curve-server-key this server's public key?"),
            (("--curve-key", allowed, "--curve-server-key", keys.server_public),
             "the server is there"),  # admitted; no worker yet, so no answer
            (("--curve-key", str(tmp_path / "none"), "--curve-server-key", keys.server_public),
             f"cannot read the key file {tmp_path / 'none'}"),
        ]
        for key_args, message in cases:
            done = infer(*key_args)
            assert done.returncode == 1 and message in done.stderr, (key_args, done.stderr)
            assert done.stderr.count("\n") == 1, done.stderr


def test_new_model_shows_progress_on_a_terminal(tmp_path):
    controller, terminal = pty.openpty()
    try:
        with subprocess.Popen([sys.executable, "-m", "workerpool", "new-model", str(tmp_path / "deep.bpk"),
                               "--size", "2MiB", "--width", "64"],
                              stdout=subprocess.DEVNULL, stderr=terminal) as proc:
            os.close(terminal)
            shown = b""
            with contextlib.suppress(OSError):  # EIO once the command has exited
                while chunk := os.read(controller, 4096):
                    shown += chunk
            assert proc.wait(60) == 0
    finally:
        os.close(controller)
    path = re.escape(str(tmp_path / "deep.bpk"))
    updates = re.findall(rf"\rwriting {path}: layer (\d+) of (\d+)", shown.decode())
    assert len(updates) > 10 and [int(d) for d, _ in updates] == list(range(1, len(updates) + 1))
    assert updates[-1][0] == updates[-1][1]  # the last update is the last layer


def test_new_model_with_many_layers_says_so_in_one_short_line(tmp_path):
    done = cli("new-model", tmp_path / "deep.bpk", "--size", "2MiB", "--width", "64")
    assert done.returncode == 0 and done.stderr == ""  # no progress when not on a terminal
    line = done.stdout.strip()
    assert "\n" not in line and len(line) < 160 and " x 64 -> " in line, line


def _interrupted_serve(model: str, folder: Path, moment: str, delay: float = 0.0,
                       *options: str) -> tuple[int, str]:
    """``serve`` and its children sent SIGINT, as a terminal's Ctrl-C does, ``delay`` seconds
    after its stderr shows ``moment``; its exit code and the rest of its stderr. ``-X
    importtime`` shows when the command's own guard is in place (the import of
    ``workerpool.command``): before it, Python itself is starting."""
    with subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "workerpool", "serve", model, "--workers", "2",
         "--bind", "tcp://127.0.0.1:*", "--control", f"ipc://{folder}/control", *options],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            assert proc.stderr is not None
            seen = []
            for line in proc.stderr:
                seen.append(line)
                if moment in line:
                    time.sleep(delay)  # a moment inside start-up: there is no signal to wait for
                    os.killpg(proc.pid, signal.SIGINT)
                    break
            else:
                pytest.fail(f"never saw {moment!r}: {''.join(seen)}")
            rest = proc.stderr.read()
            return proc.wait(60), rest
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize(("start", "moments"), [
    ("fork", [*(("workerpool.command", delay / 20) for delay in range(16)),  # 0 to 0.75 s
              ("starting 2 workers", 0.0)]),
    ("spawn", [("starting 2 workers", delay / 50) for delay in range(11)]),  # children start
])
def test_ctrl_c_at_any_moment_of_start_up_ends_serve_quietly(small_model, tmp_path, start, moments):
    os.chmod(tmp_path, 0o700)
    for moment, delay in moments:
        code, rest = _interrupted_serve(small_model, tmp_path, moment, delay, "--start", start)
        assert code in (0, 130), (delay, code, rest)
        for sign in ("Traceback", "Exception ignored", "KeyboardInterrupt", "Fatal Python error"):
            assert sign not in rest, (delay, rest)


# A Ctrl-C that Python hands to the command's handler inside a weakref callback, as an import's
# module lock has one: whatever the handler raises there, Python prints and drops.
_CTRL_C_IN_A_CALLBACK = """
import os, signal, sys, weakref
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, whatever the test runner left
from workerpool import command
class Lock: pass
lock = Lock()
released = weakref.ref(lock, lambda _: os.kill(os.getpid(), signal.SIGINT))
del lock
sys.exit(command.main())
"""


@pytest.mark.parametrize(("command", "codes"), [("serve", (0, 130)), ("inspect", (130,))])
def test_ctrl_c_that_python_delivers_inside_a_callback_still_ends_the_command(small_model, tmp_path,
                                                                              command, codes):
    """Such a Ctrl-C, raised at once, was lost: ``serve`` started and served on, ``inspect`` went
    on to print its table. The rare hang of the test above, made certain."""
    os.chmod(tmp_path, 0o700)
    options = ["--workers", "2", "--bind", "tcp://127.0.0.1:*", "--control",
               f"ipc://{tmp_path}/control"] if command == "serve" else []
    proc = subprocess.Popen([sys.executable, "-c", _CTRL_C_IN_A_CALLBACK, command, small_model, *options],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode in codes, (proc.returncode, err)
    for sign in ("Traceback", "Exception ignored", "KeyboardInterrupt", "Fatal Python error"):
        assert sign not in err, err


def _commands(parser: argparse.ArgumentParser, path: str = "workerpool") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, f"{path} {name}")


def test_every_command_has_a_description_and_every_argument_help():
    undocumented = []
    for path, parser in _commands(build_parser()):
        if not parser.description:
            undocumented.append(f"{path}: no description")
        undocumented += [f"{path} {action.dest}: no help" for action in parser._actions
                         if not action.help and not isinstance(action, argparse._SubParsersAction)]
    assert undocumented == []


def test_publish_says_when_it_could_not_ask_the_server(small_model, tmp_path):
    done = cli("publish", small_model, tmp_path / "served.bpk", "--control", f"ipc://{tmp_path}/none",
               timeout=30)
    assert done.returncode == 1 and "cannot ask the running server to check it: nothing listens" \
        in done.stderr, done.stderr
    assert not (tmp_path / "served.bpk").exists()


def test_infer_writes_exactly_the_output_path_given(small_model, local_model, tmp_path):
    """``--output y.txt`` writes y.txt (an .npy file) and says so; numpy alone would add .npy."""
    x = np.ones((3, local_model.input_shape[1]), np.float32)
    np.save(tmp_path / "x.npy", x)
    with Server(small_model, workers=1) as server:
        done = cli("infer", "--input", tmp_path / "x.npy", "--output", tmp_path / "y.txt",
                   "--endpoint", server.endpoint)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"workerpool: wrote {tmp_path / 'y.txt'} (worker ")
    np.testing.assert_allclose(np.load(tmp_path / "y.txt"), local_model(x), rtol=1e-5, atol=1e-6)
    assert not (tmp_path / "y.txt.npy").exists()


def test_infer_prints_and_saves_named_outputs_as_what_they_are(tmp_path):
    """A model of two named outputs: each printed under its name, and saved as an .npz archive,
    never under an .npy name nor anywhere the user did not name."""
    model = tiny_bert(tmp_path / "bert.bpk")
    np.savez(tmp_path / "ids.npz", input_ids=np.array([[1, 5, 7, 2]], np.int64),
             attention_mask=np.ones((1, 4), np.int64))
    with Server(model, workers=1) as server:
        printed = cli("infer", "--input", tmp_path / "ids.npz", "--endpoint", server.endpoint)
        (tmp_path / "y.npz").write_bytes(b"the user's own file")
        refused = cli("infer", "--input", tmp_path / "ids.npz", "--output", tmp_path / "y.npy",
                      "--endpoint", server.endpoint)
        saved = cli("infer", "--input", tmp_path / "ids.npz", "--output", tmp_path / "out.npz",
                    "--endpoint", server.endpoint)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("embedding: float32 [1, 8]\n[[") and "\nlast_hidden_state: float32 [1, 4, 8]\n" \
        in printed.stdout and "{" not in printed.stdout, printed.stdout
    assert refused.returncode == 1 and refused.stderr == (
        "workerpool: error: the model's outputs are named (embedding, last_hidden_state): an .npz archive "
        f"holds them; give --output {tmp_path / 'y'}.npz (nothing was written)\n"), refused.stderr
    assert not (tmp_path / "y.npy").exists() and (tmp_path / "y.npz").read_bytes() == b"the user's own file"
    assert saved.returncode == 0 and saved.stdout.startswith(f"workerpool: wrote {tmp_path / 'out.npz'} (worker ")
    with np.load(tmp_path / "out.npz") as archive:
        assert sorted(archive.files) == ["embedding", "last_hidden_state"]


def test_texts_for_an_array_model_are_refused_saying_so(small_model, local_model):
    """The server's own message, so that library users read it too, not only ``embed``'s."""
    width = local_model.input_shape[1]
    expected = f"the model mlp takes arrays, not texts: send float32 [B, {width}] or [{width}]"
    with Server(small_model, workers=1) as server:
        done = cli("embed", "hello", "--endpoint", server.endpoint)
        with workerpool.Client(server.endpoint) as client, \
                pytest.raises(workerpool.BadRequest, match=re.escape(expected)):
            client.infer(["hello"])
    assert done.returncode == 1 and expected in done.stderr and "got a list" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def _torch_zip(path: Path) -> None:
    """A file laid out as torch.save writes one: a zip whose first member is the pickle."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("tiny/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("tiny/data/0", b"\0" * 16)


@pytest.mark.parametrize(("name", "write", "hint"), [
    ("tiny.safetensors", lambda p: p.write_bytes(_safetensors_bytes()),
     "a safetensors file: 'workerpool convert {path} {stem}.bpk' makes a Burnpack file of it"),
    ("tiny.npz", lambda p: np.savez(p, w=np.ones(3, np.float32)),
     "an .npz archive: 'workerpool convert {path} {stem}.bpk' makes a Burnpack file of it"),
    ("tiny.pt", _torch_zip, "a PyTorch file (torch.save), which workerpool convert does not read"),
    ("tiny.bin", lambda p: p.write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)),  # torch's magic
     "a Python pickle (a PyTorch file?), which workerpool convert does not read"),
    ("tiny.onnx", lambda p: p.write_bytes(b"\x08\x07\x12\x07pytorch" + b"\0" * 32),
     "an ONNX model: 'workerpool convert {path} {stem}.bpk' makes a Burnpack file of it"),
    ("tiny.bpk", lambda p: p.write_bytes(b"not a burnpack file"),
     "workerpool convert makes one from a .safetensors file, an .npz archive, an .onnx model or a model folder"),
])
def test_a_file_of_another_format_says_what_it_is_and_how_to_convert_it(tmp_path, name, write, hint):
    path = tmp_path / name
    write(path)
    expected = hint.format(path=path, stem=tmp_path / "tiny")
    for command in ("inspect", "serve"):
        done = cli(command, path, timeout=60)
        assert done.returncode == (1 if command == "inspect" else 2), done.stderr
        assert f"{path}: not a Burnpack file" in done.stderr and expected in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr


def _model_folder(tmp_path: Path) -> Path:
    """A folder as a Hugging Face download leaves it: its config and safetensors weights."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(_safetensors_bytes())
    return folder


def test_a_safetensors_file_in_a_model_folder_is_told_to_convert_the_folder(tmp_path):
    folder = _model_folder(tmp_path)
    done = cli("inspect", folder / "model.safetensors", timeout=60)
    assert done.returncode == 1 and f"'workerpool convert {folder} {folder}.bpk'" in done.stderr
    assert "config and tokenizer included" in done.stderr and done.stderr.count("\n") == 1


def test_a_model_folder_given_as_weights_is_told_to_convert_the_folder(tmp_path):
    """The folder a Hugging Face download makes, given to every command that reads weights."""
    folder = _model_folder(tmp_path)
    for command in ("inspect", "serve", "publish"):
        args = (folder, tmp_path / "served.bpk") if command == "publish" else (f"{folder}/",)
        done = cli(command, *args, timeout=60)
        assert done.returncode in (1, 2), done.stderr
        # serve serves the .bpk files of a folder (a model repository), and this one holds none
        what = "a folder of no Burnpack file" if command == "serve" else "a folder, not a Burnpack file"
        assert f"{what}; it looks like a model folder: 'workerpool convert " \
            f"{folder} {folder}.bpk' makes a Burnpack file of it" in done.stderr, (command, done.stderr)
        assert "Traceback" not in done.stderr and "not a regular file" not in done.stderr
    (folder / "model.safetensors").unlink()  # a config alone is nothing convert can read
    done = cli("inspect", folder, timeout=60)
    assert done.stderr == f"workerpool: error: {folder}: a folder, not a Burnpack file; give the path of " \
        "a .bpk file (workerpool convert makes one from a model folder)\n", done.stderr


def _safetensors_bytes() -> bytes:
    from safetensors.numpy import save

    return save({"w": np.ones(3, np.float32)})


def test_published_weights_keep_the_permissions_of_the_file_they_replace(small_model, tmp_path):
    """Root publishing under umask 077 must not leave weights the service user cannot read."""
    served = tmp_path / "served.bpk"
    models.generate_mlp(served, 1024 * 1024, seed=1)
    served.chmod(0o644)
    done = subprocess.run(["sh", "-c", 'umask 077 && exec "$0" -m workerpool publish --no-check "$1" "$2"',
                           sys.executable, str(small_model), str(served)], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, WORKERPOOL_CONTROL=f"ipc://{tmp_path}/none"),
                          check=False)
    assert done.returncode == 0, done.stderr
    assert served.read_bytes() == Path(small_model).read_bytes()
    assert served.stat().st_mode & 0o777 == 0o644


def test_publishing_what_is_already_published_is_refused(small_model, tmp_path):
    """The same file, or a copy with the same bytes, would only start a pointless generation."""
    served = tmp_path / "served.bpk"
    served.write_bytes(Path(small_model).read_bytes())
    inode = served.stat().st_ino
    for source, why in ((served, "the same file"), (small_model, "the same content")):
        done = cli("publish", source, served, timeout=60)
        assert done.returncode == 1, done.stderr
        assert done.stderr == f"workerpool: error: {source} is already published as {served} ({why}): " \
            "nothing renamed\n"
    assert served.stat().st_ino == inode and sorted(os.listdir(tmp_path)) == ["served.bpk"]


def test_status_fits_the_terminal_and_json_keeps_everything(small_model, local_model):
    def status(*args: str, env: dict[str, str]) -> str:
        done = cli("status", "--control", server.control, *args, env=env, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    with Server(small_model, workers=2) as server:
        idle = status(env={"COLUMNS": ""})
        with workerpool.Client(server.endpoint) as client:  # one at a time: one worker serves them
            for _ in range(3):
                client.infer(np.ones((1, local_model.input_shape[1]), np.float32))
        narrow, wide = status(env={"COLUMNS": "80"}), status(env={"COLUMNS": ""})  # "": unset
        described = json.loads(status("--json", env={"COLUMNS": "80"}))
    lines = narrow.splitlines()
    assert max(map(len, lines)) <= 80, narrow
    header = next(line for line in lines if line.split()[:2] == ["pid", "role"])
    assert {"pid", "role", "state", "served", "pss"} <= set(header.split())
    worker = described["workers"][0]
    row = next(line for line in lines if line.split()[:1] == [str(worker["pid"])])
    assert row.split()[1:3] == ["worker", "ready"] and len(row) == len(header)  # under its titles
    assert "weights" in wide and "pte" in wide  # not a terminal: every column
    assert {"rss", "uss", "pss", "shared", "anon", "pte"} <= set(worker["memory"])
    # Why one worker holds all the private memory is said where it shows, and only then.
    assert sorted(w["served"] for w in described["workers"]) == [0, 3]
    assert "1 of 2 workers have served nothing yet: the worker freed last takes the next request" \
        in " ".join(wide.split()) and "served nothing" not in idle


def test_publish_without_a_server_checks_the_model_against_the_one_at_dest(small_model, tmp_path):
    """No server to ask: a file whose model does not fit the one DEST holds is refused unless
    --no-check; a link at DEST is followed, so the file a server serves is what changes."""
    served = tmp_path / "served.bpk"
    served.write_bytes(Path(small_model).read_bytes())
    link = tmp_path / "current.bpk"
    link.symlink_to(served.name)
    misfit = tmp_path / "misfit.bpk"
    models.generate_mlp(misfit, 1024 * 1024, width=512, seed=4)
    env = dict(os.environ, WORKERPOOL_CONTROL=f"ipc://{tmp_path}/none")
    refused = cli("publish", misfit, link, env=env, timeout=60)
    assert refused.returncode == 1 and "does not fit the one now at" in refused.stderr, refused.stderr
    assert "no server is running" in refused.stdout
    forced = cli("publish", misfit, link, "--no-check", env=env, timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert link.is_symlink() and served.read_bytes() == misfit.read_bytes()
