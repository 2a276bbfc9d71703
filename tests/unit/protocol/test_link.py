"""The local link: its records (pure) and its ends over a real SOCK_SEQPACKET socket pair."""

from __future__ import annotations

import resource
import select
import struct
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from workerpool.protocol import link
from workerpool.protocol.link import Link, LinkClosed
from workerpool.protocol.records import (
    RECORD_BYTES,
    Frame,
    LinkError,
    frames_of,
    read_table,
    records,
)


@pytest.fixture
def ends() -> Iterator[tuple[Link, Link]]:
    router, worker = link.pair()
    router.setblocking(False)
    ends = Link(router, max_frames=8), Link(worker)
    yield ends
    for end in ends:
        end.close()


def joined(record: list) -> bytes:
    return b"".join(bytes(memoryview(part).cast("B")) for part in record)


# Records, without a socket.


def test_a_message_is_one_record_of_a_table_and_its_frames_as_given():
    body = np.arange(6, dtype=np.float32).reshape(2, 3)
    frame = zmq.Frame(b"zz")
    [record] = records([b"REQ", b"", body, frame, Frame(memoryview(b"abc"))])
    assert record[0] == struct.pack("<6I", 5, 3, 0, 24, 2, 3)
    assert record[1] == b"REQ"
    data = memoryview(joined(record))
    lengths, start = read_table(data)
    assert lengths == [3, 0, 24, 2, 3] and start == 24
    frames = frames_of(data[start:], lengths)
    assert [frame.bytes for frame in frames] == [b"REQ", b"", body.tobytes(), b"zz", b"abc"]
    assert bytes(frames[4]) == b"abc" and len(frames[2]) == 24


def test_a_long_message_is_cut_into_records_that_join_into_it():
    frames = [b"x" * 10, bytes(range(256)) * 40, b"y" * 7]
    cut = records(frames, record_bytes=1000)
    assert [len(joined(record)) for record in cut] == [1000] * 10 + [10 * 1 + 10240 + 7 + 16 - 10000]
    data = memoryview(b"".join(joined(record) for record in cut))
    lengths, start = read_table(data)
    assert [frame.bytes for frame in frames_of(data[start:], lengths)] == frames


@pytest.mark.parametrize(("record", "reason"), [
    (b"\x01\x00", "shorter than a frame count"),
    (struct.pack("<I", 0), "a message of no frames"),
    (struct.pack("<I", 5), "a table of 5 frames is longer than its record"),
    (struct.pack("<3I", 9, 1, 1), "a message of 9 frames, over the 8 taken"),
])
def test_a_record_that_is_no_table_is_refused(record, reason):
    with pytest.raises(LinkError, match=reason):
        read_table(memoryview(record), max_frames=8)


def test_a_message_whose_table_cannot_fit_a_record_is_not_sent():
    with pytest.raises(LinkError, match="does not fit a record"):
        records([b""] * 300, record_bytes=1024)


# The link's ends.


def test_a_message_crosses_whole_both_ways(ends):
    router, worker = ends
    assert router.receive() is None  # nothing yet: a non-blocking end does not wait
    assert router.send([b"REQUEST", b"m", np.ones(4, np.float32)])
    assert [frame.bytes for frame in worker.receive()] == [b"REQUEST", b"m", np.ones(4, np.float32).tobytes()]
    worker.send([b"REPLY", b"client", b"ok"])
    assert [frame.bytes for frame in router.receive()] == [b"REPLY", b"client", b"ok"]


def test_frames_received_stay_valid_after_the_shared_buffer_is_read_into_again(ends):
    router, worker = ends
    worker.send([b"first"])
    worker.send([b"second"])
    first = router.receive()
    second = router.receive()
    assert (first[0].bytes, second[0].bytes) == (b"first", b"second")


def test_a_message_larger_than_the_socket_takes_waits_and_goes_in_order(ends):
    router, worker = ends
    large = np.random.default_rng(0).integers(0, 255, 24 * 1024 * 1024, dtype=np.uint8)
    sent = router.send([b"BATCH", large])
    assert not sent  # the kernel holds a few MiB: the rest waits in the router's end
    router.send([b"after"])
    received: list = []
    reader = threading.Thread(target=lambda: received.extend([worker.receive(), worker.receive()]))
    reader.start()
    while not router.flush():
        select.select([], [router.sock], [], 1)  # writable again once the worker has read
    reader.join(10)
    assert not reader.is_alive()
    assert received[0][1].buffer == memoryview(large.tobytes())
    assert received[1][0].bytes == b"after"


def test_a_large_message_arrives_across_reads_of_a_non_blocking_end(ends):
    router, worker = ends
    payload = bytes(range(256)) * (3 * RECORD_BYTES // 256)
    done = threading.Thread(target=worker.send, args=([b"REPLY", payload],))
    done.start()
    message = None
    while message is None:
        assert select.select([router.sock], [], [], 10)[0], "the rest of the message never came"
        message = router.receive()
    done.join(10)
    assert message[1].bytes == payload


def test_the_end_of_the_link_is_seen_by_both_ends(ends):
    router, worker = ends
    worker.close()
    with pytest.raises(LinkClosed):
        router.receive()
    with pytest.raises(OSError):
        router.send([b"HEARTBEAT"])


def test_a_record_longer_than_the_reader_takes_is_refused():
    router, worker = link.pair()
    with router, worker:
        reader = Link(router, memoryview(bytearray(64)))
        worker.send(struct.pack("<2I", 1, 100) + b"x" * 100)
        with pytest.raises(LinkError, match="longer than the 64 bytes"):
            reader.receive()


def test_a_record_longer_than_its_table_declares_is_refused():
    router, worker = link.pair()
    with router, worker:
        worker.send(struct.pack("<2I", 1, 2) + b"abc")
        with pytest.raises(LinkError, match="more than its table's"):
            Link(router).receive()


def test_a_table_that_declares_gigabytes_allocates_at_most_16_mib_before_they_come(ends):
    router, worker = ends
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    worker.sock.send(struct.pack("<2I", 1, 0xFFFFFFFF) + b"12345678")
    assert router.receive() is None  # the rest never comes: nothing is waited for, nothing held
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 64 * 1024  # KiB: not 4 GiB


def test_records_past_what_their_table_declares_are_refused(ends):
    router, worker = ends
    worker.sock.send(struct.pack("<2I", 1, 300 * 1024) + b"x" * (200 * 1024))
    worker.sock.send(b"y" * (200 * 1024))
    with pytest.raises(LinkError, match="records past their table"):
        while router.receive() is None:
            assert select.select([router.sock], [], [], 10)[0], "no more records came"


def test_an_empty_record_is_refused_and_not_taken_for_the_end_of_the_link(ends):
    router, worker = ends
    worker.sock.send(b"")
    with pytest.raises(LinkError, match="an empty record"):
        router.receive()
    worker.send([b"HB"])
    assert router.receive()[0].bytes == b"HB"
