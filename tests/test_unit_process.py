"""Supervision pieces in-process: back-off, the worker contract, exit descriptions."""

from __future__ import annotations

import signal

import pytest

from workerpool.process import Backoff, describe_exit
from workerpool.worker_spec import WorkerSpec


def test_backoff_doubles_up_to_its_cap_and_resets():
    backoff = Backoff(start=0.5, cap=3.0)
    assert [backoff.fail() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.failures == 5
    backoff.reset()
    assert backoff.fail() == 0.5


@pytest.mark.parametrize("spec", [
    WorkerSpec(path="/m.bpk", backend="ipc:///tmp/b"),
    WorkerSpec(path="/weights dir/m.bpk", backend="tcp://10.0.0.1:5556", model="pkg.mod:factory",
               load="copy", generation=7, expect=[1, 2, 3, 4], heartbeat=0.25, liveness=3,
               log_level="debug", remote=True, ready_fd=9, curve_key="/k/me.key_secret",
               curve_server_key="/k/server.key"),
])
def test_worker_spec_survives_the_command_line(spec):
    assert WorkerSpec.from_argv(spec.to_argv()) == spec


def test_worker_spec_refuses_an_unknown_load_mode():
    with pytest.raises(SystemExit):
        WorkerSpec.from_argv(["/m.bpk", "--backend", "ipc:///b", "--load", "borrow"])


def test_exits_are_described_for_logs():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(-200) == "was killed by signal 200"
