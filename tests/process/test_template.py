"""Workers forked from the warm template: what they share with it, and what its death changes."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import psutil
from support.processes import Background
from support.server import Server
from support.sockets import free_port, from_every_worker
from support.status import pool_ready

import workerpool


def fd_targets(pid: int) -> set[str]:
    """The files, pipes and sockets ``pid``'s descriptors above the standard streams point to
    (eventfds and epolls all show as the same anonymous inode: they cannot be told apart)."""
    targets = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if int(fd) > 2:
            with contextlib.suppress(FileNotFoundError):  # closed since it was listed: not held
                targets.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return {target for target in targets if not target.startswith("anon_inode:")}


def test_the_template_holds_one_thread_and_one_socket_and_the_workers_share_none_of_it(small_model):
    with Server(small_model, workers=2) as server:
        status = server.status()
        template = status["template"]["pid"]
        assert psutil.Process(template).name() == "wp-template"
        assert psutil.Process(template).num_threads() == 1
        held = fd_targets(template)  # its socket, and the weights of the model it built for them
        assert len(held) == 2 and small_model in held
        assert next(iter(held - {small_model})).startswith("socket:")
        for worker in status["workers"]:
            assert psutil.Process(worker["pid"]).name() == "wp-worker"
            assert psutil.Process(worker["pid"]).ppid() == server.proc.pid  # not the template's
            # Each opens the weights itself: the supervisor holds them for replacements, and a
            # worker's mapping keeps a descriptor of its own.
            inherited = fd_targets(worker["pid"]) & (held | fd_targets(server.proc.pid))
            assert inherited <= {small_model}


def test_forked_workers_do_not_share_the_templates_random_state(small_model):
    with Server(small_model, "--model", "random_model:factory", workers=2) as server:
        draws = from_every_worker(server.endpoint, np.zeros((1, 1), np.float32), 2)
    first, second = (float(draw[0, 0]) for draw in draws.values())
    assert first != second


def test_killing_the_template_under_load_fails_no_request_and_it_comes_back(small_model):
    with Server(small_model, workers=2) as server:
        status = server.status()
        first, workers = status["template"]["pid"], {w["pid"] for w in status["workers"]}
        stop = threading.Event()

        def load() -> int:
            x = np.ones((1, 256), np.float32)
            answered = 0
            with workerpool.Client(server.endpoint, timeout=10, retries=0) as client:
                while not stop.is_set():
                    client.infer(x)  # raises on any failure
                    answered += 1
            return answered

        background = Background(load)
        server.wait_for(lambda s: sum(w["served"] for w in s["workers"]) > 0)
        os.kill(first, signal.SIGKILL)
        status = server.wait_for(lambda s: s["template"]["pid"] not in (None, first))
        assert status["template"]["restarts"] == 1
        assert {w["pid"] for w in status["workers"]} == workers  # running workers untouched
        server.signal(signal.SIGTTIN)  # the new template forks workers too
        added = server.wait_for(pool_ready(3))
        stop.set()
        assert background.join(30) > 0
        assert workers < {w["pid"] for w in added["workers"]}
    assert f"worker template {first} was killed by SIGKILL" in server.log()


def test_the_supervisors_control_signals_leave_the_template_and_workers_alone(small_model):
    """They share its command line, so ``pkill -HUP -f 'workerpool serve'`` reaches them too."""
    with Server(small_model, workers=2) as server:
        status = server.status()
        template, workers = status["template"]["pid"], [w["pid"] for w in status["workers"]]
        for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGTTIN, signal.SIGTTOU):
            os.kill(template, signum)
            for pid in workers:
                os.kill(pid, signum)
        server.signal(signal.SIGTTIN)
        status = server.wait_for(pool_ready(3))
        assert status["template"]["pid"] == template and status["template"]["restarts"] == 0
        assert set(workers) < {w["pid"] for w in status["workers"]}
        assert all(psutil.Process(pid).status() != psutil.STATUS_STOPPED for pid in [template, *workers])


def test_a_template_that_dies_with_workers_on_order_starts_them_once_back(small_model):
    with Server(small_model, workers=1) as server:
        template = server.status()["template"]["pid"]
        os.kill(template, signal.SIGSTOP)
        for now in (2, 3, 4):  # one at a time: the kernel merges signals sent together
            server.signal(signal.SIGTTIN)
            server.wait_for(lambda s, n=now: f"SIGTTIN: adding a worker (now {n})" in server.log())
        os.kill(template, signal.SIGKILL)
        status = server.wait_for(pool_ready(4))
        assert status["template"]["restarts"] == 1
    assert "cannot start a worker" not in server.log()  # asked again, not failed and backed off


def test_sigttou_while_every_worker_is_on_its_way_stops_the_first_to_arrive(small_model):
    with Server(small_model, workers=2) as server:
        status = server.status()
        template = status["template"]["pid"]
        os.kill(template, signal.SIGSTOP)
        for worker in status["workers"]:
            os.kill(worker["pid"], signal.SIGKILL)
        server.wait_for(lambda s: s["workers"] == [])
        server.signal(signal.SIGTTOU)
        server.wait_for(lambda s: "SIGTTOU: removing a worker (now 1)" in server.log())
        os.kill(template, signal.SIGCONT)
        server.wait_for(lambda s: pool_ready(1)(s) and "stopped" in server.log())
    assert "Traceback" not in server.log()


def test_what_a_model_module_does_when_imported_holds_in_every_forked_worker(
        small_model, tmp_path, monkeypatch):
    """It ignores SIGCHLD, starts a thread and opens a file: each worker gets its own start, and
    writes through the file its module opened."""
    log = tmp_path / "careless.log"
    monkeypatch.setenv("CARELESS_LOG", str(log))
    with Server(small_model, "--model", "careless_import_model:factory", workers=2) as server:
        status = server.wait_for(pool_ready(2))
        names = [c.name() for c in psutil.Process(server.proc.pid).children()]
        assert sorted(names) == ["wp-template", "wp-worker", "wp-worker"]
        pids = set(from_every_worker(server.endpoint, np.ones((1, 4), np.float32), 2))
        assert status["template"]["restarts"] == 0
    assert pids == {w["pid"] for w in status["workers"]}
    assert set(map(int, log.read_text().split())) == pids


def test_kill_9_of_the_supervisor_leaves_no_template_or_worker_behind(small_model):
    with Server(small_model, workers=2) as server:
        status = server.status()
        pids = [status["template"]["pid"], *(w["pid"] for w in status["workers"])]
        processes = [psutil.Process(pid) for pid in pids]
        server.proc.kill()
        _, alive = psutil.wait_procs(processes, timeout=5)
        assert alive == []


def test_spawned_workers_have_no_template(small_model):
    with Server(small_model, "--start", "spawn", workers=2) as server:
        status = server.status()
        assert status["template"] is None
        assert "mmap, spawned, " in server.log()
        assert all(psutil.Process(w["pid"]).ppid() == server.proc.pid for w in status["workers"])


def test_a_template_that_hangs_is_killed_and_replaced_holding_nothing_of_the_supervisors(small_model):
    with Server(small_model, "--http", f"127.0.0.1:{free_port()}", workers=1) as server:
        template = server.status()["template"]["pid"]
        os.kill(template, signal.SIGSTOP)
        server.signal(signal.SIGTTIN)  # an order the frozen template never answers
        status = server.wait_for(pool_ready(2), timeout=60)
        assert status["template"]["pid"] != template and status["template"]["restarts"] == 1
        held = fd_targets(status["template"]["pid"])  # started again beside the HTTP thread and sockets
        assert len(held - {small_model}) == 1 and next(iter(held - {small_model})).startswith("socket:")
    assert f"worker template {template} did not fork a worker in" in server.log()


def test_a_worker_being_started_is_not_stopped_by_the_supervisors_signals(small_model):
    """``pkill -HUP -f 'workerpool serve'`` while a worker is being forked must not kill it."""
    with Server(small_model, workers=1) as server:
        for now in range(2, 8):
            server.signal(signal.SIGTTIN)
            deadline = time.monotonic() + 10
            while not pool_ready(now)(server.status(memory=False)):
                assert time.monotonic() < deadline, server.log()
                for child in psutil.Process(server.proc.pid).children():
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.send_signal(signal.SIGHUP)
    assert "killed by SIGHUP" not in server.log()


def test_a_worker_that_ignores_its_stop_signal_is_killed_after_its_patience(small_model):
    with Server(small_model, "--model", "deaf_model:factory", "--request-timeout", "1",
                workers=2) as server:
        answered = from_every_worker(server.endpoint, np.ones((1, 4), np.float32), 2)
        assert len(answered) == 2  # both have answered, so both ignore the stop signal now
        server.signal(signal.SIGTTOU)
        server.wait_for(pool_ready(1), timeout=20)
    assert "did not leave within 6s of being told to; killing it" in server.log()
