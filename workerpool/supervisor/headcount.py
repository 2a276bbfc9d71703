"""The worker count: how many workers to start, which restarts to drop, which workers to stop.

As gunicorn's arbiter does in ``manage_workers()``, the count is not kept in step by every event
that changes it. Each tick compares the workers wanted with those running, those being started
and the restarts scheduled after a back-off, and closes the gap. SIGTTIN and SIGTTOU only move
the target; a host's rollout asks for one worker over it while older generations remain; a dead
worker's replacement is the gap its death opens. Decisions only: the supervisor acts on them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .process import Child


@dataclass(frozen=True)
class Correction:
    """What closes the gap between the workers wanted and those on their way."""

    start: int = 0  # workers to start now
    cancel: int = 0  # scheduled restarts to drop, the latest first
    stop: tuple[Child, ...] = ()  # running workers to tell to leave


def correct(wanted: int, running: Sequence[Child], starting: int, scheduled: int,
            generations: Mapping[str, int]) -> Correction:
    """``running``: workers not told to stop; ``starting``: started but not yet reported;
    ``scheduled``: restarts waiting out a back-off; ``generations``: the newest weights of
    each model.

    Too many: scheduled restarts go first (nothing runs yet), then running workers beyond
    ``wanted``: one not ready first (a ready worker is never stopped while one still loading is
    kept, or a rollout's TTOU could leave none serving), then one whose every model another
    worker serves too (the only worker of a model given fewer workers, ``--workers NAME=N``,
    goes last: its requests would wait for nobody), then an older generation, then the newest.
    A start already under way is not stopped before it is reported: if the pool is still over
    then, the next tick stops it, the newest of those not ready."""
    gap = wanted - len(running) - starting - scheduled
    if gap >= 0:
        return Correction(start=gap)
    cancel = min(-gap, scheduled)
    stopping = min(-gap - cancel, max(0, len(running) - wanted))
    holders = Counter(name for c in running for name in c.generations if name in generations)
    victims = sorted(running, key=lambda c: (c.ready, any(holders[name] == 1 for name in c.generations
                                                          if name in generations),
                                             not c.behind(generations), -c.started))
    return Correction(cancel=cancel, stop=tuple(victims[:stopping]))
