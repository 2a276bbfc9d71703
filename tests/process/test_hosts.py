"""Worker hosts over TCP (on loopback): a router with no local workers, hosts joining and leaving."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq
from support.keys import CurveKeys
from support.models import SLOW
from support.processes import slow_request
from support.server import Host, Server, refused_at_start
from support.sockets import dealer, free_backend
from support.status import busy_pids, registered

import workerpool
from workerpool import models, security
from workerpool.weights.publish import publish

WIDTH = 64


@pytest.fixture(scope="module")
def host_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hosts") / "model.bpk"
    models.generate_mlp(path, 256 * 1024, width=WIDTH, seed=3)
    return path


def ready_pids(status: dict) -> set[int]:
    return {w["pid"] for w in registered(status)}


def worker_pids(host: Host) -> set[int]:
    return set(host.worker_pids())


def results(endpoint: str, count: int, *, clients: int = 4, **options) -> list[workerpool.Result]:
    """``count`` results from ``clients`` clients sending at once: the router hands a request
    to the most recently freed worker, so one client alone would be served by one worker."""
    x = np.ones((1, WIDTH), np.float32)
    answered: list[workerpool.Result] = []
    failures: list[BaseException] = []

    together = threading.Barrier(clients, timeout=30)  # each client's first request at once: spread over free workers

    def send(share: int) -> None:
        try:
            with workerpool.Client(endpoint, timeout=10, **options) as client:
                client.info()  # connected before the others start
                together.wait()
                answered.extend(client.request(x) for _ in range(share))
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=send, args=(count // clients + (i < count % clients),))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    return answered


def answering_pids(endpoint: str, expected: set[int], *, per_round: int = 20, rounds: int = 10,
                   **options) -> set[int]:
    """The workers that answered rounds of ``per_round`` requests, sent until every ``expected``
    one has answered (or ``rounds`` ran): on a busy machine a worker may go a round without a turn.
    What is returned is every worker that answered, so a stranger among them still shows."""
    answered: set[int] = set()
    for _ in range(rounds):
        answered |= {result.worker_pid for result in results(endpoint, per_round, **options)}
        if answered >= expected:
            break
    return answered


def test_two_hosts_serve_and_one_host_dying_hangs_nothing(host_model):
    backend = free_backend()
    with Server(host_model, "--backend", backend, workers=0) as router, \
            Host(host_model, backend, workers=2) as first, Host(host_model, backend, workers=1) as second:
        router.wait_for(lambda s: len(ready_pids(s)) == 3)
        first_pids, second_pids = worker_pids(first), worker_pids(second)
        assert ready_pids(router.status()) == first_pids | second_pids
        assert answering_pids(router.endpoint, first_pids | second_pids) == first_pids | second_pids

        outcomes: list[str] = []

        def load() -> None:
            x = np.ones((1, WIDTH), np.float32)
            with workerpool.Client(router.endpoint, timeout=15, retries=0) as client:
                for _ in range(60):
                    try:
                        outcomes.append(f"ok {client.request(x).worker_pid}")
                    except workerpool.RemoteError as exc:
                        outcomes.append(type(exc).__name__)

        thread = threading.Thread(target=load)
        thread.start()
        first.proc.kill()  # the whole host goes: its supervisor, then (orphaned) its workers
        thread.join(60)
        assert not thread.is_alive(), "a request hung after a host died"
        assert len(outcomes) == 60
        assert all(o.startswith("ok") or o == "WorkerFailed" for o in outcomes), outcomes
        router.wait_for(lambda s: ready_pids(s) == second_pids, timeout=20)
        assert answering_pids(router.endpoint, second_pids) == second_pids

        with Host(host_model, backend, workers=2) as again:
            router.wait_for(lambda s: len(ready_pids(s)) == 3)
            assert worker_pids(again) <= answering_pids(router.endpoint, worker_pids(again))


def test_a_request_lost_with_its_dying_host_is_answered_and_identical_ones_are_not_refused(host_model):
    """A request's worker is killed, its retry goes to a sibling on the same host, and the host
    goes away with the sibling: two losses, neither the request's doing. It is answered, and an
    identical request is served by another host rather than refused as a killer."""
    backend = free_backend()
    with Server(host_model, *SLOW, "--backend", backend, workers=0) as router, \
            Host(host_model, backend, *SLOW, workers=2) as dying:
        router.wait_for(lambda s: len(ready_pids(s)) == 2)
        slow = slow_request(router.endpoint, 2.0)
        first = busy_pids(router.wait_for(busy_pids))[0]
        os.kill(first, signal.SIGKILL)
        status = router.wait_for(lambda s: [p for p in busy_pids(s) if p != first])
        sibling = next(p for p in busy_pids(status) if p != first)
        assert sibling in worker_pids(dying)  # the retry runs on the host about to go
        dying.proc.kill()  # the whole host goes: its supervisor, then (orphaned) its workers
        with pytest.raises(workerpool.WorkerFailed, match="twice"):
            slow.join(20)
        log = router.log()
        assert re.search(rf"worker {first} lost \(.*\) with a request in flight; retrying it", log)
        assert re.search(rf"worker {sibling} lost \(.*\); its request already failed once", log)
        with Host(host_model, backend, *SLOW, workers=1) as spare:
            router.wait_for(lambda s: ready_pids(s) == worker_pids(spare))
            result = slow_request(router.endpoint, 2.0).join(20)  # identical: same model, method and data
            assert result.worker_pid in worker_pids(spare)
            assert np.array_equal(result.outputs, np.full((1, 2), -4.0, np.float32))


def test_hosts_rejoin_a_restarted_router(host_model):
    backend = free_backend()
    with Host(host_model, backend, workers=2) as host:
        pids = worker_pids(host)
        with Server(host_model, "--backend", backend, workers=0) as router:
            router.wait_for(lambda s: ready_pids(s) == pids)
            assert answering_pids(router.endpoint, pids) == pids
        with Server(host_model, "--backend", backend, workers=0) as restarted:
            restarted.wait_for(lambda s: ready_pids(s) == pids, timeout=20)
            assert answering_pids(restarted.endpoint, pids) == pids
        assert worker_pids(host) == pids  # the same workers, reconnected, not restarted


def test_host_with_a_model_that_does_not_fit_is_refused(host_model, tmp_path):
    other = tmp_path / "wide.bpk"
    models.generate_mlp(other, 256 * 1024, width=WIDTH * 2, seed=3)
    backend = free_backend()
    with Server(host_model, "--backend", backend, workers=0) as router, Host(other, backend, workers=1) as host:
        router.wait_for(lambda s: "refused worker" in router.log(), timeout=20)
        assert ready_pids(router.status()) == set()
    assert "its model does not fit: inputs are <f4 [None, 128], the served model's <f4 [None, 64]" in router.log()
    assert "the router refuses this worker" in host.log()


def test_curve_serves_allowed_keys_only(host_model, tmp_path):
    keys = CurveKeys(tmp_path / "keys")
    alice_secret, host_secret = keys.client("alice"), keys.host("host")
    _, mallory_secret = security.generate(str(tmp_path / "strangers"), "mallory")
    server_public = keys.server_public
    backend = free_backend()
    with Server(host_model, "--backend", backend, *keys.serve_args(), workers=0) as router, \
            Host(host_model, backend, *keys.host_args(host_secret), workers=1) as host:
        router.wait_for(lambda s: len(ready_pids(s)) == 1)
        alice = workerpool.ClientKeys(alice_secret, server_public)
        assert answering_pids(router.endpoint, worker_pids(host), keys=alice) == worker_pids(host)
        x = np.ones((1, WIDTH), np.float32)
        for keys_used, why in ((None, "the server requires CURVE keys"),
                               (workerpool.ClientKeys(mallory_secret, server_public),
                                "the server refused this client's key")):
            with workerpool.Client(router.endpoint, connect_timeout=1, keys=keys_used) as client, \
                    pytest.raises(workerpool.Unreachable, match=why):
                client.infer(x)
        assert answering_pids(router.endpoint, worker_pids(host), keys=alice) == worker_pids(host)


def test_each_host_reloads_its_own_copy_and_status_shows_mixed_generations(host_model, tmp_path):
    copy_a, copy_b = tmp_path / "a.bpk", tmp_path / "b.bpk"
    for copy in (copy_a, copy_b):
        copy.write_bytes(host_model.read_bytes())
    new = tmp_path / "new.bpk"
    models.generate_mlp(new, 256 * 1024, width=WIDTH, seed=4)
    backend = free_backend()
    with Server(host_model, "--backend", backend, workers=0) as router, \
            Host(copy_a, backend, workers=2) as host_a, Host(copy_b, backend, workers=1) as host_b:
        router.wait_for(lambda s: len(ready_pids(s)) == 3)
        b_pids = worker_pids(host_b)
        publish(new, copy_a)
        status = router.wait_for(lambda s: sorted(w["generation"] for w in registered(s)) == [1, 2, 2])
        serving = registered(status)
        assert {w["pid"] for w in serving if w["generation"] == 1} == b_pids
        assert all(w["host"] for w in status["workers"])
        seen: set[tuple[bool, int | None]] = set()
        for _ in range(10):  # a client that has seen generation 2 never gets 1: new clients each round
            seen |= {(r.worker_pid in b_pids, r.generation) for r in results(router.endpoint, 8, clients=8)}
            if seen >= {(True, 1), (False, 2)}:
                break
        assert seen == {(True, 1), (False, 2)}
    assert f"started a worker on generation 2 of {copy_a.stem} to replace one on generation 1 of {copy_a.stem}" \
        in host_a.log()


def test_control_endpoint_must_be_local(host_model):
    refused_at_start(Server(host_model, "--control", "tcp://0.0.0.0:5999"), "the control socket is an ipc://PATH")


def test_garbage_on_the_worker_endpoint_hurts_nobody(host_model, context: zmq.Context):
    """The TCP backend is reachable from outside: malformed worker messages are ignored."""
    backend = free_backend()
    with Server(host_model, "--backend", backend, workers=1) as router:
        with dealer(context, backend) as impostor:
            for payload in (b'{"pid": 1e400, "generation": 1, "host": "x", "model": "mlp"}',
                            b"[" * 200_000, b"not json", b'{"pid": "1"}'):
                impostor.send_multipart([b"READY", payload])
            impostor.send_multipart([b"RELOADED", b"{}"])
            impostor.send_multipart([b"REP", b"someone", b"ok", b"{}"])
            router.wait_for(lambda s: "malformed READY" in router.log())
        assert answering_pids(router.endpoint, set(router.worker_pids())) == set(router.worker_pids())
        assert router.proc.poll() is None and "Traceback" not in router.log()
