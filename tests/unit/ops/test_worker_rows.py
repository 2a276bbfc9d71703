"""The status document's worker rows, joined from the supervisor's children and the router's
registry (pure data: no process is started)."""

from __future__ import annotations

from workerpool.ops.worker_rows import worker_rows
from workerpool.supervisor.process import Child


def test_a_starting_worker_shows_the_generation_it_was_started_on():
    """Started on generation 1 while the pool moved to 2: the row says 1 until it registers
    (the rollout then moves it), not the pool's."""
    starting = Child(pid=101, pidfd=-1, generations={"m": 1}, token="a")
    newer = Child(pid=102, pidfd=-1, generations={"m": 2}, token="b")
    rows = worker_rows([starting, newer], [], None)
    assert [(row["pid"], row["generation"], row["models"], row["state"]) for row in rows] == [
        (101, 1, {"m": 1}, "starting"), (102, 2, {"m": 2}, "starting")]
