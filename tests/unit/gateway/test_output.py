"""A connection's output: buffers queued as given, written with one call, cut where a write stops."""

from __future__ import annotations

import socket

import pytest

from workerpool.gateway.output import Output


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_a_head_and_a_body_go_in_one_write_without_being_joined(pair):
    ours, theirs = pair
    output = Output()
    body = memoryview(b"x" * 100)[10:]
    output.add(b"HEAD\r\n\r\n", body, b"")
    assert len(output) == 98
    assert output.write(ours) == 98
    assert not output
    assert theirs.recv(200) == b"HEAD\r\n\r\n" + b"x" * 90


def test_what_the_socket_does_not_take_stays_queued_in_order(pair):
    ours, theirs = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    output = Output()
    chunks = [bytes([n]) * 50_000 for n in range(1, 6)]
    output.add(*chunks)
    received = bytearray()
    while output:
        try:
            output.write(ours)
        except BlockingIOError:
            received += theirs.recv(1 << 20)
    theirs.settimeout(1)
    while len(received) < 250_000:
        received += theirs.recv(1 << 20)
    assert bytes(received) == b"".join(chunks)


def test_a_closed_peer_is_an_error_not_a_silent_loss(pair):
    ours, theirs = pair
    theirs.close()
    output = Output()
    output.add(b"late")
    with pytest.raises(OSError):
        output.write(ours)
    assert len(output) == 4


def test_tls_is_written_the_first_chunk_at_a_time_the_same_bytes_on_every_try():
    output = Output()
    output.add(b"ab", memoryview(b"cdef"), bytearray(b"g"))
    assert output._first(5) == b"abcde"
    assert output._first(100) == b"abcdefg"
