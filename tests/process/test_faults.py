"""Fault battery against a real server: real processes, real sockets on loopback and ipc, no mocks.

Workers are killed, frozen or unable to start; clients send garbage, overload the queue, let
deadlines expire, vanish before their reply or stop reading. Every test checks that each request
ends in an answer or a typed error, and that the pool heals (or was never hurt).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import hostile_models as hostile
import numpy as np
import psutil
import pytest
import zmq
from support.commands import cli
from support.models import SLOW
from support.processes import Background, frozen, log_time, slow_request, vm_hwm
from support.server import Server
from support.sockets import (
    collect,
    dealer,
    exchange,
    f32,
    flood,
    free_port,
    header,
    monitored_dealer,
    next_event,
    raw_request,
    reply_header,
)
from support.status import busy_pids, pool_ready, registered

import workerpool
from workerpool import models
from workerpool.protocol import messages as protocol
from workerpool.protocol.route import route_for

MiB = 1024 * 1024


# 1. kill -9.


def test_kill_9_workers_under_load_blames_no_client(small_model, local_model):
    """Six client threads while workers are SIGKILLed from outside, one after every 40 answers,
    twelve times: every request gets the right answer or a typed error, nothing hangs, no client
    is refused for deaths it did not cause (at least 95% answered), and the pool is back to 3
    ready workers."""
    threads, kills = 6, 12
    outcomes: list[tuple[str, Any]] = []
    lock = threading.Lock()
    done = threading.Event()

    def client(endpoint: str, width: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        with workerpool.Client(endpoint, timeout=10, retries=0) as c:
            while not done.is_set():
                x = rng.standard_normal((8, width)).astype(np.float32)
                try:
                    result = c.request(x)
                except workerpool.RemoteError as exc:
                    outcome = ("typed error", exc)
                except Exception as exc:  # noqa: BLE001 - Timeout too: a lost request
                    outcome = ("failure", exc)
                else:
                    good = np.allclose(result.outputs, local_model(x), rtol=1e-5, atol=1e-5)
                    outcome = ("answer", result.worker_pid) if good else ("failure", "wrong answer")
                with lock:
                    outcomes.append(outcome)

    with Server(small_model, workers=3) as server:
        width = local_model.input_shape[1]
        load = [
            Background(lambda s=seed: client(server.endpoint, width, s)) for seed in range(threads)
        ]
        victims: list[int] = []
        try:
            while len(victims) < kills:
                threshold = len(outcomes) + 40
                deadline = time.monotonic() + 30
                while len(outcomes) < threshold and time.monotonic() < deadline:
                    time.sleep(0.002)
                assert len(outcomes) >= threshold, f"load stalled at {len(outcomes)} requests"
                status = server.status(memory=False)
                candidates = [p for p in busy_pids(status) + [w["pid"] for w in registered(status)]
                              if p not in victims]
                if candidates:
                    victims.append(candidates[0])
                    os.kill(candidates[0], signal.SIGKILL)
        finally:
            done.set()
            for background in load:
                background.join(60)  # a hung request fails the test here

        failures = [detail for kind, detail in outcomes if kind == "failure"]
        assert failures == []
        errors = [detail for kind, detail in outcomes if kind == "typed error"]
        assert all(isinstance(e, workerpool.WorkerFailed) for e in errors), errors[:3]
        assert len(errors) <= 0.05 * len(outcomes), f"{len(errors)} of {len(outcomes)} refused: {errors[:3]}"
        assert not [e for e in errors if "killed workers" in str(e)]  # no client blamed
        answered_by = {pid for kind, pid in outcomes if kind == "answer"}
        status = server.wait_for(pool_ready(3, without=tuple(victims)))
        assert answered_by <= set(victims) | {w["pid"] for w in status["workers"]}
        log = server.log()
        for victim in victims:
            assert f"worker {victim} was killed by SIGKILL; starting a replacement" in log
        server.stop()
    read = re.search(r"(\d+) requests read, (\d+) answered", server.log())
    assert read is not None and read[1] == read[2] == str(len(outcomes)), read  # a retry is not answered twice


def test_request_on_a_killed_worker_is_retried_on_another(small_model):
    with Server(small_model, *SLOW, workers=2) as server:
        slow = slow_request(server.endpoint, 1.0)
        status = server.wait_for(busy_pids)
        victim = busy_pids(status)[0]
        other = next(w["pid"] for w in status["workers"] if w["pid"] != victim)
        os.kill(victim, signal.SIGKILL)
        result = slow.join(20)
        assert np.array_equal(result.outputs, np.full((1, 2), -2.0, np.float32))
        assert result.worker_pid == other
        assert re.search(
            rf"worker {victim} lost \(.*\) with a request in flight; retrying it", server.log()
        )
        server.wait_for(pool_ready(2, without=(victim,)))
        server.stop()
    assert "1 requests read, 1 answered" in server.log()  # the retry is no second answer


def test_request_whose_retry_also_dies_gets_worker_failed(small_model):
    with Server(small_model, *SLOW, workers=2) as server:
        slow = slow_request(server.endpoint, 2.0)
        first = busy_pids(server.wait_for(busy_pids))[0]
        os.kill(first, signal.SIGKILL)
        status = server.wait_for(lambda s: [p for p in busy_pids(s) if p != first])
        second = next(p for p in busy_pids(status) if p != first)
        os.kill(second, signal.SIGKILL)
        with pytest.raises(workerpool.WorkerFailed, match=f"worker {second} failed .* twice"):
            slow.join(20)
        server.wait_for(pool_ready(2, without=(first, second)))
        with workerpool.Client(server.endpoint, timeout=20, retries=0) as client:  # no killer: served
            assert np.array_equal(client.infer(np.full((1, 2), -2.0, np.float32)), np.full((1, 2), -4.0))


def test_a_request_that_crashes_two_workers_is_refused_and_the_pool_heals(small_model):
    """The evidence of a killer: the workers running it alone die of themselves (reaping says
    so), not by a SIGKILL from outside or with their host."""
    crash = np.array([[hostile.CRASH, 0, 0, 0]], np.float32)
    with Server(small_model, "--model", "hostile_models:factory", workers=2) as server:
        before = {w["pid"] for w in server.wait_for(pool_ready(2))["workers"]}
        with workerpool.Client(server.endpoint, timeout=20, retries=0) as client:
            with pytest.raises(workerpool.WorkerFailed, match="failed while running the request, twice"):
                client.infer(crash)
            with pytest.raises(workerpool.WorkerFailed, match="an identical request killed workers"):
                client.infer(crash)
            status = server.wait_for(pool_ready(2, without=tuple(before)))
            assert np.array_equal(client.infer(np.array([[hostile.ANSWER, 5, 0, 0]], np.float32)), [[0, 10]])
        assert {w["pid"] for w in server.status()["workers"]} == {w["pid"] for w in status["workers"]}
        assert "exited with code 70" in server.log()


# 2. Garbage.


INFO_ROUTE = protocol.encode_request(0, None, method="info")[1]


def garbage_cases(width: int) -> list[tuple[str, list[bytes], Any]]:
    """(name, frames a DEALER sends, id the bad_request reply must echo)."""
    row = np.ones((1, width), np.float32).tobytes()
    cases = [
        ("not json", [b"", b"not json"], None),
        ("not json after a route frame", [b"", INFO_ROUTE, b"not json"], None),
        ("not utf-8", [b"", INFO_ROUTE, b"\xff\xfe{}"], None),
        ("header is a JSON list", [b"", INFO_ROUTE, b"[1, 2, 3]"], None),
        ("header is a JSON string", [b"", INFO_ROUTE, b'"infer"'], None),
        ("three arrays, one frame", [*raw_request(11, [f32([1, width])] * 3), row], 11),
        ("two frames, no arrays", [*raw_request(12), row, row], 12),
        ("object dtype", [*raw_request(13, [{"dtype": "|O", "shape": [1]}]), b"\0" * 8], 13),
        ("complex dtype", [*raw_request(14, [{"dtype": "<c16", "shape": [1]}]), b"\0" * 16], 14),
        ("big-endian dtype", [*raw_request(15, [{"dtype": ">f4", "shape": [1, width]}]), row], 15),
        ("frame shorter than shape", [*raw_request(16, [f32([1, width])]), row[:-1]], 16),
        ("frame longer than shape", [*raw_request(17, [f32([1, width])]), row + b"\0"], 17),
        ("negative dim", [*raw_request(18, [f32([-1, width])]), row], 18),
        ("float dim", [*raw_request(19, [f32([1.0, width])]), row], 19),
        ("huge dims", [*raw_request(20, [f32([2**62, 2**62])]), b""], 20),
        ("unknown method", [*raw_request(21, method="train")], 21),
        ("protocol version 1", [b"", json.dumps({"v": 1, "id": 22, "method": "info"}).encode()], 22),
        ("header version 4", [*raw_request(22, method="info", v=4)], 22),
        ("route frame of version 4", [b"", b"\x04" + bytes(16), header(22, method="info")], 22),
        ("route frame of version 2", [b"", b"\x02" + bytes(15), header(22, method="info")], 22),
        ("route frame cut short", [b"", b"\x02\x01", header(22, method="info")], 22),
        ("route frame undefined form", [b"", b"\x02\x01\x09" + bytes(13), header(22, method="info")], 22),
        ("route frame with no header", [b"", protocol.encode_request(22, None)[1]], None),
        ("no version", [b"", json.dumps({"id": 23, "method": "info"}).encode()], 23),
        ("negative deadline", [*raw_request(24, method="info", deadline_ms=-5)], 24),
        ("string deadline", [*raw_request(25, method="info", deadline_ms="soon")], 25),
        ("huge integer deadline", [*raw_request(26, method="info", deadline_ms=10**400)], 26),
        ("NaN id", [b"", INFO_ROUTE, b'{"v":2,"id":NaN,"method":"info","arrays":[]}'], None),
        ("Infinity id", [b"", INFO_ROUTE, b'{"v":2,"id":-Infinity,"method":"info","arrays":[]}'], None),
        ("overflowing float id", [b"", INFO_ROUTE, b'{"v":2,"id":1e999,"method":"info","arrays":[]}'], None),
        ("NaN deadline", [b"", INFO_ROUTE, b'{"v":2,"id":27,"method":"info","deadline_ms":NaN}'], None),
        ("header over 64 KiB", [*raw_request(28, method="info", pad="x" * 70_000)], None),
        ("no delimiter", [header(29, [f32([1, width])]), row], 29),
        ("no delimiter, only a header", [header(30, method="info")], 30),
        ("single empty frame", [b""], None),
        ("delimiter but no header", [b"", b""], None),
    ]
    deep = 30_000  # nests past the JSON parser's recursion limit, still under 64 KiB
    cases.append(("huge nesting", [b"", INFO_ROUTE, b'{"v":2,"x":' + b"[" * deep + b"]" * deep + b"}"], None))
    # Ids nested deeper than the protocol allows (the header object itself is one level).
    for depth in (64, 500, 982, 990):
        nested = b"[" * depth + b"]" * depth
        cases.append(
            (
                f"id nested {depth} deep",
                [b"", INFO_ROUTE, b'{"v":2,"method":"info","id":' + nested + b"}"],
                None,
            )
        )
    return cases


def test_garbage_gets_bad_request_and_hurts_nobody(small_model, local_model, context):
    width = local_model.input_shape[1]
    with Server(small_model, "--max-message-size", "1MiB", workers=2) as server:
        before = server.status()
        pids = [w["pid"] for w in before["workers"]]
        for name, frames, request_id in garbage_cases(width):
            reply = reply_header(exchange(context, server.endpoint, frames))
            assert reply["status"] == "error", name
            assert reply["error"]["code"] == "bad_request", (name, reply)
            assert reply["id"] == request_id, (name, reply)
            assert reply["arrays"] == [], name

        # An id nested as deep as the protocol allows is read and echoed.
        nested_id = [[[[[[1, "a"]]]]]]
        for _ in range(63 - 6):
            nested_id = [nested_id]
        reply = reply_header(
            exchange(context, server.endpoint, [*raw_request(nested_id, method="info")])
        )
        assert reply["status"] == "ok" and reply["id"] == nested_id

        # Valid protocol, but not what the model takes: typed BadRequest from a worker.
        with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
            for x in (
                np.ones((1, width), np.int32),
                np.ones((1, width + 1), np.float32),
                np.ones((2, 3, width), np.float32),
                {"wrong": np.ones((1, width), np.float32)},
                {},
            ):
                with pytest.raises(workerpool.BadRequest) as caught:
                    c.request(x)
                assert caught.value.worker_pid in pids

        # Larger than --max-message-size: libzmq drops it without buffering it and closes
        # the connection, so no reply comes; the server's peak memory does not move.
        peak = vm_hwm(server.proc.pid)
        with monitored_dealer(context, server.endpoint) as (sock, monitor):
            assert next_event(monitor) == zmq.EVENT_CONNECTED
            big = np.zeros(8 * MiB, np.float32)  # 32 MiB
            sock.send_multipart([*raw_request(40, [f32([big.size])]), big], copy=False)
            assert next_event(monitor) == zmq.EVENT_DISCONNECTED, "the connection stayed open"
            assert not sock.poll(300), "a message over --max-message-size was answered"
        assert vm_hwm(server.proc.pid) - peak < 8 * MiB

        # Garbage on the control socket is answered too.
        for frames in ([b"", b"[" * 5000], [b"", b'"status"'], [b"", b"{}"], [b"", b"\xff"]):
            answer = json.loads(exchange(context, server.control, frames)[-1])
            assert answer == {"error": "malformed control request"}, frames

        # Nobody was hurt: same workers, all ready, still answering correctly.
        after = server.status()
        assert after["supervisor_pid"] == server.proc.pid
        assert [w["pid"] for w in after["workers"]] == pids
        assert all(w["state"] == "ready" for w in after["workers"])
        assert all(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
        x = np.random.default_rng(1).standard_normal((3, width)).astype(np.float32)
        with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
            np.testing.assert_allclose(c.infer(x), local_model(x), rtol=1e-5, atol=1e-5)
        assert "Traceback" not in server.log()


# 3. Overload.


def test_overload_beyond_max_queue_is_refused_at_once(small_model, context):
    with Server(small_model, *SLOW, "--max-queue", "2", workers=1) as server:
        slow = slow_request(server.endpoint, 2.0)
        server.wait_for(busy_pids)
        with dealer(context, server.endpoint) as sock:
            started = time.monotonic()
            for i in range(1, 6):  # pipelined: 1 and 2 fit in the queue, 3, 4 and 5 do not
                sock.send_multipart([*raw_request(i, [f32([1, 3])]), np.full((1, 3), i, np.float32)])
            refused = [reply_header(frames) for frames in collect(sock, 3, timeout=1.0)]
            waited = time.monotonic() - started
            assert [r["id"] for r in refused] == [3, 4, 5]
            assert all(r["error"]["code"] == "overloaded" for r in refused), refused
            assert all(r["worker_pid"] is None for r in refused)
            assert waited < 1.0 and slow.running

            assert server.status()["queue"]["depth"] == 2
            assert slow.running, "the slow request ended before the overload checks"
            # A newcomer holding nothing gets its fair share of the full queue: the biggest
            # holder's newest request gives way (answered overloaded), the newcomer is served.
            with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
                np.testing.assert_array_equal(c.infer(np.ones((1, 3), np.float32)), np.full((1, 3), 2.0))

            replies = {reply_header(frames)["id"]: frames for frames in collect(sock, 2)}
            assert sorted(replies) == [1, 2]
            assert reply_header(replies[2])["error"]["code"] == "overloaded"
            assert reply_header(replies[1])["status"] == "ok"
            assert np.array_equal(np.frombuffer(replies[1][2], np.float32), np.full(3, 2.0, np.float32))
        result = slow.join(10)
        assert np.array_equal(result.outputs, np.full((1, 2), -4.0, np.float32))


# 4. Deadlines.


def test_expired_deadline_never_reaches_a_worker(small_model):
    with Server(small_model, *SLOW, workers=1) as server:
        slow = slow_request(server.endpoint, 2.0)
        served = server.wait_for(busy_pids)["workers"][0]["served"]
        with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
            started = time.monotonic()
            with pytest.raises(workerpool.DeadlineExceeded) as caught:
                c.request(np.ones((1, 2), np.float32), deadline=0.2)
            waited = time.monotonic() - started
            assert 0.15 <= waited < 1.0, waited
            assert caught.value.worker_pid is None  # the router answered
            with pytest.raises(workerpool.DeadlineExceeded):
                c.request(np.ones((1, 2), np.float32), deadline=0)
            assert slow.running
        assert np.array_equal(slow.join(10).outputs, np.full((1, 2), -4.0, np.float32))
        status = server.wait_for(pool_ready(1))
        assert status["workers"][0]["served"] == served + 1  # only the slow request


def test_malformed_header_while_queued_is_a_bad_request(small_model, context):
    """The router reads the header of a request it refuses (to echo the id), and the worker
    the deadline. Nonsense there must not crash either: a huge integer deadline overflowed
    float division, and an id nested ~980 deep parsed but could not be re-encoded for the
    refusal."""
    with Server(small_model, *SLOW, workers=1) as server:
        slow = slow_request(server.endpoint, 1.0)
        server.wait_for(busy_pids)
        deadlines = {1: 10**400, 2: -1, 3: "soon", 4: True, 5: [100], 6: 1e308}
        nested = [b"[" * depth + b"]" * depth for depth in range(960, 1000)]
        with dealer(context, server.endpoint) as sock:
            for i, deadline_ms in deadlines.items():
                sock.send_multipart([*raw_request(i, method="info", deadline_ms=deadline_ms)])
            at_once = route_for({"method": "info", "deadline_ms": 0})
            for request_id in nested:  # deadline 0: refused at once, the id read if it can be
                sock.send_multipart(
                    [b"", at_once, b'{"v":2,"method":"info","deadline_ms":0,"id":' + request_id + b"}"]
                )
            received = [reply_header(f) for f in collect(sock, len(deadlines) + len(nested))]
        replies = {reply["id"]: reply for reply in received if reply["id"] is not None}
        anonymous = [reply for reply in received if reply["id"] is None]
        assert sorted(replies) == sorted(deadlines)
        for i in (1, 2, 3, 4, 5):
            assert replies[i]["status"] == "error" and replies[i]["error"]["code"] == "bad_request"
        assert replies[6]["status"] == "ok"  # a far deadline is a valid one
        assert len(anonymous) == len(nested)
        assert all(r["error"]["code"] == "deadline_exceeded" for r in anonymous)  # as their route frames say
        slow.join(10)
        server.wait_for(pool_ready(1))
        assert server.proc.poll() is None


# 5. Crash loop.


FAILED_START = re.compile(
    r"^(.*) ERROR workerpool\.supervisor\.core: worker (\d+) exited with code 3 before it was ready; "
    r"restarting in ([\d.]+)s \((\d+) failed starts in a row\)$",
    re.MULTILINE,
)


@pytest.mark.usefixtures("start_method")  # with fork and spawn: it is about starting
@pytest.mark.xdist_group("timing")  # asserts how long it takes
def test_worker_that_cannot_start_is_restarted_with_backoff(small_model, tmp_path, monkeypatch):
    """Replacements that die before they are ready are restarted after 0.5 s, 1 s, 2 s...,
    each failure logged, not spun; once they can start again the pool is whole.

    The weight file stays valid: a garbage file renamed over the path is caught by the hot
    reload watcher, which holds replacements back instead (tests/test_reload.py). Here the
    model factory refuses to build while a flag file exists, in workers only (the supervisor
    validated the unchanged file at start and does not build the model again).
    """
    flag = tmp_path / "fail"
    monkeypatch.setenv("WORKERPOOL_TEST_FAIL_FLAG", str(flag))
    with Server(small_model, "--model", "flaky_model:factory", workers=2) as server:
        victim = server.worker_pids()[0]
        flag.touch()  # new workers cannot build the model any more
        os.kill(victim, signal.SIGKILL)
        server.wait_for(lambda s: "restarting in 2.0s" in server.log(), timeout=15)
        flag.unlink()
        server.wait_for(pool_ready(2, without=(victim,)), timeout=15)

        log = server.log()
        assert f"worker {victim} was killed by SIGKILL; starting a replacement" in log
        failed = FAILED_START.findall(log)
        delays = [float(delay) for _, _, delay, _ in failed]
        assert delays[:3] == [0.5, 1.0, 2.0] and len(delays) <= 4, delays
        assert [int(n) for *_, n in failed] == list(range(1, len(failed) + 1))
        assert len({pid for _, pid, _, _ in failed}) == len(failed)  # a new process each time
        # Bounded: one start per logged failure, not a spin.
        assert log.count("cannot load the model") == len(failed)
        # And the back-off is real: the next failure comes no sooner than the announced delay.
        times = [log_time(stamp) for stamp, *_ in failed]
        for (later, earlier), delay in zip(zip(times[1:], times), delays):
            assert later - earlier >= delay - 0.01, (times, delays)
        with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
            assert np.array_equal(c.infer(np.ones((1, 2), np.float32)), np.full((1, 2), 2.0))


def test_a_refused_publish_costs_no_capacity_and_the_pool_says_it_is_degraded(
    small_model, local_model, tmp_path
):
    """A misfit file (another input width) published over the served path without the server's
    check: the pool refuses it and serves on; a killed worker is replaced at once on the weights
    the pool serves, never on the refused file; status, status --ready, /readyz and the metrics
    say degraded, with the reason; publish with the server's check refuses the same file; a
    valid file makes the pool whole again."""
    path = tmp_path / "model.bpk"
    shutil.copyfile(small_model, path)
    width = local_model.input_shape[1]
    misfit = tmp_path / "misfit.bpk"
    models.generate_mlp(misfit, 1024 * 1024, width=2 * width, seed=5)
    port = free_port()
    with Server(path, "--http", f"127.0.0.1:{port}", workers=2) as server:
        refused = cli("publish", misfit, path, env=dict(os.environ, WORKERPOOL_CONTROL=server.control))
        assert refused.returncode == 1 and "the running server refuses it" in refused.stderr
        assert (f"model mlp does not fit the served one: inputs are <f4 [None, {2 * width}], the served "
                f"model's <f4 [None, {width}]") in refused.stderr, refused.stderr  # as the README quotes it
        assert cli("status", "--ready", "--control", server.control).returncode == 0
        done = cli("publish", misfit, path, "--no-check")
        assert done.returncode == 0, done.stderr
        server.wait_for(lambda s: s["degraded"] is not None)
        victim = server.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        status = server.wait_for(pool_ready(2, without=(victim,)))
        assert "new weights refused" in status["degraded"] and "does not fit" in status["degraded"]
        with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
            for i in range(20):
                x = np.full((1, width), float(i), np.float32)
                np.testing.assert_allclose(c.request(x).outputs, local_model(x), rtol=1e-5, atol=1e-5)
        probe = cli("status", "--ready", "--control", server.control)
        assert probe.returncode == 1 and "not ready: new weights refused" in probe.stderr
        assert "DEGRADED: new weights refused" in cli("status", "--control", server.control).stdout
        readyz = urllib.request.Request(f"http://127.0.0.1:{port}/readyz")
        with pytest.raises(urllib.error.HTTPError) as unready:
            urllib.request.urlopen(readyz, timeout=10)
        assert unready.value.code == 503 and b"new weights refused" in unready.value.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as metrics:
            assert f'workerpool_degraded{{model="{path.stem}"}} 1.0' in metrics.read().decode()
        assert cli("publish", small_model, path, "--control", server.control).returncode == 0
        server.wait_for(lambda s: s["degraded"] is None and s["model"]["generation"] == 2)
        assert cli("status", "--ready", "--control", server.control).returncode == 0
        assert FAILED_START.findall(server.log()) == []


# 6. Hung workers.


@pytest.mark.xdist_group("timing")  # asserts how long it takes
def test_frozen_idle_worker_is_declared_lost_and_replaced(small_model, local_model):
    with Server(small_model, workers=2) as server:
        width = local_model.input_shape[1]
        victim, other = server.worker_pids()
        with frozen(victim), workerpool.Client(server.endpoint, timeout=15, retries=0) as c:
            started = time.monotonic()
            answered_by = set()
            status = None
            while time.monotonic() - started < 15:  # requests keep flowing meanwhile
                x = np.full((1, width), float(len(answered_by)), np.float32)
                result = c.request(x)
                np.testing.assert_allclose(result.outputs, local_model(x), rtol=1e-5, atol=1e-5)
                answered_by.add(result.worker_pid)
                status = server.status()
                if pool_ready(2, without=(victim,))(status):
                    break
            replaced_after = time.monotonic() - started
            assert status is not None and pool_ready(2, without=(victim,))(status)
            assert victim not in answered_by and other in answered_by
            # heartbeat 1 s x liveness 5, checked once a second, plus the replacement's start
            assert 3.5 <= replaced_after <= 10, replaced_after
            assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == "zombie"
        log = server.log()
        assert re.search(rf"worker {victim} lost \((no heartbeat for|unreachable)", log), log
        assert f"killing worker {victim}" in log


@pytest.mark.xdist_group("timing")  # asserts how long it takes
def test_frozen_busy_worker_is_lost_and_the_request_is_retried(small_model):
    """A busy local worker does not beat; once silent past heartbeat 1 s x liveness 5, the
    router looks at its process: stopped (SIGSTOP), it is lost and its request retried."""
    with Server(small_model, *SLOW, workers=2) as server:
        slow = slow_request(server.endpoint, 1.0, timeout=20)
        status = server.wait_for(busy_pids)
        victim = busy_pids(status)[0]
        with frozen(victim):
            started = time.monotonic()
            result = slow.join(20)
            took = time.monotonic() - started
            assert np.array_equal(result.outputs, np.full((1, 2), -2.0, np.float32))
            assert result.worker_pid != victim
            assert 4 <= took <= 12, took  # ~6 s to notice, 1 s to rerun
            server.wait_for(pool_ready(2, without=(victim,)))
        log = server.log()
        assert re.search(
            rf"worker {victim} lost \(no heartbeat for [\d.]+s, its process stopped\) with a request in flight; "
            r"retrying it",
            log,
        ), log


def test_a_worker_stopped_past_the_request_timeout_blames_no_request(small_model):
    """A worker stopped from outside (SIGSTOP) before the heartbeats notice, past a short
    --request-timeout: it is given up, its request retried and answered, and an identical
    request is not refused after it."""
    with Server(small_model, *SLOW, "--request-timeout", "2", workers=2) as server:
        slow = slow_request(server.endpoint, 0.5, timeout=20)
        victim = busy_pids(server.wait_for(busy_pids))[0]
        with frozen(victim):
            result = slow.join(20)
            assert result.worker_pid != victim
            assert np.array_equal(result.outputs, np.full((1, 2), -1.0, np.float32))
            again = slow_request(server.endpoint, 0.5, timeout=20).join(20)
            assert np.array_equal(again.outputs, result.outputs)  # not refused as a killer
        assert f"worker {victim} lost (past --request-timeout, its process stopped)" in server.log()


@pytest.mark.xdist_group("timing")  # holds a worker 7 s
def test_a_model_that_holds_the_gil_past_the_heartbeats_is_busy_not_frozen(small_model):
    """A busy worker does not beat; one whose model holds the GIL for 7 s (past heartbeat 1 s
    x liveness 5) is running, not stopped, and its request is answered."""
    with Server(small_model, "--model", "slow_model:holds_gil", workers=2) as server:
        x = np.full((1, 2), -7.0, np.float32)
        with workerpool.Client(server.endpoint, timeout=30, retries=0) as c:
            result = c.request(x)
        assert np.array_equal(result.outputs, x * 2)
        assert " lost " not in server.log() and "killing worker" not in server.log()


# 7. Clients that go away or stop reading.


def test_client_gone_before_its_reply(small_model, context):
    with Server(small_model, *SLOW, "--log-level", "debug", workers=1) as server:
        with dealer(context, server.endpoint) as sock:
            sock.send_multipart([*raw_request(1, [f32([1, 2])]), np.full((1, 2), -0.5, np.float32)])
            server.wait_for(busy_pids)
        server.wait_for(lambda s: s["workers"][0]["served"] == 1 and pool_ready(1)(s))
        assert re.search(r"reply to a vanished .*client dropped: Host unreachable", server.log())
        with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
            assert np.array_equal(c.infer(np.ones((1, 2), np.float32)), np.full((1, 2), 2.0))
        assert server.proc.poll() is None


def test_client_that_never_reads_cannot_stall_the_server(small_model, context):
    """A client that pipelines requests and never reads the replies fills its queue on the
    server; the router must drop its replies, not block its whole loop on that client."""
    with Server(small_model, *SLOW, workers=2) as server:
        x = np.ones((1, 4096), np.float32)  # 16 KiB replies fill the kernel buffers quickly
        with dealer(context, server.endpoint, RCVHWM=1, RCVBUF=4096) as sock:
            sent = flood(sock, x, 2500)
            # Still connected and still not reading: others are served meanwhile.
            server.wait_for(
                lambda s: s["queue"]["depth"] == 0 and s["queue"]["in_flight"] == 0, timeout=20
            )
            with workerpool.Client(server.endpoint, timeout=5, retries=0) as c:
                assert np.array_equal(c.infer(x), 2 * x)
        assert sent == 2500
        assert server.proc.poll() is None


def test_many_frames_over_the_total_size_limit_are_refused(small_model, context):
    """libzmq limits each frame; the router refuses a message whose frames add up past the limit."""
    with Server(small_model, "--max-message-size", "1MiB", workers=1) as server:
        frames = [*raw_request(1, [f32([230_000])] * 5), *[b"\0" * 920_000] * 5]
        reply = reply_header(exchange(context, server.endpoint, frames))
        assert reply["status"] == "error" and reply["error"]["code"] == "bad_request"
        assert "over --max-message-size 1048576" in reply["error"]["message"] and reply["id"] == 1
        assert server.status()["workers"][0]["served"] == 0  # it never reached a worker
        assert "refused a request of 4600" in server.log() and "over --max-message-size 1048576" in server.log()
