"""Readiness read from the status document: the pool's (``/readyz``, ``status --ready``) and
each model's (``/v2/models/NAME/ready``)."""

from __future__ import annotations

from typing import Any

from workerpool.control.status import model_unready, unready


def status(*, workers: list[dict[str, Any]], draining: bool = False, **models: dict[str, Any]) -> Any:
    served = {name: {"degraded": None, "reloading": False, "workers": 0, **model} for name, model in models.items()}
    for name, model in served.items():
        model["workers"] = sum(1 for worker in workers if name in worker["models"])
    return {"draining": draining, "models": served, "workers": workers}


def test_the_pool_is_ready_when_every_model_is_and_says_which_is_not():
    both = [{"state": "ready", "models": {"a": 1, "b": 1}}]
    assert unready(status(workers=both, a={}, b={})) is None
    assert unready(status(workers=both, a={}, b={"degraded": "new weights refused: x"})) == \
        "b: new weights refused: x"
    only_a = [{"state": "ready", "models": {"a": 1}}, {"state": "starting", "models": {"b": 1}}]
    assert unready(status(workers=only_a, a={}, b={})) == "b: no worker is ready yet (1 starting)"
    assert unready(status(workers=both, draining=True, a={}, b={})) == "the server is shutting down"


def test_a_model_being_added_leaves_the_pool_ready_but_is_not_ready_itself():
    """A balancer routes by pool: ``models add`` must not take a serving pool out of rotation."""
    document = status(workers=[{"state": "ready", "models": {"a": 1}}], a={}, b={"reloading": True})
    assert unready(document) is None
    assert model_unready(document, "b") == "being added: no worker has loaded it yet"
    assert model_unready(document, "c") == "no model named 'c' is served"
