"""The warm template's side of its socket, in a template forked from this process: an order it
must refuse is answered with the reason, and one it cannot even answer ends it."""

from __future__ import annotations

import json
import logging
import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from workerpool.worker import template
from workerpool.worker.spec import ModelSpec, WorkerSpec

SPEC = WorkerSpec(models=[ModelSpec(name="m", path="/m.bpk")], backend="ipc:///b").to_data()


class Template:
    """A template forked from the test, and the supervisor's end of its socket."""

    def __init__(self, log: Path) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            self.sock.close()
            template.log.addHandler(logging.FileHandler(log))
            template.run(theirs, os.getppid())  # never returns
        theirs.close()
        self.sock.settimeout(30)
        assert self.ask(None) == {"ready": True}

    def ask(self, order: object, fds: tuple[int, ...] = ()) -> object:
        """Send ``order`` (JSON, or bytes as they are) and return the reply; None: no order."""
        if order is not None:
            data = order if isinstance(order, bytes) else json.dumps(order).encode()
            socket.send_fds(self.sock, [data], list(fds))
        try:
            reply = self.sock.recv(4096)
        except ConnectionResetError:  # it ended with the order unread
            return None
        return json.loads(reply) if reply else None

    def exit_code(self) -> int:
        """Close the supervisor's end and wait for the template to exit."""
        self.sock.close()
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


@pytest.fixture
def forked(tmp_path) -> Iterator[Template]:
    started = Template(tmp_path / "template.log")
    yield started
    if started.sock.fileno() != -1:
        started.exit_code()


@pytest.mark.parametrize(("order", "reason"), [
    ({"id": 1, "spec": {**SPEC, "load": "borrow"}, "token": "t"}, "load: 'borrow' is not one of"),
    ({"id": 2, "spec": {**SPEC, "heartbeat": "2"}, "token": "t"}, "heartbeat: str where float"),
    ({"id": 3, "spec": ["/m.bpk"], "token": "t"}, "a worker spec is a JSON object, not list"),
    ({"id": 4, "spec": SPEC, "token": 7}, "its token is not a string"),
    ({"id": 5, "spec": SPEC, "token": "t" * (template.MAX_TOKEN + 1)}, "its token is not a string"),
    ({"id": 6, "argv": ["/m.bpk"], "token": "t"}, "its keys are ['argv', 'id', 'token']"),
    ({"id": 7, "spec": {**SPEC, "backend": None, "link_fd": 5, "ready_fd": 6}, "token": "t"},
     "its spec names two descriptors"),
    ({"id": 8, "spec": {**SPEC, "backend": None, "link_fd": 5}, "token": "t"},
     "the descriptor its spec names did not come with it"),
], ids=["load", "generation", "spec", "token type", "token size", "keys", "two descriptors", "no link"])
def test_an_order_that_is_no_worker_is_refused_with_the_reason(forked, order, reason):
    reply = forked.ask(order)
    assert isinstance(reply, dict) and set(reply) == {"id", "error"} and reply["id"] == order["id"]
    assert reply["error"].startswith(f"the template refused the order: {reason}")
    assert forked.ask({"id": 10, "spec": SPEC, "token": "t"}, fds=(0, 1, 2))["id"] == 10  # still serving
    assert forked.exit_code() == 0


def test_an_order_with_more_than_one_descriptor_is_refused(forked):
    r, w = os.pipe()
    try:
        reply = forked.ask({"id": 9, "spec": SPEC, "token": "t"}, fds=(r, w))
    finally:
        os.close(r)
        os.close(w)
    assert reply == {"id": 9, "error": "the template refused the order: more than one descriptor came with it"}


@pytest.mark.parametrize("order", [b"x" * (template.MAX_ORDER_BYTES + 1), b"not json", b"[" * 30000,
                                   {"spec": SPEC}], ids=["too large", "not json", "too deep", "no id"])
def test_an_order_too_large_or_without_an_id_ends_the_template_unanswered(forked, order, tmp_path):
    assert forked.ask(order) is None
    assert forked.exit_code() == 1
    said = (tmp_path / "template.log").read_text()
    assert "exiting" in said and "Traceback" not in said  # told, not failed


def test_a_supervisor_that_leaves_without_reading_ends_the_template_quietly(tmp_path):
    """A pool refused at start closes its end with the template's "ready" unread: the template
    reads that as a reset, not an end of file, and must take it for the supervisor gone."""
    log = tmp_path / "template.log"
    sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        sock.close()
        template.log.addHandler(logging.FileHandler(log))
        template.run(theirs, os.getppid())  # never returns
    theirs.close()
    assert select.select([sock], [], [], 30)[0]  # "ready" has come, and stays unread
    sock.close()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert "Traceback" not in log.read_text()
