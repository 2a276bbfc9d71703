"""A model's rolling reload: its decisions, without sockets."""

from __future__ import annotations

from workerpool.router.registry import WorkerRecord
from workerpool.router.rollout import Rollout, Switch


def record(address: bytes, generation: int | None = 1, *, local: bool = True) -> WorkerRecord:
    """A worker that serves model m at ``generation`` (None: not at all) and model o."""
    models = {"o": 1} if generation is None else {"m": generation, "o": 1}
    return WorkerRecord(address=address, pid=1, host="h", local=local, token=None, started=0.0,
                        last_seen=0.0, models=models)


def answer(ok: bool, ordered: int, generation: int, error: str | None = None) -> dict:
    return {"model": "m", "ok": ok, "ordered": ordered, "generation": generation, "error": error,
            "info": {"batching": True} if ok else None}


def test_one_local_worker_at_a_time_switches():
    rollout = Rollout("m")
    a, b, remote = record(b"a"), record(b"b"), record(b"r", local=False)
    assert not rollout.wants(a, 2)  # nothing to roll out yet
    rollout.begin(2, b"order")
    assert rollout.order == b"order"
    assert rollout.wants(a, 2) and not rollout.wants(remote, 2)
    rollout.started(a)
    assert not rollout.wants(b, 2)  # a is switching
    assert rollout.finished(1, answer(True, 2, 2)) == Switch(2, batching=True)
    a.models["m"] = 2  # as the scheduler records it
    assert rollout.wants(b, 2)
    assert not rollout.complete([a, b, remote])
    b.models["m"] = 2
    assert rollout.complete([a, b, remote])


def test_a_failed_switch_pauses_until_the_next_generation():
    rollout = Rollout("m")
    a = record(b"a")
    rollout.begin(2, b"")
    rollout.started(a)
    assert rollout.finished(1, answer(False, 2, 1, "bad file")) == Switch(None, failure="bad file")
    assert not rollout.wants(a, 1)
    rollout.begin(3, b"")
    assert rollout.wants(a, 1)


def test_a_failure_for_an_older_order_does_not_pause():
    rollout = Rollout("m")
    a = record(b"a")
    rollout.begin(3, b"")
    rollout.started(a)
    assert rollout.finished(1, answer(False, 2, 1, "stale")) == Switch(None)
    assert rollout.wants(a, 1)


def test_a_malformed_answer_counts_as_a_failure_of_the_target():
    rollout = Rollout("m")
    a = record(b"a")
    rollout.begin(2, b"")
    rollout.started(a)
    assert rollout.finished(1, {}) == Switch(None, failure="malformed RELOADED")


def test_clients_never_go_back_a_generation_while_switching():
    rollout = Rollout("m")
    a, b = record(b"a", 2), record(b"b", 1)
    rollout.answered(b"client", 2)
    assert rollout.floor(b"client") == 0  # no switch under way: nothing recorded
    rollout.begin(2, b"")
    rollout.answered(b"client", 2)
    rollout.answered(b"client", 1)
    assert rollout.floor(b"client") == 2 and rollout.floor(b"other") == 0
    rollout.settle([a, b])
    assert rollout.floor(b"client") == 2  # b is still on generation 1
    b.models["m"] = 2
    rollout.settle([a, b])
    assert rollout.floor(b"client") == 0


def test_forgetting_the_switching_worker_lets_another_switch():
    rollout = Rollout("m")
    a, b = record(b"a"), record(b"b")
    rollout.begin(2, b"")
    rollout.started(a)
    rollout.forget(a.key)
    assert rollout.wants(b, 2)


def test_a_model_new_to_the_pool_loads_on_as_many_workers_as_it_may_have():
    rollout = Rollout("m", limit=1)
    a, b = record(b"a", None), record(b"b", None)
    rollout.begin(1, b"")
    assert rollout.wants(a, 0) and not rollout.complete([a, b])
    rollout.started(a)
    assert rollout.finished(1, answer(True, 1, 1)).generation == 1
    a.models["m"] = 1
    assert not rollout.wants(b, 1)  # one worker may serve it, and one does
    assert rollout.complete([a, b])
    unlimited = Rollout("m")
    unlimited.begin(1, b"")
    assert unlimited.wants(b, 1) and not unlimited.complete([a, b])
