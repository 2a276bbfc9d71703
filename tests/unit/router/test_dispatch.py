"""Dispatch and recovery in-process, without sockets: workers are records, sends are recorded.

The dispatcher and the recovery are built as the router builds them, over an intake whose
client socket is a stand-in that keeps the replies, and a fake ``send`` that records what each
worker is sent (or, for a worker marked unreachable, loses it, as the router's send does).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import zmq

from workerpool.protocol import messages as protocol
from workerpool.router.batching import BatchPolicy
from workerpool.router.dispatch import Dispatcher
from workerpool.router.intake import Intake, Pending
from workerpool.router.quarantine import Quarantine
from workerpool.router.recovery import MAX_ATTEMPTS, Recovery
from workerpool.router.registry import WorkerKey, WorkerRecord, WorkerState
from workerpool.router.rollout import Rollout
from workerpool.router.stats import RouterStats

SIGNATURE_RANK = 2  # requests of shape (rows, 4): the batch axis first


class Replies:
    """Stands in for the client socket: keeps each message the intake sends."""

    def __init__(self) -> None:
        self.messages: list[list[bytes]] = []
        self._parts: list[bytes] = []

    def send(self, part: Any, flags: int = 0, copy: bool = True) -> None:
        self._parts.append(bytes(part))
        if not flags & zmq.SNDMORE:
            self.messages.append(self._parts)
            self._parts = []

    def errors(self) -> dict[int, str]:
        """Request id -> error code of the error replies sent so far."""
        headers = [protocol.decode_header(message[2]) for message in self.messages]
        return {h["id"]: h["error"]["code"] for h in headers if h["status"] == "error"}


class Pool:
    """A dispatcher and a recovery over one registry, as the router wires them."""

    def __init__(self, *, batching: BatchPolicy | None = None, request_timeout: float | None = None) -> None:
        self.workers: dict[WorkerKey, WorkerRecord] = {}
        self.replies = Replies()
        self.sent: list[tuple[int, list[Any]]] = []  # (pid, frames) of each send that left
        self.unreachable: set[int] = set()
        self.lost: list[int] = []
        self.rollout = Rollout()
        self.quarantine = Quarantine()
        self.stats = RouterStats()
        self.intake = Intake(self.replies, max_queue=64, max_message_size=1 << 20,  # type: ignore[arg-type]
                             max_queue_bytes=None, dispatch=lambda pending: self.dispatcher.dispatch(pending))
        if batching is not None:
            batching.rank = SIGNATURE_RANK
        self.dispatcher = Dispatcher(self.workers, self.intake, send=self.send,
                                     batching=batching or BatchPolicy(), rollout=self.rollout,
                                     quarantine=self.quarantine, stats=self.stats)
        self.recovery = Recovery(self.workers, self.intake, self.dispatcher, rollout=self.rollout,
                                 quarantine=self.quarantine, lost=lambda w, why: self.lost.append(w.pid),
                                 request_timeout=request_timeout)

    def send(self, worker: WorkerRecord, frames: list[Any]) -> bool:
        if worker.pid in self.unreachable:
            self.recovery.lose(worker.key, "unreachable")
            return False
        self.sent.append((worker.pid, frames))
        return True

    def worker(self, pid: int, *, batching: bool = False, local: bool = True, token: str | None = None,
               generation: int = 1) -> WorkerRecord:
        """Register a worker and free it, as the router does on its READY."""
        record = WorkerRecord(address=f"w{pid}".encode(), link=None, pid=pid, host="h",  # type: ignore[arg-type]
                              generation=generation, model="m", local=local, token=token,
                              started=0.0, last_seen=0.0, batching=batching)
        self.workers[record.key] = record
        self.dispatcher.worker_free(record)
        return record

    def request(self, request_id: int, *, client: bytes = b"c", rows: int = 1) -> Pending:
        """A request arriving: dispatched at once, or queued (the intake's limits aside)."""
        frames = protocol.encode_request(request_id, np.zeros((rows, 4), np.float32))[1:]
        pending = Pending(client, frames, time.monotonic(), size=sum(len(bytes(f)) for f in frames))
        if not self.dispatcher.dispatch(pending):
            self.intake.enqueue(pending)
        return pending

    def answer(self, worker: WorkerRecord) -> None:
        """``worker`` answers everything it holds (the replies themselves are the router's)."""
        worker.inflight.clear()
        self.dispatcher.finished(worker, time.monotonic())

    def sends_to(self, pid: int) -> list[list[int] | bytes]:
        """What ``pid`` was sent: the request ids of each REQUEST or BATCH, else the command."""
        return [_ids(frames) for to, frames in self.sent if to == pid]


def _ids(frames: list[Any]) -> list[int] | bytes:
    if frames[0] == protocol.REQUEST:
        return [protocol.decode_header(frames[2])["id"]]
    if frames[0] == protocol.BATCH:
        stride = int(frames[1])
        return [protocol.decode_header(frames[i + 1])["id"] for i in range(2, len(frames), stride)]
    return frames[0]


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


def test_a_worker_whose_last_answer_failed_goes_to_the_back_of_the_free_list():
    """Else a worker that fails fast (a broken model) would always be the last freed, and draw
    every request while the others idle."""
    pool = Pool()
    broken, healthy = pool.worker(1), pool.worker(2)
    pool.request(1)
    pool.request(2)
    pool.answer(healthy)
    broken.failed_last = True  # the router sets it when a reply is an error
    pool.answer(broken)  # freed last, yet not the next to take a request
    pool.request(3)
    pool.answer(healthy)
    pool.request(4)
    assert pool.sends_to(2) == [[1], [3], [4]] and pool.sends_to(1) == [[2]]


def test_a_request_waits_until_a_worker_is_free():
    pool = Pool()
    pool.request(1)
    assert len(pool.intake.queue) == 1 and pool.sent == []
    pool.worker(1)
    assert pool.sends_to(1) == [[1]] and len(pool.intake.queue) == 0


def test_requests_queued_behind_a_busy_worker_go_to_it_as_one_batch():
    pool = Pool(batching=BatchPolicy(max_rows=4))
    worker = pool.worker(1, batching=True)
    pool.request(0)
    for request_id, rows in ((1, 1), (2, 2), (3, 2)):
        pool.request(request_id, rows=rows)
    pool.answer(worker)
    assert pool.sends_to(1) == [[0], [1, 2]]  # request 3 would make five rows
    assert (worker.batches, worker.rows, len(pool.intake.queue)) == (2, 4, 1)
    assert pool.stats.batch_rows.counts[:3] == [1, 0, 1]  # a batch of 1 row, one of 3 (bucket 4)
    assert sum(pool.stats.queue_waits.counts) == 3


def test_a_stopping_worker_is_sent_stop_and_never_a_request():
    pool = Pool()
    worker = pool.worker(1)
    pool.request(1)
    worker.state = WorkerState.STOPPING
    pool.dispatcher.withdraw(worker.key)
    pool.request(2)
    pool.answer(worker)
    assert pool.sends_to(1) == [[1], protocol.STOP]
    assert len(pool.intake.queue) == 1


def test_a_withdrawn_worker_takes_nothing():
    pool = Pool()
    worker = pool.worker(1)
    pool.dispatcher.withdraw(worker.key)
    pool.request(1)
    assert pool.sent == [] and len(pool.intake.queue) == 1


def test_the_rollout_takes_a_free_worker_out_to_reload_it():
    pool = Pool()
    worker = pool.worker(1)
    pool.worker(2, local=False)
    pool.rollout.begin(2, [0], "/src")
    pool.dispatcher.reload_next()
    assert pool.sends_to(1) == [protocol.RELOAD] and worker.state == WorkerState.RELOADING
    assert pool.rollout.switching == worker.key
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


def test_a_batch_that_cannot_be_sent_goes_back_first_in_the_queue_in_order():
    pool = Pool(batching=BatchPolicy(max_rows=8))
    busy = pool.worker(1, batching=True)
    pool.request(0)
    for request_id in (1, 2, 3):
        pool.request(request_id)
    pool.unreachable.add(1)
    pool.answer(busy)
    assert pool.lost == [1]
    pool.worker(2, batching=True)
    assert pool.sends_to(2) == [[1, 2, 3]]


def test_a_quarantined_request_is_refused_without_being_sent():
    pool = Pool()
    pool.worker(1)
    killer = pool.request(7)
    pool.quarantine.killed(killer.client, killer.frames)
    pool.answer(next(iter(pool.workers.values())))
    pool.request(7, client=b"other")
    assert pool.sends_to(1) == [[7]]
    assert pool.replies.errors() == {7: "worker_failed"}


def test_a_request_held_for_company_is_released_when_due():
    pool = Pool(batching=BatchPolicy(max_rows=4, wait=0.02))
    pool.worker(1, batching=True)
    pool.request(1)
    pool.request(2)
    assert pool.sent == [] and pool.dispatcher.wake_at is not None
    pool.dispatcher.wake(pool.dispatcher.wake_at - 0.001)  # not yet
    assert pool.sent == []
    time.sleep(0.03)
    pool.dispatcher.wake(time.monotonic())
    assert pool.sends_to(1) == [[1, 2]] and pool.dispatcher.wake_at is None


def test_a_remote_worker_is_never_held_for_a_batch():
    pool = Pool(batching=BatchPolicy(max_rows=4, wait=60.0))
    pool.worker(1, batching=True, local=False)
    pool.request(1)
    assert pool.sends_to(1) == [[1]]


# Recovery.


def test_a_lost_request_is_retried_once_alone_then_fails():
    pool = Pool()
    second, first = pool.worker(2), pool.worker(1)  # the request goes to the last one freed
    pending = pool.request(9)
    pool.recovery.lose(first.key, "test")
    assert len(pool.intake.queue) == 1  # queued first, for the router's next drain
    pool.dispatcher.drain()
    assert pool.sends_to(2) == [[9]] and pending.solo and pending.attempts == MAX_ATTEMPTS
    pool.recovery.lose(second.key, "test")
    assert pool.replies.errors() == {9: "worker_failed"}
    assert pool.lost == [1, 2] and pool.workers == {}
    assert pool.quarantine.refusal(b"other", pending.frames) is not None  # proven: it killed twice


def test_a_request_whose_workers_were_both_sigkilled_fails_but_is_not_quarantined():
    pool = Pool()
    pool.worker(2, token="b")
    pool.worker(1, token="a")  # freed last: the request goes to it
    pending = pool.request(9)
    pool.recovery.worker_exited("a", "was killed by SIGKILL", killed=True)
    assert pool.sends_to(2) == [[9]]
    pool.recovery.worker_exited("b", "was killed by SIGKILL", killed=True)
    assert pool.replies.errors() == {9: "worker_failed"}
    assert not pool.quarantine and pool.quarantine.refusal(b"other", pending.frames) is None


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
    pool = Pool(batching=BatchPolicy(max_rows=8))
    worker = running_a_batch(pool, b"a", b"b")
    pool.recovery.lose(worker.key, "test")
    spare = pool.worker(2, batching=True)
    assert pool.sends_to(2) == [[1]]
    pool.answer(spare)
    assert pool.sends_to(2) == [[1], [2]]  # alone, in the order they had
    assert not pool.quarantine


def test_a_lost_batch_of_one_client_blames_it_for_nothing():
    pool = Pool(batching=BatchPolicy(max_rows=8))
    worker = running_a_batch(pool, b"c", b"c")
    pool.recovery.lose(worker.key, "test")
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
        pending = pool.request(request_id, client=b"innocent")
        pool.recovery.lose(running().key, "killed from outside")
        pool.dispatcher.drain()
        pool.answer(running())
        assert pending.attempts == MAX_ATTEMPTS
    assert pool.replies.errors() == {} and not pool.quarantine
    for number in range(3):
        assert pool.quarantine.refusal(b"killer", [f"{number}".encode()]) is None
        pool.quarantine.killed(b"killer", [protocol.encode_request(number, [f"killer {number}"])[1]])
        pool.quarantine.killed(b"killer", [protocol.encode_request(number + 9, [f"killer {number}"])[1]])
    assert "3 different requests" in pool.quarantine.refusal(b"killer", [b"anything"])
    assert pool.quarantine.refusal(b"innocent", [b"anything"]) is None


def test_a_lost_free_worker_is_taken_off_the_free_list():
    pool = Pool()
    worker = pool.worker(1)
    pool.recovery.lose(worker.key, "gone", asked=True)
    pool.request(1)
    assert pool.sent == [] and pool.lost == [1]
    pool.recovery.lose(worker.key, "again")  # already forgotten: nothing happens
    assert pool.lost == [1]


def test_a_request_past_the_timeout_is_answered_and_its_worker_given_up():
    pool = Pool(request_timeout=0.5)
    worker = pool.worker(1)
    pending = pool.request(4)
    assert not pool.recovery.overdue(worker, worker.busy_since + 0.4)
    assert pool.recovery.overdue(worker, worker.busy_since + 0.6)
    pool.recovery.time_out(worker)
    assert pool.replies.errors() == {4: "request_timeout"} and pool.lost == [1]
    assert pool.quarantine.refusal(b"other", pending.frames) is not None


def test_a_batch_past_the_timeout_is_retried_request_by_request():
    pool = Pool(batching=BatchPolicy(max_rows=8), request_timeout=0.5)
    worker = running_a_batch(pool, b"c", b"c")
    pool.recovery.time_out(worker)
    assert pool.replies.errors() == {} and pool.lost == [1]
    assert [p.solo for p in pool.intake.queue.take_all()] == [True, True]


def test_what_is_left_of_a_partly_answered_batch_past_the_timeout_is_retried_blaming_no_one():
    """A worker answers a batch's requests as their passes end; the one left when the batch
    runs out of time spent it waiting behind the others."""
    pool = Pool(batching=BatchPolicy(max_rows=8), request_timeout=0.5)
    worker = running_a_batch(pool, b"a", b"b")
    worker.inflight.pop(0)  # the first request's reply came (Router._reply)
    pool.recovery.time_out(worker)
    assert pool.replies.errors() == {} and pool.lost == [1] and not pool.quarantine
    assert [p.solo for p in pool.intake.queue.take_all()] == [True]


def test_an_idle_worker_is_never_overdue():
    pool = Pool(request_timeout=0.5)
    worker = pool.worker(1)
    assert not pool.recovery.overdue(worker, time.monotonic() + 60)
    assert not Pool().recovery.overdue(worker, time.monotonic() + 60)  # no timeout at all


def test_an_exited_process_loses_only_the_local_workers_with_its_token():
    pool = Pool()
    pool.worker(1, token="t1")
    pool.worker(2, token="t2")
    pool.worker(3, local=False)
    pool.recovery.worker_exited("t1", "exited", asked=True)
    assert sorted(w.pid for w in pool.workers.values()) == [2, 3] and pool.lost == [1]


def test_fail_all_answers_queued_and_in_flight_requests():
    pool = Pool()
    worker = pool.worker(1)
    pool.request(1)
    pool.request(2)
    pool.recovery.fail_all("shutting_down", "bye")
    assert pool.replies.errors() == {1: "shutting_down", 2: "shutting_down"}
    assert worker.inflight == [] and len(pool.intake.queue) == 0
