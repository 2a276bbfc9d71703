"""Supervision pieces in-process: back-off, exit descriptions, ready lines."""

from __future__ import annotations

import errno
import signal
import time

import pytest

from workerpool import models
from workerpool.config.models import ModelEntry
from workerpool.config.pool import PoolConfig
from workerpool.supervisor.core import Supervisor
from workerpool.supervisor.process import Backoff, describe_exit
from workerpool.supervisor.ready_line import Ready, parse_ready_line, serve_line, workers_line
from workerpool.supervisor.starters import SpawnStarter
from workerpool.weights.served import ServedModels


def test_backoff_doubles_up_to_its_cap_and_resets():
    backoff = Backoff(start=0.5, cap=3.0)
    assert [backoff.fail() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.failures == 5
    backoff.reset()
    assert backoff.fail() == 0.5


def test_exits_are_described_for_logs():
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(-200) == "was killed by signal 200"


@pytest.mark.parametrize("workers", [1, 8])
def test_ready_lines_read_back_as_written(workers):
    serve = parse_ready_line(serve_line("/w/m v2.bpk", "1.0 MiB", "mlp", workers, "tcp://127.0.0.1:5555"))
    assert serve == Ready("/w/m v2.bpk", "1.0 MiB", "mlp", workers, "tcp://127.0.0.1:5555")
    host = parse_ready_line(workers_line("m.bpk", "2.0 GiB", "bert", workers, "tcp://router:5556"))
    assert host == Ready("m.bpk", "2.0 GiB", "bert", workers, "tcp://router:5556")
    assert parse_ready_line("workerpool: error: no such file") is None


def test_a_ready_line_of_several_models_names_each_and_reads_back():
    line = serve_line("a=/w/a.bpk, b=/w/b.bpk", "2.0 MiB", "mlp, bert", 2, "tcp://127.0.0.1:5555")
    assert line == ("workerpool: serving a=/w/a.bpk, b=/w/b.bpk (2.0 MiB, models mlp, bert) with 2 workers "
                    "on tcp://127.0.0.1:5555")
    assert parse_ready_line(line) == Ready("a=/w/a.bpk, b=/w/b.bpk", "2.0 MiB", "mlp, bert", 2, "tcp://127.0.0.1:5555")


def test_ready_lines_count_one_worker_in_the_singular():
    endpoint = "tcp://127.0.0.1:5555"
    assert serve_line("m.bpk", "1.0 MiB", "mlp", 1, endpoint).endswith(f" with 1 worker on {endpoint}")
    assert serve_line("m.bpk", "1.0 MiB", "mlp", 2, endpoint).endswith(f" with 2 workers on {endpoint}")
    assert workers_line("m.bpk", "1.0 MiB", "mlp", 1, endpoint).startswith("workerpool: 1 worker for ")


class IdleRole:
    """A role with no router: nothing but the supervisor's own bookkeeping runs."""

    requests = None
    leave_timeout = 1.0
    stop_patience = 1.0
    backend = "ipc:///nonexistent"
    ready_pipe = False

    def prepare(self, spec):
        return spec

    def child_started(self, child):
        pass

    def child_exited(self, child, why):
        pass

    def roll_out(self, model):
        pass

    def model_removed(self, model):
        pass

    surge = 0

    def ready_line(self, path, size, model, workers):
        return ""


class OutOfDescriptors(SpawnStarter):
    """Starts nothing: the system is out of descriptors."""

    def start(self, order):
        raise OSError(errno.EMFILE, "Too many open files")


@pytest.fixture
def starved(tmp_path):
    """A supervisor of two workers whose starter can start none."""
    path = tmp_path / "m.bpk"
    models.generate_mlp(path, 64 * 1024, width=16)
    entries = [ModelEntry("m", str(path))]
    supervisor = Supervisor(PoolConfig(models=entries, workers=2, start="spawn"), lambda pool, cleanup: IdleRole())
    supervisor.role = IdleRole()  # as run() makes it
    supervisor.starter = OutOfDescriptors(supervisor._started)
    supervisor.models = ServedModels(entries, None)
    return supervisor


def test_a_worker_that_cannot_be_started_is_retried_after_a_back_off(starved, caplog):
    before = time.monotonic()
    starved.manage_workers()
    assert starved.children == {}
    assert [round(t - before, 1) for t in starved.spawn_at] == [0.5, 1.0]
    assert "cannot start a worker: [Errno 24] Too many open files; trying again in 0.5s" in caplog.text
    starved.manage_workers()  # the restarts are scheduled: nothing more is started before they are due
    assert len(starved.spawn_at) == 2


def test_ttin_and_ttou_move_the_target_and_the_count_follows(starved):
    starved.manage_workers()
    starved.signals.handle_ttin()
    assert (starved.target, len(starved.spawn_at)) == (3, 3)
    starved.signals.handle_ttou()
    starved.signals.handle_ttou()
    assert (starved.target, len(starved.spawn_at)) == (1, 1)
    starved.signals.handle_ttou()  # the last worker stays
    assert (starved.target, len(starved.spawn_at)) == (1, 1)


def test_shutdown_drops_scheduled_restarts_and_ends_without_workers(starved):
    starved.manage_workers()
    starved.begin_shutdown("SIGTERM")
    assert starved.spawn_at == []
    starved.manage_workers()
    assert starved.spawn_at == []
    starved._shutdown_step()
    assert starved._finished()
