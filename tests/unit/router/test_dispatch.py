"""The router's core without a socket: events in (requests, workers' messages, losses, time),
what it would send read from its outbox. Dispatch, batching, recovery, quarantine and rollout
are driven as the router's loop drives them, and nothing here fakes a socket.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import zmq

from workerpool.codecs.http_call import KSERVE, request_frames
from workerpool.protocol import messages as protocol
from workerpool.router.batching import BatchPolicy
from workerpool.router.core import Router
from workerpool.router.intake import Pending
from workerpool.router.outbox import CLIENT, WORKER, carries_requests
from workerpool.router.recovery import MAX_ATTEMPTS
from workerpool.router.registry import WorkerRecord, WorkerState

SIGNATURE = {"inputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}],
             "outputs": [{"name": None, "dtype": "<f4", "shape": [None, 4]}]}


class Pool:
    """A router core, the events it reported, and what it sent: the outbox is emptied after
    each event, as the router's shell does; a send to an ``unreachable`` worker fails there."""

    def __init__(self, *, batching: BatchPolicy | None = None, request_timeout: float | None = None) -> None:
        self.sent: list[tuple[int, list[Any]]] = []  # (pid, frames) of each send that left
        self.replies: list[list[Any]] = []  # what clients were sent
        self.unreachable: set[int] = set()
        self.lost: list[int] = []
        self.router = Router(self, max_queue=64, max_message_size=1 << 20, signature=SIGNATURE,
                             request_timeout=request_timeout, batching=batching)
        self.workers = self.router._workers
        self.intake, self.dispatcher, self.recovery = self.router.intake, self.router.dispatcher, self.router.recovery
        self.rollout, self.quarantine, self.stats = self.router.rollout, self.router.quarantine, self.router.stats

    # The events the router tells its owner.

    def worker_ready(self, worker: WorkerRecord) -> None:
        pass

    def worker_lost(self, worker: WorkerRecord, why: str) -> None:
        self.lost.append(worker.pid)

    def started_here(self, token: str | None) -> bool:
        return True

    def reload_failed(self, worker: WorkerRecord, why: str) -> None:
        pass

    def flush(self) -> None:
        """What the shell does after each event."""
        while (send := self.router.outbox.take()) is not None:
            kind, key, frames = send
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

    def worker(self, pid: int, *, batching: bool = False, local: bool = True, token: str | None = None,
               generation: int = 1) -> WorkerRecord:
        """A worker's READY: registered, and free."""
        ready = {"pid": pid, "host": "h", "generation": generation, "model": "m", "token": token,
                 "batching": batching, **SIGNATURE}
        self.router.from_worker(local, [zmq.Frame(f"w{pid}".encode()), zmq.Frame(protocol.READY),
                                        zmq.Frame(json.dumps(ready).encode())])
        self.flush()
        return self.workers[(local, f"w{pid}".encode())]

    def request(self, request_id: int, *, client: bytes = b"c", rows: int = 1) -> Pending:
        """A request arriving on the client socket: dispatched at once, or queued."""
        frames = protocol.encode_request(request_id, np.zeros((rows, 4), np.float32))[1:]
        self.router.intake.receive([zmq.Frame(client), zmq.Frame(b""), *map(zmq.Frame, frames)])
        self.flush()
        held = [p for w in self.workers.values() for p in w.inflight] + list(self.intake.queue._everything())
        return next(p for p in held if p.id == request_id)

    def answer(self, worker: WorkerRecord, status: bytes = b"ok") -> None:
        """``worker`` answers everything it holds, in order."""
        for pending in list(worker.inflight):
            request_id = pending.id
            reply = protocol.encode_reply(request_id) if status == b"ok" else \
                protocol.encode_error(request_id, status.decode(), "failed")
            self.router.from_worker(worker.local, [zmq.Frame(worker.address), zmq.Frame(protocol.REPLY),
                                                   zmq.Frame(pending.client), zmq.Frame(status),
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


def _ids(frames: list[Any]) -> list[int] | bytes:
    if frames[0] == protocol.REQUEST:
        return [protocol.decode_header(frames[3])["id"]]
    if frames[0] == protocol.BATCH:
        stride = int(frames[1])
        return [protocol.decode_header(frames[i + 2])["id"] for i in range(2, len(frames), stride)]
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
    pool.answer(broken, b"internal")  # freed last, yet not the next to take a request
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
    pool.router.begin_rollout(2, [0], "/src")
    pool.flush()
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


def test_a_batch_that_cannot_be_sent_goes_back_first_in_the_queue_as_it_was():
    """It never reached the worker: no attempt counts against it, and it stays one batch."""
    pool = Pool(batching=BatchPolicy(max_rows=8))
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
    assert all(pending.attempts == 1 and not pending.solo for pending in spare.inflight)


def test_requests_sent_to_workers_gone_one_after_another_are_blamed_for_nothing():
    """A host that dies takes its workers with it; each send to one fails in turn. A request
    that never ran is no killer, and identical requests are still served."""
    pool = Pool()
    for pid in (1, 2, 3, 4):
        pool.worker(pid)
    pool.unreachable.update({2, 3, 4})  # the most recently freed: tried first
    pending = pool.request(5)
    assert pool.lost == [4, 3, 2] and pool.sends_to(1) == [[5]] and pending.attempts == 1
    assert not pool.quarantine and pool.errors() == {}


def test_a_quarantined_request_is_refused_without_being_sent():
    pool = Pool()
    pool.worker(1)
    killer = pool.request(7)
    pool.quarantine.killed(killer.client, killer.frames)
    pool.answer(next(iter(pool.workers.values())))
    pool.intake.receive([zmq.Frame(b"other"), zmq.Frame(b""), *map(zmq.Frame, protocol.encode_request(
        7, np.zeros((1, 4), np.float32))[1:])])
    pool.flush()
    assert pool.sends_to(1) == [[7]]
    assert pool.errors() == {7: "worker_failed"}


def test_a_request_held_for_company_is_released_when_due():
    pool = Pool(batching=BatchPolicy(max_rows=4, wait=0.02))
    pool.worker(1, batching=True)
    pool.request(1)
    pool.request(2)
    assert pool.sends_to(1) == [] and pool.router.wake_at is not None
    pool.dispatcher.wake(pool.router.wake_at - 0.001)  # not yet
    assert pool.router.outbox.take() is None
    time.sleep(0.03)
    pool.router.tick()
    pool.flush()
    assert pool.sends_to(1) == [[1, 2]] and pool.router.wake_at is None


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
    pool.lose(first)
    assert pool.sends_to(2) == [[9]] and pending.solo and pending.attempts == MAX_ATTEMPTS
    pool.lose(second)
    assert pool.errors() == {9: "worker_failed"}
    assert pool.lost == [1, 2] and pool.workers == {}
    assert pool.quarantine.refusal(b"other", pending.frames) is not None  # proven: it killed twice


def test_a_request_whose_workers_were_both_sigkilled_fails_but_is_not_quarantined():
    pool = Pool()
    pool.worker(2, token="b")
    pool.worker(1, token="a")  # freed last: the request goes to it
    pending = pool.request(9)
    pool.exited("a", "was killed by SIGKILL", killed=True)
    assert pool.sends_to(2) == [[9]]
    pool.exited("b", "was killed by SIGKILL", killed=True)
    assert pool.errors() == {9: "worker_failed"}
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
    pool.lose(worker)
    spare = pool.worker(2, batching=True)
    assert pool.sends_to(2) == [[1]]
    pool.answer(spare)
    assert pool.sends_to(2) == [[1], [2]]  # alone, in the order they had
    assert not pool.quarantine


def test_a_lost_batch_of_one_client_blames_it_for_nothing():
    pool = Pool(batching=BatchPolicy(max_rows=8))
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
        pending = pool.request(request_id, client=b"innocent")
        pool.lose(running(), "killed from outside")
        pool.answer(running())
        assert pending.attempts == MAX_ATTEMPTS
    assert pool.errors() == {} and not pool.quarantine
    for number in range(3):
        assert pool.quarantine.refusal(b"killer", [b"", f"{number}".encode()]) is None
        pool.quarantine.killed(b"killer", protocol.encode_request(number, [f"killer {number}"])[1:])
        pool.quarantine.killed(b"killer", protocol.encode_request(number + 9, [f"killer {number}"])[1:])
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
    pending = pool.request(4)
    assert not pool.recovery.overdue(worker, worker.busy_since + 0.4)
    assert pool.recovery.overdue(worker, worker.busy_since + 0.6)
    pool.recovery.time_out(worker)
    pool.flush()
    assert pool.errors() == {4: "request_timeout"} and pool.lost == [1]
    assert pool.quarantine.refusal(b"other", pending.frames) is not None


def test_a_batch_past_the_timeout_is_retried_request_by_request():
    pool = Pool(batching=BatchPolicy(max_rows=8), request_timeout=0.5)
    worker = running_a_batch(pool, b"c", b"c")
    pool.recovery.time_out(worker)
    pool.flush()
    assert pool.errors() == {} and pool.lost == [1]
    assert [p.solo for p in pool.intake.queue.take_all()] == [True, True]


def test_what_is_left_of_a_partly_answered_batch_past_the_timeout_is_retried_blaming_no_one():
    """A worker answers a batch's requests as their passes end; the one left when the batch
    runs out of time spent it waiting behind the others."""
    pool = Pool(batching=BatchPolicy(max_rows=8), request_timeout=0.5)
    worker = running_a_batch(pool, b"a", b"b")
    first = worker.inflight[0]
    pool.router.from_worker(True, [zmq.Frame(worker.address), zmq.Frame(protocol.REPLY), zmq.Frame(first.client),
                                   zmq.Frame(b"ok"), *map(zmq.Frame, protocol.encode_reply(1))])
    pool.recovery.time_out(worker)
    pool.flush()
    assert pool.errors() == {} and pool.lost == [1] and not pool.quarantine
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
    assert worker.inflight == [] and len(pool.intake.queue) == 0


# Doors and draining.


def test_http_requests_batch_by_count_and_never_with_requests_of_arrays():
    """The router cannot see an HTTP body: its requests share a pass by count, and the worker
    groups them by what it decodes; ZeroMQ requests of arrays batch among themselves."""
    pool = Pool(batching=BatchPolicy(max_rows=4))
    worker = pool.worker(1, batching=True)
    pool.request(0)
    lane = pool.intake.local_key + b"lane"
    for request_id in (1, 2, 3, 4, 5):
        frames = request_frames(request_id, KSERVE, "m", b"{}", head=None, deadline=None)
        pool.intake.admit_local(lane + bytes([request_id]), frames, 100)
    pool.request(6)
    pool.flush()
    assert len(pool.intake.queue) == 6
    for _ in range(3):
        pool.answer(worker)
    assert pool.sends_to(1) == [[0], [1, 2, 3, 4], [5], [6]]
    http = [frames for pid, frames in pool.sent if frames[0] == protocol.BATCH]
    assert all(frames[2].startswith(pool.intake.local_key) for frames in http)


def test_draining_answers_new_requests_and_runs_the_held_ones():
    pool = Pool()
    worker = pool.worker(1)
    pool.request(1)
    pool.request(2)
    pool.router.stop_accepting()
    pool.intake.receive([zmq.Frame(b"late"), zmq.Frame(b""), *map(zmq.Frame, protocol.encode_request(
        3, np.zeros((1, 4), np.float32))[1:])])
    pool.flush()
    assert pool.errors() == {3: "shutting_down"} and pool.router.unfinished == 2
    pool.answer(worker)
    pool.answer(worker)
    assert pool.router.unfinished == 0 and pool.sends_to(1) == [[1], [2]]
