"""Predicates on the status document, for ``Server.wait_for``."""

from __future__ import annotations

from collections.abc import Callable


def registered(status: dict) -> list[dict]:
    return [w for w in status["workers"] if w["state"] in ("ready", "busy")]


def pool_ready(count: int, *, without: tuple[int, ...] = ()) -> Callable[[dict], bool]:
    """Exactly ``count`` workers, all ready, none of them ``without``."""

    def check(status: dict) -> bool:
        workers = status["workers"]
        return (
            len(workers) == count
            and all(w["state"] == "ready" for w in workers)
            and not {w["pid"] for w in workers} & set(without)
        )

    return check


def busy_pids(status: dict) -> list[int]:
    return [w["pid"] for w in status["workers"] if w["state"] == "busy"]
