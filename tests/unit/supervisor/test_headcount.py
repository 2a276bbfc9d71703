"""The worker count rule without processes: what to start, which restarts to drop, whom to stop."""

from __future__ import annotations

from workerpool.supervisor.headcount import Correction, correct
from workerpool.supervisor.process import Child


def worker(pid: int, *, generation: int = 1, ready: bool = True, started: float = 0.0) -> Child:
    return Child(pid, -1, None, started, generations={"m": generation}, token=str(pid), ready=ready)


def test_the_missing_workers_are_started_counting_those_on_their_way():
    running = [worker(1), worker(2)]
    assert correct(5, running, starting=1, scheduled=1, generations={"m": 1}) == Correction(start=1)
    assert correct(4, running, starting=1, scheduled=1, generations={"m": 1}) == Correction()


def test_too_many_drops_scheduled_restarts_before_stopping_a_running_worker():
    running = [worker(1, started=1.0), worker(2, started=2.0)]
    assert correct(2, running, starting=0, scheduled=2, generations={"m": 1}) == Correction(cancel=2)
    assert correct(1, running, starting=0, scheduled=1, generations={"m": 1}) == Correction(cancel=1, stop=(running[1],))


def test_the_worker_stopped_is_one_loading_then_of_an_older_generation_then_the_newest():
    """A rollout's TTOU must not stop the ready old workers and keep the loading new one: the
    host would serve with none until it loads."""
    old = worker(1, generation=1, started=1.0)
    loading = worker(2, generation=2, ready=False, started=2.0)
    newest = worker(3, generation=2, started=3.0)
    settled = worker(4, generation=2, started=0.5)
    running = [settled, newest, loading, old]
    assert correct(3, running, starting=0, scheduled=0, generations={"m": 2}).stop == (loading,)
    assert correct(2, running, starting=0, scheduled=0, generations={"m": 2}).stop == (loading, old)
    assert correct(1, running, starting=0, scheduled=0, generations={"m": 2}).stop == (loading, old, newest)


def test_a_start_under_way_is_left_to_arrive_rather_than_stopping_a_ready_worker():
    running = [worker(1), worker(2)]
    assert correct(2, running, starting=1, scheduled=0, generations={"m": 1}) == Correction()
    arrived = worker(3, ready=False, started=5.0)
    assert correct(2, [*running, arrived], starting=0, scheduled=0, generations={"m": 1}).stop == (arrived,)


def test_a_worker_that_maps_a_model_no_longer_served_is_stopped_before_a_current_one():
    current = worker(1, started=1.0)
    stale = Child(2, -1, None, 2.0, generations={"m": 1, "removed": 1}, token="2", ready=True)
    assert correct(1, [current, stale], starting=0, scheduled=0, generations={"m": 1}).stop == (stale,)


def test_the_only_worker_of_a_model_given_fewer_workers_is_stopped_last():
    """``--workers rerank=1``: a TTOU that stopped the rerank worker would leave its requests to nobody."""
    rerank = Child(1, -1, None, 5.0, generations={"m": 1, "rerank": 1}, token="1", ready=True)
    plain = Child(2, -1, None, 1.0, generations={"m": 1}, token="2", ready=True)
    assert correct(1, [rerank, plain], starting=0, scheduled=0, generations={"m": 1, "rerank": 1}).stop == (plain,)
