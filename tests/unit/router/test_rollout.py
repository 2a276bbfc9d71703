"""The rolling reload's decisions, without sockets."""

from __future__ import annotations

import json

from workerpool.router.registry import WorkerRecord
from workerpool.router.rollout import Rollout


def record(address: bytes, generation: int = 1, *, local: bool = True) -> WorkerRecord:
    return WorkerRecord(address=address, pid=1, host="h",
                        generation=generation, model="m", local=local, token=None,
                        started=0.0, last_seen=0.0)


def answer(ok: bool, ordered: int, generation: int, error: str | None = None) -> bytes:
    return json.dumps({"ok": ok, "ordered": ordered, "generation": generation, "error": error}).encode()


def test_one_local_worker_at_a_time_switches():
    rollout = Rollout()
    a, b, remote = record(b"a"), record(b"b"), record(b"r", local=False)
    assert not rollout.wants(a)  # nothing to roll out yet
    rollout.begin(2, [1, 2, 3, 4], "/src")
    assert json.loads(rollout.order) == {"generation": 2, "identity": [1, 2, 3, 4], "source": "/src"}
    assert rollout.wants(a) and not rollout.wants(remote)
    rollout.started(a)
    assert not rollout.wants(b)  # a is switching
    assert rollout.finished(a, answer(True, 2, 2)) is None
    assert a.generation == 2 and rollout.wants(b)
    assert not rollout.complete([a, b, remote])
    b.generation = 2
    assert rollout.complete([a, b, remote])


def test_a_failed_switch_pauses_until_the_next_generation():
    rollout = Rollout()
    a = record(b"a")
    rollout.begin(2, [0], "/src")
    rollout.started(a)
    assert rollout.finished(a, answer(False, 2, 1, "bad file")) == "bad file"
    assert a.generation == 1 and not rollout.wants(a)
    rollout.begin(3, [0], "/src")
    assert rollout.wants(a)


def test_a_failure_for_an_older_order_does_not_pause():
    rollout = Rollout()
    a = record(b"a")
    rollout.begin(3, [0], "/src")
    rollout.started(a)
    assert rollout.finished(a, answer(False, 2, 1, "stale")) is None
    assert rollout.wants(a)


def test_a_malformed_answer_counts_as_a_failure_of_the_target():
    rollout = Rollout()
    a = record(b"a")
    rollout.begin(2, [0], "/src")
    rollout.started(a)
    assert rollout.finished(a, b"[]") == "malformed RELOADED"
    assert a.generation == 1


def test_clients_never_go_back_a_generation_while_switching():
    rollout = Rollout()
    a, b = record(b"a", 2), record(b"b", 1)
    rollout.answered(b"client", 2)
    assert rollout.floor(b"client") == 0  # no switch under way: nothing recorded
    rollout.begin(2, [0], "/src")
    rollout.answered(b"client", 2)
    rollout.answered(b"client", 1)
    assert rollout.floor(b"client") == 2 and rollout.floor(b"other") == 0
    rollout.settle([a, b])
    assert rollout.floor(b"client") == 2  # b is still on generation 1
    b.generation = 2
    rollout.settle([a, b])
    assert rollout.floor(b"client") == 0


def test_forgetting_the_switching_worker_lets_another_switch():
    rollout = Rollout()
    a, b = record(b"a"), record(b"b")
    rollout.begin(2, [0], "/src")
    rollout.started(a)
    rollout.forget(a.key)
    assert rollout.wants(b)
