"""The router-to-worker link as it is (a ZeroMQ ROUTER over ipc, a DEALER in the worker)
against a ``SOCK_SEQPACKET`` socket pair, the alternative issue [20] asked to measure.

A "router" process sends request-sized messages (a command, the client's id, a 150-byte
header, a 2 KiB body: the frames a one-row HTTP request crosses the link with) to a "worker"
process that echoes each back, and times round trips: one at a time (the latency a lone
request pays twice, there and back) and 32 in flight (the cost under load). The CPU both
processes spent, read from /proc, is divided by the messages. The two links alternate over the
rounds; medians are printed.

Over SEQPACKET a message is one ``sendmsg`` of all its frames (a length table, then the frames)
and one ``recvmsg``; no libzmq I/O thread is involved on either side.

    python3 scripts/link_bench.py [--rounds 5] [--messages 20000]
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable

import zmq
from benchlib.arguments import add_count, parser_for
from benchlib.cpu import process_cpu

FRAMES = [b"REQ", b"c" * 24, b"h" * 150, b"b" * 2048]
WINDOW = 32
LENGTHS = struct.Struct("<B")  # frame count; then a 4-byte length per frame


def pack(frames: list[bytes]) -> list[bytes]:
    return [LENGTHS.pack(len(frames)) + struct.pack(f"<{len(frames)}I", *map(len, frames)), *frames]


def unpack(data: bytes) -> list[bytes]:
    count = data[0]
    lengths = struct.unpack_from(f"<{count}I", data, 1)
    frames, offset = [], 1 + 4 * count
    for length in lengths:
        frames.append(data[offset:offset + length])
        offset += length
    return frames


def seqpacket_worker(sock: socket.socket) -> None:
    while True:
        data = sock.recv(65536)
        if not data:
            return
        frames = unpack(data)
        sock.sendmsg(pack(frames))


def zmq_worker(endpoint: str) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"w")
    dealer.connect(endpoint)
    dealer.send(b"READY")
    while True:
        frames = dealer.recv_multipart()
        if frames == [b"STOP"]:
            break
        dealer.send_multipart(frames)
    dealer.close(linger=0)
    context.term()


def drive(send: Callable[[], object], receive: Callable[[], object], messages: int, window: int) -> float:
    """Seconds for ``messages`` round trips, at most ``window`` in flight."""
    started = time.perf_counter()
    sent = received = 0
    while received < messages:
        while sent < messages and sent - received < window:
            send()
            sent += 1
        receive()
        received += 1
    return time.perf_counter() - started


def run_seqpacket(messages: int, window: int) -> tuple[float, float]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        seqpacket_worker(theirs)
        os._exit(0)
    theirs.close()
    before = process_cpu(os.getpid()) + process_cpu(pid)
    seconds = drive(lambda: ours.sendmsg(pack(FRAMES)), lambda: unpack(ours.recv(65536)), messages, window)
    cpu = process_cpu(os.getpid()) + process_cpu(pid) - before
    ours.close()
    os.waitpid(pid, 0)
    return seconds, cpu


def run_zmq(messages: int, window: int, directory: str) -> tuple[float, float]:
    endpoint = f"ipc://{directory}/link.sock"
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(endpoint)
    pid = os.fork()
    if pid == 0:
        router.close(linger=0)
        zmq_worker(endpoint)
        os._exit(0)
    address, _ = router.recv_multipart()
    before = process_cpu(os.getpid()) + process_cpu(pid)

    def send() -> None:
        router.send_multipart([address, *FRAMES], copy=True)

    seconds = drive(send, router.recv_multipart, messages, window)
    cpu = process_cpu(os.getpid()) + process_cpu(pid) - before
    router.send_multipart([address, b"STOP"])
    os.waitpid(pid, 0)
    router.close(linger=0)
    context.term()
    return seconds, cpu


def main() -> int:
    parser = parser_for(__doc__)
    add_count(parser, "--rounds", 5, "alternating rounds")
    add_count(parser, "--messages", 20000, "round trips per link, level and round")
    args = parser.parse_args()
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for round_number in range(args.rounds):
            links = [("zmq", lambda n, w: run_zmq(n, w, directory)), ("seqpacket", run_seqpacket)]
            if round_number % 2:
                links.reverse()
            for window in (1, WINDOW):
                for name, run in links:
                    results.setdefault((name, window), []).append(run(args.messages, window))
    print(f"{args.rounds} rounds of {args.messages} messages ({sum(map(len, FRAMES))} bytes in {len(FRAMES)} "
          f"frames), medians; load average {os.getloadavg()[0]:.2f} at the end\n")
    print("| link | in flight | round trip (µs) | messages/s | CPU per message, both processes (µs) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (name, window), runs in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        seconds = statistics.median(s for s, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"| {name} | {window} | {seconds / args.messages * 1e6 * window:.1f} | "
              f"{args.messages / seconds:,.0f} | {cpu / args.messages * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
