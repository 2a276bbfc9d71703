"""The requests waiting for a free worker: a queue per model, fair between clients, bounded.

Each model's requests wait apart (a worker takes work of one model at a time), and within a
model each client waits in its own first-in-first-out line; the lines are served in turn, so
a newcomer's request is served before a flooder's next one. A request run in parts stays at
the head of its line until its last part is handed out, and its client's turn passes after
each part. Parts retried after their worker died go before every line of their model: they
have waited longest.

The queue is bounded twice, over every model, by count (``--max-queue``) and by the bytes its
requests hold (``--max-queue-bytes``): the count alone let a client with large requests fill
the supervisor's memory. While there is room anyone may queue, so a client alone can use the
whole queue. When a limit is reached, a client that would still hold no more than its fair
share of it (the limit divided among the clients holding requests, itself included) makes
room: the newest requests of the client holding the most are answered ``overloaded``;
otherwise its own request is. The newest go because the oldest have waited longest and are
served next. Finding the biggest holder scans the clients, but only when a limit is reached.
A request of which a part already runs is never evicted: when such requests hold the room,
the newcomer is refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from .requests import Part, Request

EXPIRY_SCAN_INTERVAL = 0.01  # seconds between scans of the queue for passed deadlines
COUNT = "count"  # the limits a full queue can be at
BYTES = "bytes"


class QueueFull(Exception):
    """A request may not queue: ``limit`` (``COUNT`` or ``BYTES``) is reached and its client
    holds its fair share, or (``started``) what holds the room may not give way: requests of
    which a part runs."""

    def __init__(self, limit: str, *, started: bool = False) -> None:
        super().__init__(limit)
        self.limit = limit
        self.started = started


@dataclass
class Held:
    """What one client holds in the queue, over every model."""

    count: int = 0
    nbytes: int = 0

    def of(self, limit: str) -> int:
        return self.count if limit == COUNT else self.nbytes


@dataclass
class ModelQueue:
    """One model's waiting work: retried parts, then each client's line."""

    retried: deque[Part] = field(default_factory=deque)
    lines: dict[bytes, deque[Request]] = field(default_factory=dict)
    turns: deque[bytes] = field(default_factory=deque)  # clients with a line, the next one first

    def __bool__(self) -> bool:
        return bool(self.retried or self.lines)

    def head(self) -> Part | Request:
        return self.retried[0] if self.retried else self.lines[self.turns[0]][0]


class RequestQueue:
    """Per-model queues of per-client lines served in turn, retried parts first; bounded in
    count and bytes over every model (``max_bytes`` None: unbounded in bytes)."""

    def __init__(self, limit: int, max_bytes: int | None = None) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._count = 0
        self._models: dict[str, ModelQueue] = {}
        self._held: dict[bytes, Held] = {}  # by client, what its lines hold
        self._next_scan = 0.0

    def __len__(self) -> int:
        return self._count

    def depth(self, model: str) -> int:
        """Requests (and retried parts) of ``model`` waiting."""
        queue = self._models.get(model)
        return 0 if queue is None else len(queue.retried) + sum(map(len, queue.lines.values()))

    def waiting_models(self) -> list[str]:
        return [name for name, queue in self._models.items() if queue]

    def has_work(self, model: str) -> bool:
        return bool(self._models.get(model))

    def put(self, request: Request, *, first: bool = False) -> None:
        """Queue ``request`` at the end of its client's line of its model, or with ``first`` (it
        starts again) at its head. No limit is checked here."""
        queue = self._models.setdefault(request.model, ModelQueue())
        line = queue.lines.get(request.client)
        if line is None:
            line = queue.lines[request.client] = deque()
            queue.turns.append(request.client)
        if first:
            line.appendleft(request)
        else:
            line.append(request)
        held = self._held.setdefault(request.client, Held())
        held.count += 1
        held.nbytes += request.size
        self._count += 1
        self.nbytes += request.size

    def put_back(self, part: Part) -> None:
        """Queue a part to retry (or one taken but not sent) before everything else of its model."""
        self._models.setdefault(part.request.model, ModelQueue()).retried.appendleft(part)
        self._count += 1

    def peek(self, model: str) -> Part | Request:
        """What :meth:`take` takes from ``model`` next: a retried part, else the request at the
        head of the line whose turn it is. The model must have work."""
        return self._models[model].head()

    def take(self, model: str, most: int) -> Part:
        """The next part of ``model``'s work: a retried part, else the next at most ``most``
        rows of the request :meth:`peek` gives (all of it unless it runs in parts)."""
        queue = self._models[model]
        if queue.retried:
            self._count -= 1
            return queue.retried.popleft()
        client = queue.turns[0]
        line = queue.lines[client]
        request = line[0]
        part = request.take(most)
        if not request.waiting:
            line.popleft()
            self._release(request)
        if line:
            queue.turns.rotate(-1)
        else:
            queue.turns.popleft()
            del queue.lines[client]
        return part

    def remove(self, request: Request) -> bool:
        """Take ``request`` out of its line (its answer came before it was all handed out);
        whether it was there."""
        queue = self._models.get(request.model)
        line = None if queue is None else queue.lines.get(request.client)
        if line is None or request not in line:
            return False
        line.remove(request)
        self._release(request)
        assert queue is not None
        if not line:
            del queue.lines[request.client]
            queue.turns.remove(request.client)
        return True

    def _release(self, request: Request) -> None:
        held = self._held[request.client]
        held.count -= 1
        held.nbytes -= request.size
        if not held.count:
            del self._held[request.client]
        self._count -= 1
        self.nbytes -= request.size

    @property
    def holders(self) -> int:
        """How many clients have requests in their lines."""
        return len(self._held)

    def holds(self, client: bytes) -> bool:
        return client in self._held

    def _passed(self, size: int, count: int | None = None, nbytes: int | None = None) -> list[str]:
        """The limits a request of ``size`` bytes would pass, with ``count`` requests holding
        ``nbytes`` queued (by default, those queued now)."""
        count = self._count if count is None else count
        nbytes = self.nbytes if nbytes is None else nbytes
        passed = [COUNT] if count >= self.limit else []
        if self.max_bytes is not None and nbytes + size > self.max_bytes:
            passed.append(BYTES)
        return passed

    def check_room(self, request: Request) -> None:
        """Raise ``QueueFull`` when ``request`` may not queue: a limit is reached and its client
        would hold more than its fair share of it."""
        for limit in self._passed(request.size):
            if not self._within_share(request, limit):
                raise QueueFull(limit)

    def make_room(self, request: Request) -> list[Request]:
        """Remove and return the requests that give way for ``request``, which ``check_room``
        let in: the newest not started of whichever client holds the most of a passed limit.
        The victims are all chosen first: when those that may be evicted cannot make room (a
        request of which a part runs stays), ``QueueFull`` is raised and nothing is removed."""
        held = {client: Held(h.count, h.nbytes) for client, h in self._held.items()}
        count, nbytes = self._count, self.nbytes
        chosen: list[Request] = []
        while passed := self._passed(request.size, count, nbytes):
            victim = self._newest_of_biggest(passed[0], held, chosen)
            if victim is None:
                raise QueueFull(passed[0], started=True)
            chosen.append(victim)
            held[victim.client].count -= 1
            held[victim.client].nbytes -= victim.size
            count, nbytes = count - 1, nbytes - victim.size
        for victim in chosen:
            self.remove(victim)
        return chosen

    def _newest_of_biggest(self, limit: str, held: dict[bytes, Held], chosen: list[Request]) -> Request | None:
        """The newest request not started and not ``chosen`` of the client that ``held``
        says holds the most of ``limit`` and has one."""
        for client in sorted(held, key=lambda c: held[c].of(limit), reverse=True):
            untouched = [request for queue in self._models.values() for request in queue.lines.get(client, ())
                         if not request.taken and request not in chosen]
            if untouched:
                return max(untouched, key=lambda request: request.received)
        return None

    def _within_share(self, request: Request, limit: str) -> bool:
        """Whether ``request``'s client, holding it too, keeps within an equal share of what
        ``limit`` leaves beside the retried parts. Then some other client holds more than its
        share, and evicting from the biggest holder ends in room."""
        retried = [part for queue in self._models.values() for part in queue.retried]
        if limit == COUNT:
            capacity, size = self.limit - len(retried), 1
        else:
            capacity, size = (self.max_bytes or 0), request.size
        held = self._held.get(request.client)
        holders = len(self._held) + (held is None)
        return ((held.of(limit) if held else 0) + size) * holders <= capacity

    def take_expired(self, now: float) -> list[Part | Request]:
        """Remove and return what waits past its deadline (scanned at most every 10 ms)."""
        if not self._count or now < self._next_scan:
            return []
        self._next_scan = now + EXPIRY_SCAN_INTERVAL
        expired: list[Part | Request] = []
        for queue in self._models.values():
            for part in [part for part in queue.retried if part.request.expired(now)]:
                queue.retried.remove(part)
                self._count -= 1
                expired.append(part)
            for line in list(queue.lines.values()):
                expired.extend(request for request in list(line) if request.expired(now) and self.remove(request))
        return expired

    def take_model(self, model: str) -> list[Part | Request]:
        """Remove and return everything of ``model`` (it is no longer served)."""
        queue = self._models.pop(model, None)
        if queue is None:
            return []
        self._count -= len(queue.retried)
        taken: list[Part | Request] = list(queue.retried)
        self._models[model] = queue  # for remove(), then dropped
        for line in list(queue.lines.values()):
            for request in list(line):
                self.remove(request)
                taken.append(request)
        del self._models[model]
        return taken

    def take_all(self) -> Iterator[Part | Request]:
        for model in list(self._models):
            yield from self.take_model(model)

    def everything(self) -> Iterator[Part | Request]:
        """What waits, retried parts first, without taking it."""
        for queue in self._models.values():
            yield from queue.retried
            for line in queue.lines.values():
                yield from line
