"""Refusals of the command line, in-process: what the parser, the config file and the
environment refuse, and how it reads (one line, exit 2, no traceback), without starting a
process per case. Every case is refused before anything would start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from workerpool.cli.main import main


@dataclass(frozen=True)
class Done:
    """What a run of the command left: as ``subprocess.CompletedProcess`` has it."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    """``workerpool ARGS`` run by its ``main`` in this process, output captured."""

    def run(*args: object) -> Done:
        try:
            code = main([str(arg) for arg in args])
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        captured = capsys.readouterr()
        return Done(code, captured.out, captured.err)

    return run


def test_new_model_bad_size_is_a_usage_error(cli, tmp_path):
    done = cli("new-model", str(tmp_path / "m.bpk"), "--size", "lots")
    assert done.returncode == 2
    assert "invalid size 'lots'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "m.bpk").exists()


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--max-batch", "0", "must be at least 1"),
    ("--max-batch", "many", "invalid count 'many'"),
    ("--batch-wait", "-1", "not a number of milliseconds from 0 up"),
    ("--batch-wait", "soon", "invalid number of milliseconds 'soon'"),
])
def test_batching_options_refuse_nonsense_before_starting(cli, small_model, option, value, message):
    done = cli("serve", small_model, option, value)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "m.bpk", "--bind", "127.0.0.1:5555"], "write tcp://127.0.0.1:5555"),
    (["new-model", "x.bpk", "--size", "0"], "--size: 0 is too small: give 16KiB or more"),
    (["new-model", "x.bpk", "--size", "1"], "--size: 1 is too small"),
    (["status", "--control", "/tmp/x.sock"], "names no transport: write ipc:///tmp/x.sock"),
    (["status", "--control", "ipc://@pool"], "an abstract @name is open to every user"),
    (["infer", "--input", "x.npy", "--endpoint", "tcp://[::1]:5555"], "IPv6 addresses are not supported"),
    (["infer", "--input", "x.npy", "--endpoint", "inproc://pool"], "inproc:// reaches only sockets"),
    (["infer", "--input", "x.npy", "--endpoint", "tcp://127.0.0.1:70000"], "a port from 1 to 65535"),
    (["infer", "--input", "x.npy", "--endpoint", "http://127.0.0.1:8002"], "this speaks ZeroMQ"),
    (["serve", "m.bpk", "--bind", "tcp://127.0.0.1"], "names no port"),
    (["reload", "--control", "tcp://127.0.0.1:5555"], "the control socket is an ipc://PATH"),
    (["infer", "--inptu", "x.npy"], "required: --input"),
])
def test_usage_errors_are_one_line(cli, args, message):
    done = cli(*args)
    assert done.returncode == 2 and message in done.stderr
    assert done.stderr.count("\n") == 1 and "usage:" not in done.stderr


@pytest.mark.parametrize(("content", "message"), [
    ("wrkers = 3\n", ("unknown key 'wrkers'; did you mean 'workers'? (the keys are the long options of "
                       "'workerpool serve --help')")),
    ("max_bach = 3\n", "unknown key 'max_bach'; did you mean 'max-batch'?"),
    ("no-watch = 3\n", "--no-watch is a switch"),
    ("load = [\"mmap\"]\n", "--load takes a value"),
    ("workers = [[1]]\n", "--workers takes a value"),
    ("workers = \n", "not valid TOML"),
    ('workers = "x"\n', "bad.toml: workers: invalid count 'x'"),
    ('log-level = "loud"\n', "bad.toml: log-level: invalid choice: 'loud'"),
])
def test_a_config_that_cannot_be_used_is_one_line(cli, tmp_path, small_model, content, message):
    (tmp_path / "bad.toml").write_text(content)
    done = cli("serve", small_model, "--config", tmp_path / "bad.toml")
    assert done.returncode == 2 and message in done.stderr
    assert done.stderr.count("\n") == 1 and "argument --" not in done.stderr


@pytest.mark.parametrize(("name", "value", "message"), [
    ("WORKERPOOL_WORKERS", "x", "invalid count 'x'"),
    ("WORKERPOOL_MAX_QUEUE_BYTES", "12q", "invalid size '12q'"),
])
def test_a_bad_value_from_the_environment_names_the_variable(cli, small_model, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    done = cli("serve", small_model, "--print-config")
    assert done.returncode == 2 and done.stderr.startswith(f"workerpool: error: {name}: {message}")
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_misspelt_variable_is_named_with_the_one_meant(cli, small_model, monkeypatch):
    """A misspelt file key is an error; a misspelt variable may belong to another tool's
    environment, so it warns, naming the variable it resembles, and the rest goes on."""
    monkeypatch.setenv("WORKERPOOL_WORKRES", "3")
    monkeypatch.setenv("WORKERPOOL_CONTROL", "")  # read by status and reload: no warning
    monkeypatch.setenv("WORKERPOOL_CONNECT", "")  # workers', but empty, so unset: no warning
    done = cli("serve", small_model, "--print-config")
    assert done.returncode == 0 and "workers = " in done.stdout and "workers = 3" not in done.stdout
    assert done.stderr == ("workerpool: warning: WORKERPOOL_WORKRES names no option of 'workerpool "
                           "serve' and is ignored; did you mean 'WORKERPOOL_WORKERS'?\n"), done.stderr


@pytest.mark.parametrize(("arguments", "message"), [
    (("serve", "--workrs", "2", "MODEL"), "workerpool serve: error: unknown option --workrs; did you mean '--workers'?"),
    (("serve", "MODEL", "--max-bach=3"), "workerpool serve: error: unknown option --max-bach; did you mean '--max-batch'?"),
    (("status", "--jsn"), "workerpool status: error: unknown option --jsn; did you mean '--json'?"),
    (("--verison",), "workerpool: error: unknown option --verison; did you mean '--version'?"),
    (("serve", "--curve-server-key", "x", "MODEL"),  # serve's own key is the secret one
     "workerpool serve: error: unknown option --curve-server-key; did you mean '--curve-secret-key'?"),
    (("serve", "MODEL", "--zzz"), "workerpool serve: error: unknown option --zzz (see 'workerpool serve --help')"),
])
def test_a_misspelt_option_is_named_alone_with_the_closest(cli, small_model, arguments, message):
    done = cli(*(small_model if word == "MODEL" else word for word in arguments))
    assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
    assert done.stderr.count("\n") == 1 and str(small_model) not in done.stderr  # not the path's fault


@pytest.mark.parametrize(("arguments", "message"), [
    (["{m}", "{m}"], "two models would be named 'small': name them apart with NAME=FILE"),
    (["a={m}", "--max-batch", "b=4"], "--max-batch b=...: no model is named 'b' (served: a)"),
    (["a="], "a=: name a weight file after '='"),
    (["bad name={m}"], "'bad name' cannot name a model"),
    (["_a={m}"], "'_a' cannot name a model"),
    (["a={m}", "b={m}", "--model-name", "c"], "--model-name"),
    (["a={m}", "b={m}", "--workers", "3", "--workers", "a=1", "--workers", "b=2"],
     "every model is given fewer workers than --workers 3: the other 1 would serve nothing"),
])
def test_the_models_to_serve_are_refused_with_what_is_wrong(cli, small_model, arguments, message):
    done = cli("serve", *(argument.format(m=small_model) for argument in arguments))
    assert done.returncode == 2, done
    assert message in done.stderr and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
