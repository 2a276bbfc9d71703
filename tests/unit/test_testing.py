"""workerpool.testing's choice of control socket, decided before any process starts."""

from __future__ import annotations

import os

from workerpool.testing import ServerProcess, serve_args, workers_args


def test_a_serve_told_no_control_socket_gets_a_private_one_removed_at_stop():
    pool = ServerProcess(serve_args("model.bpk", 1))
    assert pool.control is not None and pool.control.startswith("ipc://")
    directory = os.path.dirname(pool.control.removeprefix("ipc://"))
    assert pool.command[-2:] == ["--control", pool.control] and os.path.isdir(directory)
    assert os.stat(directory).st_mode & 0o077 == 0  # the server refuses a socket others may reach
    pool.stop()  # never started: only the directory to remove
    assert not os.path.exists(directory)


def test_a_control_socket_named_in_the_arguments_or_the_environment_is_kept():
    named = ServerProcess(serve_args("model.bpk", 1, "--control", "ipc:///tmp/a/control"))
    assert named.control == "ipc:///tmp/a/control" and named.command.count("--control") == 1
    joined = ServerProcess(serve_args("model.bpk", 1, "--control=ipc:///tmp/b/control"))
    assert joined.control == "ipc:///tmp/b/control" and "--control" not in joined.command
    from_env = ServerProcess(serve_args("model.bpk", 1), env={"WORKERPOOL_CONTROL": "ipc:///tmp/c/control"})
    assert from_env.control == "ipc:///tmp/c/control" and "--control" not in from_env.command
    hosts = ServerProcess(workers_args("model.bpk", "tcp://127.0.0.1:5556", 1))
    assert hosts.control is None and "--control" not in hosts.command
