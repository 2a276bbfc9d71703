"""How the workers' time is shared between models: the rule the scheduler asks which model a
free worker serves next.

Of the models with work waiting, the one that has had the least of the workers' time goes
first. So the models with work share the workers' time equally, as pools of their own would
share the cores, however long each one's passes take: a model whose passes are ten times as
quick runs ten passes to the other's one, where taking the models in turn would hold it to one.
A model flooded with requests cannot starve another either: a request of a quiet model waits at
most for a pass in progress, never for the flooded model's queue.

Time is counted in worker-seconds. A model is charged, when a message of its work is sent, what
its messages have taken on average (so two workers freed at once do not both take the model
charged least), and the charge is corrected to what the message took once it is answered. A
model that had nothing waiting or running rejoins level with the least-served model that has:
an idle spell earns no credit, so it cannot take the machine for as long as it was away.
"""

from __future__ import annotations

from collections.abc import Iterable

from .batching import smoothed


class FairShare:
    """The workers' time each model has had (those running: as charged)."""

    def __init__(self) -> None:
        self.used: dict[str, float] = {}  # model -> worker-seconds
        self.message_time: dict[str, float] = {}  # model -> moving average of one message's time

    def add(self, model: str) -> None:
        self.used[model] = min(self.used.values(), default=0.0)
        self.message_time[model] = 0.0

    def remove(self, model: str) -> None:
        del self.used[model], self.message_time[model]

    def order(self, models: Iterable[str]) -> list[str]:
        """``models``, the one that has had the least time first."""
        return sorted(models, key=self.used.__getitem__)

    def charge(self, model: str) -> float:
        """A message of ``model``'s work is sent: charge it the time one usually takes, and
        return the charge."""
        charged = self.message_time[model]
        self.used[model] += charged
        return charged

    def finished(self, model: str, charged: float, seconds: float) -> None:
        """A message of ``model``'s work took ``seconds``, for which ``charged`` was charged."""
        if model in self.used:
            self.used[model] += seconds - charged
            self.message_time[model] = smoothed(self.message_time[model], seconds)

    def rejoin(self, model: str, busy: Iterable[str]) -> None:
        """``model``, which has nothing waiting or running, gets work while ``busy`` do: it
        starts level with the least served of them."""
        others = [self.used[name] for name in busy if name in self.used and name != model]
        if others:
            self.used[model] = max(self.used[model], min(others))
