"""The router's core without a socket: events in (requests, workers' messages, losses, time),
what it would send read from its outbox. The scheduler's rules (dispatch, batching, recovery,
quarantine, rollout; several models in turn; requests run in parts) are driven as the router's
loop drives them, and nothing here fakes a socket.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zmq

from workerpool.codecs.http_call import KSERVE, request_frames
from workerpool.protocol import messages as protocol
from workerpool.router import recovery
from workerpool.router.core import Router
from workerpool.router.outbox import CLIENT, WORKER, carries_requests
from workerpool.router.recovery import MAX_ATTEMPTS
from workerpool.router.registry import WorkerRecord, WorkerState
from workerpool.router.requests import Part, Request

SIGNATURE = {"inputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}],
             "outputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}], "batching": True}
TEXTS = {"inputs": [{"name": None, "dtype": "text", "shape": [None]}],
         "outputs": [{"name": "embedding", "dtype": "<f4", "shape": [None, 2]}], "batching": True}


class Pool:
    """A router core serving ``models`` (name: signature), the events it reported, and what it
    sent: the outbox is emptied after each event, as the router's shell does; a send to an
    ``unreachable`` worker fails there."""

    def __init__(self, *, max_rows: int = 1, wait: float = 0.0, request_timeout: float | None = None,
                 running_cap: int | None = None, models: dict[str, dict[str, Any]] | None = None,
                 max_queue: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        self.sent: list[tuple[int, list[Any]]] = []  # (pid, frames) of each send that left
        self.replies: list[list[Any]] = []  # what clients were sent
        self.unreachable: set[int] = set()
        self.lost: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.serving: dict[int, dict[str, int]] = {}  # what each worker serves, as its owner heard last
        self.router = Router(self, max_queue=max_queue, max_message_size=1 << 20,
                             request_timeout=request_timeout, running_cap=running_cap, clock=clock)
        for name, signature in (models or {"m": SIGNATURE}).items():
            self.router.add_model(name, signature, max_rows=max_rows, wait=wait)
        self.scheduler = self.router.scheduler
        self.workers = self.scheduler.workers
        self.queue = self.router.queue
        self.quarantine = self.router.backlog.quarantine

    # The events the router tells its owner.

    def worker_ready(self, worker: WorkerRecord) -> None:
        pass

    def worker_lost(self, worker: WorkerRecord, why: str) -> None:
        self.lost.append(worker.pid)

    def started_here(self, token: str | None) -> bool:
        return True

    def stopped(self, worker: WorkerRecord) -> bool:
        return False

    def reload_failed(self, worker: WorkerRecord, model: str, why: str) -> None:
        self.failed.append((worker.pid, model))

    def models_changed(self, worker: WorkerRecord) -> None:
        self.serving[worker.pid] = dict(worker.models)

    def rollout(self, model: str = "m"):
        return self.scheduler.models[model].rollout

    def flush(self) -> None:
        """What the shell does after each event."""
        while (send := self.router.outbox.take()) is not None:
            kind, key, frames, _ = send
            if kind == CLIENT:
                self.replies.append(frames)
                continue
            worker = self.workers.get(key)
            if kind == WORKER and worker is not None and worker.pid in self.unreachable:
                self.router.lose(key, "unreachable", unsent=carries_requests(frames))
            elif worker is not None:
                self.sent.append((worker.pid, frames))

    def errors(self) -> dict[int, str]:
        """Request id -> error code of the error replies sent so far."""
        headers = [protocol.decode_header(frames[0]) for frames in self.replies]
        return {h["id"]: h["error"]["code"] for h in headers if h["status"] == "error"}

    def answered(self) -> dict[int, protocol.Message]:
        """Request id -> the reply sent, of the successful ones."""
        messages = [protocol.decode_reply(frames) for frames in self.replies]
        return {m.id: m for m in messages if m.header["status"] == "ok"}

    def worker(self, pid: int, *, batching: bool = False, local: bool = True, token: str | None = None,
               generation: int = 1, models: dict[str, dict[str, Any]] | None = None) -> WorkerRecord:
        """A worker's READY: registered, and free."""
        served = {name: {"generation": generation, "model": name, "batching": batching, **signature}
                  for name, signature in (models or {"m": SIGNATURE}).items()}
        ready = {"pid": pid, "host": "h", "token": token, "models": served}
        self.router.from_worker(local, f"w{pid}".encode(), [zmq.Frame(protocol.READY),
                                        zmq.Frame(json.dumps(ready).encode())])
        self.flush()
        return self.workers[(local, f"w{pid}".encode())]

    def request(self, request_id: int, *, client: bytes = b"c", rows: int = 1, model: str | None = None,
                payload: Any = None, deadline_ms: float | None = None) -> Request:
        """A request arriving on the client socket: dispatched at once, or queued."""
        payload = np.zeros((rows, 4), np.float32) if payload is None else payload
        frames = protocol.encode_request(request_id, payload, model=model, deadline_ms=deadline_ms)[1:]
        self.router.receive([zmq.Frame(client), zmq.Frame(b""), *map(zmq.Frame, frames)])
        self.flush()
        held = [p.request for w in self.workers.values() for p in w.inflight]
        held += [item.request if isinstance(item, Part) else item for item in self.queue.everything()]
        return next(r for r in held if r.id == request_id)

    def send(self, client: bytes, frames: list[Any]) -> None:
        """A request's frames (route frame on) arriving on the client socket, whatever they say."""
        self.router.receive([zmq.Frame(client), zmq.Frame(b""), *map(zmq.Frame, frames)])
        self.flush()

    def reloaded(self, worker: WorkerRecord, outcome: dict[str, Any]) -> None:
        """``worker``'s RELOADED: what it did of the RELOAD it was sent."""
        self.router.from_worker(worker.local, worker.address, [zmq.Frame(protocol.RELOADED),
                                               zmq.Frame(json.dumps(outcome).encode())])
        self.flush()

    def part(self, request_id: int) -> Part:
        """The part of a request now in flight or waiting to be retried."""
        parts = [p for w in self.workers.values() for p in w.inflight]
        parts += [item for item in self.queue.everything() if isinstance(item, Part)]
        return next(p for p in parts if p.request.id == request_id)

    def answer(self, worker: WorkerRecord, status: bytes = b"ok") -> None:
        """``worker`` answers everything it holds, in order, each part with one output row per row."""
        for part in list(worker.inflight):
            request_id = part.request.id
            reply = protocol.encode_reply(request_id, np.full((part.rows, 4), part.start, np.float32)) \
                if status == b"ok" else protocol.encode_error(request_id, status.decode(), "failed")
            self.router.from_worker(worker.local, worker.address, [zmq.Frame(protocol.REPLY),
                                                   zmq.Frame(part.request.client), zmq.Frame(status),
                                                   *map(zmq.Frame, reply)])
        self.flush()

    def lose(self, worker: WorkerRecord, why: str = "test", **how: bool) -> None:
        self.router.lose(worker.key, why, **how)
        self.flush()

    def exited(self, token: str, why: str, **how: bool) -> None:
        self.router.worker_exited(token, why, **how)
        self.flush()

    def sends_to(self, pid: int) -> list[list[int] | bytes]:
        """What ``pid`` was sent: the request ids of each REQUEST or BATCH, else the command."""
        return [_ids(frames) for to, frames in self.sent if to == pid and frames[0] != protocol.HEARTBEAT]

    def messages_to(self, pid: int) -> list[list[Any]]:
        return [frames for to, frames in self.sent if to == pid and frames[0] in (protocol.REQUEST, protocol.BATCH)]


def _ids(frames: list[Any]) -> list[int] | bytes:
    """The ids of the requests a message to a worker carries: REQUEST is the command, the model,
    the client, the part, then the request's frames; BATCH the command, the model, the stride,
    then as many frames for each request."""
    if frames[0] == protocol.REQUEST:
        return [protocol.decode_header(frames[5])["id"]]
    if frames[0] == protocol.BATCH:
        stride = int(frames[2])
        return [protocol.decode_header(frames[i + 3])["id"] for i in range(3, len(frames), stride)]
    return frames[0]


def _model_of(frames: list[Any]) -> bytes:
    return bytes(frames[1])


# Dispatch.


def test_a_request_goes_to_the_most_recently_freed_worker():
    pool = Pool()
    first, second = pool.worker(1), pool.worker(2)
    pool.request(1)
    pool.request(2)
    assert (pool.sends_to(2), pool.sends_to(1)) == ([[1]], [[2]])  # the second registered last
    assert first.state == second.state == WorkerState.BUSY
    pool.answer(second)
    pool.answer(first)
    pool.request(3)
    assert pool.sends_to(1) == [[2], [3]]  # freed last, so its caches are the warmest
    pool.answer(first)
    pool.request(4)
    assert pool.sends_to(1) == [[2], [3], [4]]  # one request at a time: always the same worker
    assert pool.sends_to(2) == [[1]]


def test_a_request_that_may_not_wait_runs_when_a_worker_is_free_and_is_answered_when_none_is():
    """A deadline of 0: only if a worker is free now."""
    pool = Pool()
    pool.worker(1)
    pool.request(1, deadline_ms=0)
    assert pool.sends_to(1) == [[1]] and pool.errors() == {}
    frames = protocol.encode_request(2, np.zeros((1, 4), np.float32), deadline_ms=0)[1:]
    pool.router.receive([zmq.Frame(b"c"), zmq.Frame(b""), *map(zmq.Frame, frames)])  # the worker is busy
    pool.flush()
    assert pool.errors() == {2: "deadline_exceeded"} and pool.sends_to(1) == [[1]]


def test_a_worker_whose_last_answer_failed_goes_to_the_back_of_the_free_list():
    """Else a worker that fails fast (a broken model) would always be the last freed, and draw
    every request while the others idle."""
    pool = Pool()
    broken, healthy = pool.worker(1), pool.worker(2)
    pool.request(1)
    pool.request(2)
    pool.answer(healthy)
    pool.answer(broken, b"internal")  # freed last, yet not the next to take a request
    pool.request(3)
    pool.answer(healthy)
    pool.request(4)
    assert pool.sends_to(2) == [[1], [3], [4]] and pool.sends_to(1) == [[2]]


def test_a_request_waits_until_a_worker_is_free():
    pool = Pool()
    pool.request(1)
    assert len(pool.queue) == 1 and pool.sent == []
    pool.worker(1)
    assert pool.sends_to(1) == [[1]] and len(pool.queue) == 0


def test_requests_queued_behind_a_busy_worker_go_to_it_as_one_batch():
    pool = Pool(max_rows=4)
    worker = pool.worker(1, batching=True)
    pool.request(0)
    for request_id, rows in ((1, 1), (2, 2), (3, 2)):
        pool.request(request_id, rows=rows)
    pool.answer(worker)
    assert pool.sends_to(1) == [[0], [1, 2]]  # request 3 would make five rows
    assert (worker.batches, worker.rows, len(pool.queue)) == (2, 1, 1)  # rows it answered so far
    stats = pool.router.stats.of("m")
    assert stats.batch_rows.counts[:3] == [1, 0, 0]  # what it ran: one batch of 1 row
    assert sum(stats.queue_waits.counts) == 3
    pool.answer(worker)
    assert stats.batch_rows.counts[:3] == [1, 0, 1] and worker.rows == 4  # then one of 3 (bucket 4)
    assert worker.batch_sizes == {1: 1, 4: 1}


def test_rows_a_route_frame_claims_are_counted_only_once_run():
    """A route frame that lies about its rows is refused by the worker: the lie is counted
    nowhere; the rows a worker ran are."""
    unsplit = {**SIGNATURE, "batching": False}  # the router never cuts its requests: it checks no bytes
    pool = Pool(max_rows=4, models={"m": unsplit})
    worker = pool.worker(1, models={"m": unsplit})
    frames = protocol.encode_request(1, np.zeros((1, 4), np.float32))[1:]
    route = bytearray(frames[0])
    route[-16:-8] = (2**64 - 1).to_bytes(8, "little")  # the one array's first axis (it has no name)
    pool.send(b"liar", [bytes(route), *frames[1:]])
    assert pool.sends_to(1) == [[1]] and pool.part(1).rows == 2**64 - 1
    pool.answer(worker, b"bad_request")
    pool.request(2, rows=3)
    pool.answer(worker)
    stats = pool.router.stats.of("m")
    assert (worker.served, worker.errors, worker.rows, worker.batch_sizes) == (2, 1, 3, {4: 1})
    assert stats.batch_rows.counts[:3] == [0, 0, 1] and stats.batch_rows.total == 3


def test_a_worker_told_to_stop_is_sent_stop_and_never_a_request():
    pool = Pool()
    worker = pool.worker(1)
    pool.request(1)
    pool.router.stop_worker(worker.key)
    pool.request(2)
    pool.answer(worker)
    assert pool.sends_to(1) == [[1], protocol.STOP]
    assert len(pool.queue) == 1
    idle = pool.worker(2)
    pool.answer(idle)  # it took request 2
    pool.router.stop_worker(idle.key)
    pool.flush()
    pool.request(3)
    assert pool.sends_to(2) == [[2], protocol.STOP] and len(pool.queue) == 1


def test_the_rollout_takes_a_free_worker_out_to_reload_it():
    pool = Pool()
    worker = pool.worker(1)
    pool.worker(2, local=False)
    pool.router.begin_rollout("m", 2, b'{"model": {}}')
    pool.flush()
    assert pool.sends_to(1) == [protocol.RELOAD] and worker.state == WorkerState.RELOADING
    assert pool.rollout().switching == worker.key
    pool.request(1)
    assert pool.sends_to(2) == [[1]]  # a worker host watches its own file: it keeps serving


def test_a_worker_that_cannot_be_reached_is_lost_and_the_request_goes_to_the_next():
    pool = Pool()
    pool.worker(1)
    pool.worker(2)
    pool.unreachable.add(2)  # the most recently freed, so the first tried
    pool.request(1)
    assert pool.sends_to(1) == [[1]] and pool.lost == [2]
    assert [w.pid for w in pool.workers.values()] == [1]


def test_a_batch_that_cannot_be_sent_goes_back_first_in_the_queue_as_it_was():
    """It never reached the worker: no attempt counts against it, and it stays one batch."""
    pool = Pool(max_rows=8)
    busy = pool.worker(1, batching=True)
    pool.request(0)
    for request_id in (1, 2, 3):
        pool.request(request_id)
    pool.unreachable.add(1)
    pool.answer(busy)
    assert pool.lost == [1]
    pool.request(4)
    spare = pool.worker(2, batching=True)
    assert pool.sends_to(2) == [[1, 2, 3, 4]] and pool.errors() == {}
    assert all(part.attempts == 1 and not part.solo for part in spare.inflight)


def test_requests_sent_to_workers_gone_one_after_another_are_blamed_for_nothing():
    """A host that dies takes its workers with it; each send to one fails in turn. A request
    that never ran is no killer, and identical requests are still served."""
    pool = Pool()
    for pid in (1, 2, 3, 4):
        pool.worker(pid)
    pool.unreachable.update({2, 3, 4})  # the most recently freed: tried first
    pool.request(5)
    assert pool.lost == [4, 3, 2] and pool.sends_to(1) == [[5]] and pool.part(5).attempts == 1
    assert not pool.quarantine and pool.errors() == {}


def test_a_quarantined_request_is_refused_without_being_sent():
    pool = Pool()
    pool.worker(1)
    killer = pool.request(7)
    pool.quarantine.killed(killer.client, killer.frames, "m")
    pool.answer(next(iter(pool.workers.values())))
    pool.router.receive([zmq.Frame(b"other"), zmq.Frame(b""), *map(zmq.Frame, protocol.encode_request(
        7, np.zeros((1, 4), np.float32))[1:])])
    pool.flush()
    assert pool.sends_to(1) == [[7]]
    assert pool.errors() == {7: "worker_failed"}


def test_a_request_held_for_company_is_released_when_due():
    pool = Pool(max_rows=4, wait=0.02)
    pool.worker(1, batching=True)
    pool.request(1)
    pool.request(2)
    assert pool.sends_to(1) == [] and pool.router.wake_at is not None
    pool.scheduler.tick(pool.router.wake_at - 0.001)  # not yet
    assert pool.router.outbox.take() is None
    time.sleep(0.03)
    pool.router.tick()
    pool.flush()
    assert pool.sends_to(1) == [[1, 2]] and pool.router.wake_at is None


def test_a_remote_worker_is_never_held_for_a_batch():
    pool = Pool(max_rows=4, wait=60.0)
    pool.worker(1, batching=True, local=False)
    pool.request(1)
    assert pool.sends_to(1) == [[1]]


# Recovery.


def test_a_lost_request_is_retried_once_alone_then_fails_and_a_crash_proves_it_a_killer():
    pool = Pool()
    pool.worker(2, token="b")
    pool.worker(1, token="a")  # the request goes to the last one freed
    request = pool.request(9)
    pool.exited("a", "was killed by SIGSEGV")
    part = pool.part(9)
    assert pool.sends_to(2) == [[9]] and part.solo and part.attempts == MAX_ATTEMPTS
    pool.exited("b", "was killed by SIGABRT")
    assert pool.errors() == {9: "worker_failed"}
    assert pool.lost == [1, 2] and pool.workers == {}
    assert pool.quarantine.refusal(b"other", request.frames) is not None  # proven: it killed twice


def test_a_crash_by_an_identical_request_sent_again_is_the_second_piece_of_evidence():
    """A request that crashes its worker, and whose retry never runs (its deadline passes, say),
    is sent again: the second crash of identical content proves it a killer, retried or not."""
    pool = Pool()
    pool.worker(2, token="b")
    pool.worker(1, token="a")
    first = pool.request(1, deadline_ms=10_000)
    pool.exited("a", "was killed by SIGSEGV")  # a suspect: retried on b
    pool.answer(pool.workers[(True, b"w2")])  # the retry runs and is answered: no verdict yet
    assert pool.errors() == {} and pool.quarantine.refusal(b"c", first.frames) is None
    pool.worker(3, token="c")
    pool.request(2, deadline_ms=10_000)  # the same content again
    pool.exited("c", "was killed by SIGSEGV")
    assert pool.errors() == {2: "worker_failed"}  # not retried: it is the second crash
    assert pool.quarantine.refusal(b"other", first.frames) is not None


@pytest.mark.parametrize("second", ["sigkill", "sigbus", "link", "silent"])
def test_a_second_loss_with_a_cause_of_its_own_fails_the_request_but_blames_it_for_nothing(second):
    """The second worker went for a visible reason of its own (SIGKILLed from outside; SIGBUS, its
    weight file cut short; a worker host's link closed, as when the host goes away with all its workers, the retry's too; given
    up by the router): nothing shows the request killed it, whatever the first loss was."""
    pool = Pool()
    pool.worker(3, token="c")  # where an identical request goes afterwards
    sibling = pool.worker(2, local=second != "link", token="b")
    first = pool.worker(1, local=second != "link", token="a")
    request = pool.request(9)
    if first.local:
        pool.exited("a", "was killed by SIGSEGV")  # even after a crash
    else:
        pool.lose(first, "unreachable (Host unreachable)")
    assert pool.sends_to(2) == [[9]]
    if second in ("sigkill", "sigbus"):
        pool.exited("b", f"was killed by {second.upper()}", outside=True)
    elif second == "link":
        pool.lose(sibling, "unreachable (Host unreachable)")
    else:
        pool.lose(sibling, "no heartbeat for 6.0s, its process stopped")
    assert pool.errors() == {9: "worker_failed"} and not pool.quarantine
    pool.request(10, client=b"other", payload=np.zeros((1, 4), np.float32))
    assert pool.quarantine.refusal(b"other", request.frames) is None and pool.sends_to(3) == [[10]]


def test_a_killer_crashing_a_local_worker_after_a_remote_one_is_still_a_killer():
    pool = Pool()
    pool.worker(2, token="b")
    remote = pool.worker(1, local=False)
    request = pool.request(9)
    pool.lose(remote, "unreachable (Host unreachable)")
    pool.exited("b", "exited with code 134")
    assert pool.errors() == {9: "worker_failed"}
    assert pool.quarantine.refusal(b"other", request.frames) is not None


def test_a_request_whose_workers_were_both_sigkilled_fails_but_is_not_quarantined():
    pool = Pool()
    pool.worker(2, token="b")
    pool.worker(1, token="a")  # freed last: the request goes to it
    request = pool.request(9)
    pool.exited("a", "was killed by SIGKILL", outside=True)
    assert pool.sends_to(2) == [[9]]
    pool.exited("b", "was killed by SIGKILL", outside=True)
    assert pool.errors() == {9: "worker_failed"}
    assert not pool.quarantine and pool.quarantine.refusal(b"other", request.frames) is None


def running_a_batch(pool: Pool, *clients: bytes) -> WorkerRecord:
    """A batching worker running one batch: requests 1, 2 ... of ``clients``, in turn."""
    worker = pool.worker(1, batching=True)
    pool.request(0)
    for request_id, client in enumerate(clients, 1):
        pool.request(request_id, client=client)
    pool.answer(worker)
    assert len(worker.inflight) == len(clients)
    return worker


def test_a_lost_batch_of_two_clients_is_retried_request_by_request_blaming_neither():
    pool = Pool(max_rows=8)
    worker = running_a_batch(pool, b"a", b"b")
    pool.lose(worker)
    spare = pool.worker(2, batching=True)
    assert pool.sends_to(2) == [[1]]
    pool.answer(spare)
    assert pool.sends_to(2) == [[1], [2]]  # alone, in the order they had
    assert not pool.quarantine


def test_a_lost_batch_of_one_client_blames_it_for_nothing():
    pool = Pool(max_rows=8)
    worker = running_a_batch(pool, b"c", b"c")
    pool.lose(worker)
    assert not pool.quarantine


def test_deaths_from_outside_blame_no_client_and_only_distinct_killers_refuse_one():
    """Workers killed under a client's requests, each of which then succeeds alone, count for
    nothing; three different requests that each kill twice refuse the client's connection."""
    pool = Pool()

    def running() -> WorkerRecord:
        return next(w for w in pool.workers.values() if w.inflight)

    for request_id in range(10):
        pool.worker(2 * request_id + 1)
        pool.worker(2 * request_id + 2)
        pool.request(request_id, client=b"innocent")
        pool.lose(running(), "killed from outside")
        assert pool.part(request_id).attempts == MAX_ATTEMPTS
        pool.answer(running())
    assert pool.errors() == {} and not pool.quarantine
    for number in range(3):
        assert pool.quarantine.refusal(b"killer", [b"", f"{number}".encode()]) is None
        pool.quarantine.killed(b"killer", protocol.encode_request(number, [f"killer {number}"])[1:], "m")
        pool.quarantine.killed(b"killer", protocol.encode_request(number + 9, [f"killer {number}"])[1:], "m")
    assert "3 different requests" in pool.quarantine.refusal(b"killer", [b"", b"anything"])
    assert pool.quarantine.refusal(b"innocent", [b"", b"anything"]) is None


def test_a_lost_free_worker_is_taken_off_the_free_list():
    pool = Pool()
    worker = pool.worker(1)
    pool.lose(worker, "gone", asked=True)
    pool.request(1)
    assert pool.sent == [] and pool.lost == [1]
    pool.lose(worker, "again")  # already forgotten: nothing happens
    assert pool.lost == [1]


def test_a_request_past_the_timeout_is_answered_and_its_worker_given_up():
    pool = Pool(request_timeout=0.5)
    worker = pool.worker(1)
    request = pool.request(4)
    assert not recovery.overdue(worker, worker.busy_since + 0.4, 0.5)
    assert recovery.overdue(worker, worker.busy_since + 0.6, 0.5)
    pool.scheduler.time_out(worker)
    pool.flush()
    assert pool.errors() == {4: "request_timeout"} and pool.lost == [1]
    assert pool.quarantine.refusal(b"other", request.frames) is not None


def test_a_batch_past_the_timeout_is_retried_request_by_request():
    pool = Pool(max_rows=8, request_timeout=0.5)
    worker = running_a_batch(pool, b"c", b"c")
    pool.scheduler.time_out(worker)
    pool.flush()
    assert pool.errors() == {} and pool.lost == [1]
    assert [p.solo for p in pool.queue.everything()] == [True, True]


def test_what_is_left_of_a_partly_answered_batch_past_the_timeout_is_retried_blaming_no_one():
    """A worker answers a batch's requests as their passes end; the one left when the batch
    runs out of time spent it waiting behind the others."""
    pool = Pool(max_rows=8, request_timeout=0.5)
    worker = running_a_batch(pool, b"a", b"b")
    first = worker.inflight[0]
    pool.router.from_worker(True, worker.address, [zmq.Frame(protocol.REPLY),
                                   zmq.Frame(first.request.client), zmq.Frame(b"ok"),
                                   *map(zmq.Frame, protocol.encode_reply(1))])
    pool.scheduler.time_out(worker)
    pool.flush()
    assert pool.errors() == {} and pool.lost == [1] and not pool.quarantine
    assert [p.solo for p in pool.queue.everything()] == [True]


def test_an_idle_worker_is_never_overdue():
    pool = Pool(request_timeout=0.5)
    worker = pool.worker(1)
    assert not recovery.overdue(worker, time.monotonic() + 60, 0.5)
    assert not recovery.overdue(worker, time.monotonic() + 60, None)  # no timeout at all


def test_an_exited_process_loses_only_the_local_workers_with_its_token():
    pool = Pool()
    pool.worker(1, token="t1")
    pool.worker(2, token="t2")
    pool.worker(3, local=False)
    pool.exited("t1", "exited", asked=True)
    assert sorted(w.pid for w in pool.workers.values()) == [2, 3] and pool.lost == [1]


def test_fail_all_answers_queued_and_in_flight_requests():
    pool = Pool()
    worker = pool.worker(1)
    pool.request(1)
    pool.request(2)
    pool.router.fail_all("shutting_down", "bye")
    pool.flush()
    assert pool.errors() == {1: "shutting_down", 2: "shutting_down"}
    assert worker.inflight == [] and len(pool.queue) == 0 and pool.router.unfinished == 0


# Doors and draining.


def test_http_requests_batch_by_count_and_never_with_requests_of_arrays():
    """The router cannot see a KServe body: its requests share a message by count (the worker
    runs the rows it is handed in passes of at most --max-batch), and it groups them by what it
    decodes; ZeroMQ requests of arrays batch among themselves."""
    pool = Pool(max_rows=4)
    worker = pool.worker(1, batching=True)
    pool.request(0)
    lane = pool.router.intake.local_key + b"lane"
    for request_id in (1, 2, 3, 4, 5):
        frames = request_frames(request_id, KSERVE, "m", b"{}", head=None, deadline=None)
        pool.router.admit_local(lane + bytes([request_id]), frames, 100, "infer")
    pool.request(6)
    pool.flush()
    assert len(pool.queue) == 6
    for _ in range(3):
        pool.answer(worker)
    assert pool.sends_to(1) == [[0], [1, 2, 3, 4], [5], [6]]
    http = [frames for pid, frames in pool.sent if frames[0] == protocol.BATCH]
    assert all(frames[3].startswith(pool.router.intake.local_key) for frames in http)


def test_draining_answers_new_requests_and_runs_the_held_ones():
    pool = Pool()
    worker = pool.worker(1)
    pool.request(1)
    pool.request(2)
    pool.router.stop_accepting()
    pool.router.receive([zmq.Frame(b"late"), zmq.Frame(b""), *map(zmq.Frame, protocol.encode_request(
        3, np.zeros((1, 4), np.float32))[1:])])
    pool.flush()
    assert pool.errors() == {3: "shutting_down"} and pool.router.unfinished == 2
    pool.answer(worker)
    pool.answer(worker)
    assert pool.router.unfinished == 0 and pool.sends_to(1) == [[1], [2]]


# Several models.

TWO = {"a": SIGNATURE, "b": SIGNATURE}


def test_a_request_names_its_model_or_goes_to_the_only_one():
    pool = Pool(models=TWO)
    pool.worker(1, models=TWO)
    for request_id, model in ((1, None), (2, "c"), (3, "b")):
        frames = protocol.encode_request(request_id, np.zeros((1, 4), np.float32), model=model)[1:]
        pool.router.receive([zmq.Frame(b"c"), zmq.Frame(b""), *map(zmq.Frame, frames)])
    pool.flush()
    assert pool.errors() == {1: "model_not_found", 2: "model_not_found"}
    messages = [protocol.decode_header(frames[0])["error"]["message"] for frames in pool.replies]
    assert all("(served: a, b)" in message for message in messages)
    assert [_model_of(frames) for frames in pool.messages_to(1)] == [b"b"]
    one = Pool()
    one.worker(1)
    one.request(4)  # no model named: the only one
    assert one.sends_to(1) == [[4]]


def test_batches_never_mix_models_and_a_worker_serves_only_its_models():
    pool = Pool(max_rows=8, models=TWO)
    busy = pool.worker(1, batching=True, models=TWO)
    pool.request(0, model="a")
    for request_id, model in ((1, "a"), (2, "b"), (3, "a"), (4, "b")):
        pool.request(request_id, model=model)
    pool.worker(2, batching=True, models={"b": SIGNATURE})
    assert pool.sends_to(2) == [[2, 4]]  # b's work waited, a's it cannot take
    pool.answer(busy)
    assert pool.sends_to(1) == [[0], [1, 3]]
    assert [_model_of(frames) for frames in pool.messages_to(1)] == [b"a", b"a"]
    assert [_model_of(frames) for frames in pool.messages_to(2)] == [b"b"]


def test_a_flooded_model_cannot_starve_a_quiet_one():
    """The rule: a free worker takes the work of the model that has had the least of the
    workers' time. A request of a quiet model waits for a pass in progress, never for the
    flooded model's queue."""
    pool = Pool(max_rows=2, models=TWO)
    workers = [pool.worker(pid, batching=True, models=TWO) for pid in (1, 2)]
    for request_id in range(40):  # a flood on a: both workers busy, 38 queued
        pool.request(request_id, model="a", client=b"flood")
    pool.request(100, model="b", client=b"quiet")
    assert pool.queue.depth("a") == 38 and pool.queue.depth("b") == 1
    pool.answer(workers[0])  # the first pass to end takes the quiet model's request
    assert pool.sends_to(1)[-1] == [100]
    pool.answer(workers[1])
    assert pool.sends_to(2)[-1] == [2, 3]  # then the flood goes on, oldest first
    pool.request(101, model="b", client=b"quiet")
    pool.answer(workers[0])
    assert pool.sends_to(1)[-1] == [101]


class Clock:
    """The time the scheduler counts the workers' time by, moved by the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def run_flood(pool: Pool, clock: Clock, worker: WorkerRecord, seconds: dict[str, float], passes: int) -> list[str]:
    """``worker`` answers ``passes`` messages, each taking its model's ``seconds``: the models it ran."""
    ran = []
    for _ in range(passes):
        model = worker.running
        ran.append(model)
        clock.now += seconds[model]
        pool.answer(worker)
    return ran


def test_models_with_work_share_the_workers_time_however_long_their_passes():
    """A model whose passes take a tenth of another's runs ten passes to its one: each has half
    the worker's time, as two pools of their own would on one core (not one pass each in turn)."""
    clock = Clock()
    pool = Pool(models=TWO, clock=clock, max_queue=200)
    worker = pool.worker(1, models=TWO)
    for request_id in range(120):
        pool.request(request_id, model="a" if request_id % 2 else "b", client=b"a" if request_id % 2 else b"b")
    ran = run_flood(pool, clock, worker, {"a": 10.0, "b": 1.0}, 44)
    time_of = {model: ran.count(model) * {"a": 10.0, "b": 1.0}[model] for model in TWO}
    assert abs(time_of["a"] - time_of["b"]) <= 10.0, ran
    assert ran.count("b") >= 8 * ran.count("a") > 0


def test_a_model_back_from_idle_gets_no_credit_for_the_time_it_was_away():
    clock = Clock()
    pool = Pool(models=TWO, clock=clock)
    worker = pool.worker(1, models=TWO)
    for request_id in range(60):
        pool.request(request_id, model="a", client=b"a")
    assert run_flood(pool, clock, worker, {"a": 1.0}, 20) == ["a"] * 20  # b idle all along
    for request_id in range(100, 130):
        pool.request(request_id, model="b", client=b"b")
    ran = run_flood(pool, clock, worker, {"a": 1.0, "b": 1.0}, 20)
    assert 8 <= ran.count("b") <= 12, ran  # half the time from now on, not 20 passes to catch up


def test_each_model_batches_by_its_own_max_rows():
    pool = Pool(models=TWO)
    pool.router.remove_model("b")
    pool.router.add_model("b", SIGNATURE, max_rows=4)
    worker = pool.worker(1, batching=True, models=TWO)
    pool.request(0, model="a")
    for request_id in (1, 2, 3):
        pool.request(request_id, model="b")
    for request_id in (4, 5):
        pool.request(request_id, model="a")
    pool.answer(worker)
    pool.answer(worker)
    pool.answer(worker)
    assert pool.sends_to(1) == [[0], [1, 2, 3], [4], [5]]  # a: --max-batch 1, b: 4


# Requests in parts.


def test_a_request_with_more_rows_than_a_pass_takes_spreads_over_the_free_workers():
    pool = Pool(max_rows=4)
    workers = [pool.worker(pid, batching=True) for pid in (1, 2, 3)]
    pool.request(1, rows=10)
    assert [len(w.inflight) for w in workers] == [1, 1, 1]
    assert sorted((p.start, p.stop) for w in workers for p in w.inflight) == [(0, 4), (4, 8), (8, 10)]
    for worker in reversed(workers):
        pool.answer(worker)
    reply = pool.answered()[1]
    assert reply.arrays[0].shape == (10, 4)
    assert list(reply.arrays[0][:, 0]) == [0] * 4 + [4] * 4 + [8] * 2  # each part's rows in order


def test_a_part_carries_its_rows_cut_from_the_request_without_decoding_it():
    pool = Pool(max_rows=2, models={"t": TEXTS})
    pool.worker(1, batching=True, models={"t": TEXTS})
    pool.worker(2, batching=True, models={"t": TEXTS})
    pool.request(1, payload=["one", "dos", "trois"], model="t")
    messages = pool.messages_to(2) + pool.messages_to(1)
    cuts = [(struct_part(frames[3]), bytes(frames[6])) for frames in messages]
    assert cuts == [((0, 2), b"onedos"), ((2, 3), b"trois")]
    for frames in messages:
        start, stop = struct_part(frames[3])
        message = protocol.decode_request(frames[4:], (start, stop))
        assert message.texts == ["one", "dos", "trois"][start:stop] and message.first == start


def struct_part(frame: Any) -> tuple[int, int]:
    from workerpool.worker.requests import read_part

    part = read_part(frame)
    assert part is not None
    return part


def test_a_lost_part_is_retried_alone_and_only_it_runs_again():
    pool = Pool(max_rows=4)
    first, second = pool.worker(1, batching=True), pool.worker(2, batching=True)
    pool.request(1, rows=8)
    assert [(p.start, p.stop) for p in second.inflight + first.inflight] == [(0, 4), (4, 8)]
    pool.lose(second)  # its part lost, while the other runs
    spare = pool.worker(3, batching=True)
    assert [(p.start, p.stop, p.solo) for p in spare.inflight] == [(0, 4, True)]
    pool.answer(first)
    pool.answer(spare)
    reply = pool.answered()[1].arrays[0]
    assert reply.shape == (8, 4) and list(reply[:, 0]) == [0] * 4 + [4] * 4 and pool.errors() == {}


def test_a_failed_part_answers_the_request_and_what_is_left_is_dropped():
    pool = Pool(max_rows=2)
    worker = pool.worker(1, batching=True)
    pool.request(1, rows=6)
    pool.answer(worker, b"bad_request")
    assert pool.errors() == {1: "bad_request"} and len(pool.queue) == 0
    assert pool.router.unfinished == 0
    pool.request(2)
    assert pool.sends_to(1) == [[1], [2]]  # the rest of request 1 never ran


def test_a_request_in_parts_that_cannot_wait_is_refused_at_once():
    pool = Pool(max_rows=2, max_queue=1)
    pool.worker(1, batching=True)
    pool.request(1, rows=4, client=b"a")  # a part runs, the rest holds the one place in the queue
    pool.router.receive([zmq.Frame(b"b"), zmq.Frame(b""), *map(zmq.Frame, protocol.encode_request(
        2, np.zeros((4, 4), np.float32))[1:])])
    pool.flush()
    assert pool.errors() == {2: "overloaded"} and pool.sends_to(1) == [[1]]


def test_the_parts_of_a_request_run_on_one_generation():
    """The first part pins the generation: a worker of another takes none of the rest."""
    pool = Pool(max_rows=2)
    old, new = pool.worker(1, batching=True), pool.worker(2, batching=True, generation=2)
    pool.request(1, rows=6)  # the first part goes to the worker freed last
    assert [p.request.generation for p in new.inflight] == [2] and old.inflight == []
    assert pool.queue.depth("m") == 1
    for _ in range(3):
        pool.answer(new)
    assert pool.sends_to(1) == [] and pool.answered()[1].arrays[0].shape == (6, 4)


def test_a_request_whose_generation_no_worker_serves_any_more_starts_again():
    pool = Pool(max_rows=2)
    new, old = pool.worker(2, batching=True, generation=2), pool.worker(1, batching=True)
    pool.request(1, rows=6)
    assert [p.request.generation for p in old.inflight] == [1] and new.inflight == []
    pool.lose(old)  # the only worker of generation 1: what ran of it is of no use
    assert [(p.start, p.stop, p.request.generation) for p in new.inflight] == [(0, 2, 2)]
    for _ in range(3):
        pool.answer(new)
    reply = pool.answered()[1].arrays[0]
    assert reply.shape == (6, 4) and list(reply[:, 0]) == [0, 0, 2, 2, 4, 4] and pool.errors() == {}


# Models added and removed.


def test_a_model_added_rolls_out_to_the_workers_one_at_a_time():
    pool = Pool()
    first, second = pool.worker(1), pool.worker(2)
    pool.router.add_model("n", SIGNATURE, max_rows=1)
    pool.router.begin_rollout("n", 1, b'{"model": {"name": "n"}}')
    pool.flush()
    switching = pool.rollout("n").switching
    assert switching in (first.key, second.key) and not pool.router.reload_complete("n")
    worker = pool.workers[switching]
    pool.router.from_worker(True, worker.address, [zmq.Frame(protocol.RELOADED), zmq.Frame(
        json.dumps({"model": "n", "ok": True, "ordered": 1, "generation": 1}).encode())])
    pool.flush()
    other = second if worker is first else first
    assert pool.rollout("n").switching == other.key
    assert pool.serving == {worker.pid: {"m": 1, "n": 1}}  # its owner hears what it serves now
    pool.request(1, model="n")
    assert pool.sends_to(worker.pid)[-1] == [1]  # it serves n now


def test_a_removed_model_answers_what_waits_and_its_workers_drop_it():
    pool = Pool(models=TWO)
    worker = pool.worker(1, models=TWO)
    pool.request(1, model="a")
    pool.request(2, model="b")
    pool.router.remove_model("b")
    pool.flush()
    assert pool.errors() == {2: "model_not_found"}
    pool.answer(worker)
    assert pool.sends_to(1)[-1] == protocol.RELOAD  # told to drop b once free
    assert json.loads(pool.sent[-1][1][1]) == {"remove": "b"}
    pool.router.from_worker(True, worker.address, [zmq.Frame(protocol.RELOADED),
                                   zmq.Frame(b'{"model": "b", "ok": true, "removed": true}')])
    assert worker.models == {"a": 1} and worker.state == WorkerState.READY
    assert pool.serving == {1: {"a": 1}}  # the supervisor learns it: a replacement maps what it mapped


@pytest.mark.parametrize("generation", [1, 2])
def test_a_worker_of_another_generation_never_answers_a_client_that_saw_a_newer_one(generation):
    pool = Pool()
    pool.worker(1, generation=generation)
    pool.router.begin_rollout("m", 2, b"{}")
    pool.rollout().answered(b"c", 2)
    pool.flush()
    pool.request(1)
    assert (pool.router.queue_depth == 1) == (generation == 1)


def test_a_model_removed_while_a_worker_switches_it_is_dropped_once_it_answers():
    pool = Pool()
    worker = pool.worker(1)
    pool.router.add_model("n", SIGNATURE, max_rows=1)
    pool.router.begin_rollout("n", 1, b'{"model": {"name": "n"}}')
    pool.flush()
    assert pool.rollout("n").switching == worker.key
    pool.router.remove_model("n")
    pool.reloaded(worker, {"model": "n", "ok": True, "ordered": 1, "generation": 1})
    assert json.loads(pool.sent[-1][1][1]) == {"remove": "n"}  # it loaded n: it lets go of it next
    pool.reloaded(worker, {"model": "n", "ok": True, "removed": True})
    assert worker.models == {"m": 1} and worker.state == WorkerState.READY
    pool.request(1)
    assert pool.sends_to(1)[-1] == [1]


def test_a_part_whose_model_was_removed_is_answered_when_its_worker_is_lost():
    pool = Pool(models=TWO)
    worker = pool.worker(1, models=TWO)
    pool.request(1, model="b")
    pool.router.remove_model("b")
    pool.lose(worker)
    assert pool.errors() == {1: "model_not_found"} and pool.router.unfinished == 0


def test_a_name_removed_and_served_again_is_loaded_anew_by_a_worker_that_still_held_it():
    """The worker was busy when b was removed: it still lists b, but the b served now is another file."""
    pool = Pool(models=TWO)
    worker = pool.worker(1, models=TWO, generation=3)
    pool.request(1, model="a")
    pool.router.remove_model("b")
    pool.router.add_model("b", SIGNATURE, max_rows=1)
    pool.router.begin_rollout("b", 4, b'{"model": {"name": "b"}}')
    pool.flush()
    assert "b" not in worker.models and not pool.router.reload_complete("b")
    pool.answer(worker)
    assert json.loads(pool.sent[-1][1][1]) == {"remove": "b"}  # first it lets go of the removed file
    pool.request(2, model="b")
    assert pool.router.queue_depth == 1  # never run on the weights removed
    pool.reloaded(worker, {"model": "b", "ok": True, "removed": True})
    assert json.loads(pool.sent[-1][1][1]) == {"model": {"name": "b"}}  # then it loads the new one


def test_a_local_worker_of_a_model_no_longer_served_is_refused():
    """Started for a before a was removed: it is not taken for the model served now."""
    pool = Pool(models={"a": SIGNATURE})
    pool.router.add_model("b", SIGNATURE, max_rows=1)
    pool.router.remove_model("a")
    pool.router.from_worker(True, b"w1", [zmq.Frame(protocol.READY), zmq.Frame(json.dumps(
        {"pid": 1, "host": "h", "token": None, "models": {"a": {"generation": 1, "model": "a", **SIGNATURE}}}).encode())])
    pool.flush()
    assert not pool.workers
    host = pool.worker(2, local=False, models={"a": SIGNATURE})  # a worker host's own name for the one model
    assert host.models == {"b": 1}


def test_a_malformed_reply_to_a_part_answers_its_request_and_harms_nothing_else():
    pool = Pool(max_rows=2)
    worker = pool.worker(1, batching=True, local=False)
    pool.request(1, rows=4)
    part = worker.inflight[0]
    bad = json.dumps({"v": 3, "id": 1, "status": "ok", "arrays": [7]}).encode()
    pool.router.from_worker(False, worker.address, [zmq.Frame(protocol.REPLY), zmq.Frame(b"c"),
                                    zmq.Frame(b"ok"), zmq.Frame(bad)])
    pool.answer(worker)
    assert part.stale and pool.errors() == {1: "internal"} and pool.router.unfinished == 0
    pool.request(2)
    assert pool.sends_to(1)[-1] == [2]


def test_a_stale_retried_part_does_not_hold_a_rollout_back():
    pool = Pool(max_rows=2)
    lost, other = pool.worker(1, batching=True), pool.worker(2, batching=True)
    pool.request(1, rows=4)
    pool.lose(lost)  # its part waits to be retried, pinned to generation 1
    pool.router.begin_rollout("m", 2, b'{"model": {}}')
    pool.flush()
    pool.answer(other, b"bad_request")  # the request is answered: the part left is stale
    pool.router.tick()
    pool.flush()
    assert pool.rollout().switching == other.key


def test_a_request_pinned_to_a_generation_older_than_its_client_has_seen_starts_again():
    """Else its client's floor would keep it from the workers of its generation, and their
    switch would wait for it: the model would stand still."""
    pool = Pool(max_rows=2)
    first, second, third = (pool.worker(pid, batching=True) for pid in (1, 2, 3))
    pool.router.begin_rollout("m", 2, b'{"model": {}}')
    pool.flush()
    switched = pool.workers[pool.rollout().switching]
    pool.reloaded(switched, {"model": "m", "ok": True, "ordered": 2, "generation": 2})
    pool.request(1)  # on the worker of generation 2, freed last
    pool.router.stop_worker(switched.key)
    pool.flush()
    request = pool.request(2, rows=6)  # no generation 2 left but the one stopping: pinned to 1
    assert request.generation == 1
    pool.answer(switched)  # its client has seen generation 2 now
    for worker in (first, second, third):
        if worker is not switched and worker.inflight:
            pool.answer(worker)
    pool.router.tick()
    pool.flush()
    assert request.generation != 1


def test_a_killer_of_one_model_is_refused_for_that_model_alone_and_forgiven_with_its_new_weights():
    pool = Pool(models=TWO)
    frames = protocol.encode_request(1, np.zeros((1, 4), np.float32), model="a")[1:]
    pool.quarantine.killed(b"killer", frames, "a")
    assert pool.quarantine.refusal(b"other", frames) is not None
    assert pool.quarantine.refusal(b"other", protocol.encode_request(1, np.zeros((1, 4), np.float32),
                                                                     model="b")[1:]) is None
    pool.router.begin_rollout("b", 2, b"{}")
    assert pool.quarantine.refusal(b"other", frames) is not None
    pool.router.begin_rollout("a", 2, b"{}")
    assert pool.quarantine.refusal(b"other", frames) is None


def test_a_request_in_parts_that_has_begun_runs_to_its_end_past_its_deadline():
    """The deadline bounds the wait for a worker: what ran of it would be lost."""
    pool = Pool(max_rows=2)
    worker = pool.worker(1, batching=True)
    request = pool.request(1, rows=6, deadline_ms=60_000)
    request.expires = time.monotonic() - 1  # it passes while the first part runs
    for _ in range(3):
        pool.router.tick()
        pool.answer(worker)
    assert pool.errors() == {} and len(pool.answered()[1].arrays[0]) == 6 and request.done


def test_the_data_of_a_request_to_cut_must_be_what_its_route_frame_says():
    pool = Pool(max_rows=2)
    pool.worker(1, batching=True)
    route, header, data = protocol.encode_request(1, np.zeros((4, 4), np.float32))[1:]
    pool.send(b"c", [route, header, bytes(data) + b"junk"])
    assert pool.errors() == {1: "bad_request"}
    empty = protocol.encode_request(2, np.zeros((10**6, 0), np.float32))[1:]  # rows of no bytes
    pool.send(b"c", empty)
    assert pool.sends_to(1) == [[2]]  # one message: never a million parts


def test_a_workers_usage_is_counted_for_a_model_it_serves_and_only_within_the_models_limit():
    """What a worker says its tokenizer did reaches the metrics bounded: a worker host is outside."""
    pool = Pool(models={"m": {**TEXTS, "max_input_tokens": 8}, "a": SIGNATURE})
    worker = pool.worker(1, models={"m": {**TEXTS, "max_input_tokens": 8}})

    def usage(frames: list[bytes]) -> None:
        pool.router.from_worker(True, worker.address, [zmq.Frame(frame) for frame in frames])

    usage(protocol.usage_message("m", 3, 20, 0.002))
    usage(protocol.usage_message("m", 3, 25, 0.001))  # more than 3 texts of at most 8 tokens hold
    usage(protocol.usage_message("a", 3, 20, 0.001))  # a model it does not serve
    usage(protocol.usage_message("m", 1, 2, -1.0))
    usage(protocol.usage_message("m", 1, 2, 0.001)[:2])  # malformed
    stats = pool.router.stats.of("m")
    assert (stats.texts, stats.tokens, stats.tokenizing) == (3, 20, pytest.approx(0.002))
    assert pool.router.stats.of("a").texts == 0
