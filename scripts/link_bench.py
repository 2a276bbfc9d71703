"""The router-to-worker link: ZeroMQ (a ROUTER over ipc, a DEALER in the worker, as local
workers used until [26] and worker hosts still use over TCP) against the local link local
workers now have (``workerpool.protocol.link``: a ``SOCK_SEQPACKET`` pair, one ``sendmsg`` and
one ``recvmsg_into`` a message); and, for large messages, the link's records against a shared
memory region.

Small messages: a "router" process sends request-sized messages (a command, the client's id, a
150-byte header, a 2 KiB body: the frames a one-row HTTP request crosses the link with) to a
"worker" process that echoes each back, and times round trips one at a time (the latency a
lone request pays twice) and 32 in flight (the cost under load).

Large messages (``--payload``, 16 MiB by default): the router sends one message of that many
bytes and the worker answers a few bytes once it holds them whole, one at a time. Over the
link the message goes as records of at most 256 KiB, read in place into the message's buffer;
over shared memory the router copies the payload into a region both processes map (a memfd
made before the fork) and sends a small record saying so, and the worker reads the region in
place. The worker sums one byte per page either way, so both touch what they received.

The CPU both processes spent, read from /proc, is divided by the messages. The ways alternate
over the rounds; medians are printed.

    python3 scripts/link_bench.py [--rounds 5] [--messages 20000] [--payload 16MiB] [--large 50]
"""

from __future__ import annotations

import mmap
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import zmq
from benchlib.arguments import add_count, add_size, parser_for
from benchlib.cpu import process_cpu

from workerpool.protocol.link import Link, pair

FRAMES = [b"REQ", b"c" * 24, b"h" * 150, b"b" * 2048]
WINDOW = 32
PAGE = mmap.PAGESIZE
Result = tuple[float, float]  # seconds, CPU seconds of both processes


def link_echo(sock: socket.socket) -> None:
    link = Link(sock)
    while (frames := link.receive()) is not None:
        link.send(frames)


def zmq_worker(endpoint: str) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"w")
    dealer.connect(endpoint)
    dealer.send(b"READY")
    while True:
        frames = dealer.recv_multipart(copy=False)
        if frames[0].bytes == b"STOP":
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


def forked(child: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    return pid


def timed(pid: int, run: Callable[[], float]) -> Result:
    before = process_cpu(os.getpid()) + process_cpu(pid)
    seconds = run()
    return seconds, process_cpu(os.getpid()) + process_cpu(pid) - before


def run_link(messages: int, window: int) -> Result:
    ours, theirs = pair()

    def worker() -> None:
        ours.close()
        link_echo(theirs)

    pid = forked(worker)
    theirs.close()
    router = Link(ours)
    result = timed(pid, lambda: drive(lambda: router.send(FRAMES), router.receive, messages, window))
    router.close()
    os.waitpid(pid, 0)
    return result


def run_zmq(messages: int, window: int, directory: str) -> Result:
    endpoint = f"ipc://{directory}/link.sock"
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(endpoint)

    def worker() -> None:
        router.close(linger=0)
        zmq_worker(endpoint)

    pid = forked(worker)
    address, _ = router.recv_multipart()
    result = timed(pid, lambda: drive(lambda: router.send_multipart([address, *FRAMES]),
                                      lambda: router.recv_multipart(copy=False), messages, window))
    router.send_multipart([address, b"STOP"])
    os.waitpid(pid, 0)
    router.close(linger=0)
    context.term()
    return result


def touch(view: memoryview) -> int:
    """One byte of every page: what a model reading its input at least does."""
    return sum(view[::PAGE])


def run_records(payload: bytes, messages: int) -> Result:
    ours, theirs = pair()

    def worker() -> None:
        ours.close()
        link = Link(theirs)
        while (frames := link.receive()) is not None:
            link.send([touch(frames[1].buffer).to_bytes(8, "little")])

    pid = forked(worker)
    theirs.close()
    router = Link(ours)
    result = timed(pid, lambda: drive(lambda: router.send([b"BIG", payload]), router.receive, messages, 1))
    router.close()
    os.waitpid(pid, 0)
    return result


def run_shared(payload: bytes, messages: int) -> Result:
    fd = os.memfd_create("link-bench")
    os.ftruncate(fd, len(payload))
    region = mmap.mmap(fd, len(payload))  # before the fork: both map it
    os.close(fd)
    ours, theirs = pair()

    def worker() -> None:
        ours.close()
        link = Link(theirs)
        view = memoryview(region)
        while (frames := link.receive()) is not None:
            size = int.from_bytes(frames[1].bytes, "little")
            link.send([touch(view[:size]).to_bytes(8, "little")])

    pid = forked(worker)
    theirs.close()
    router = Link(ours)

    def send() -> None:
        region[:len(payload)] = payload
        router.send([b"BIG", len(payload).to_bytes(8, "little")])

    result = timed(pid, lambda: drive(send, router.receive, messages, 1))
    router.close()
    os.waitpid(pid, 0)
    region.close()
    return result


def print_table(title: str, results: dict[tuple[str, int], list[Result]], messages: int) -> None:
    print(title)
    print("| link | in flight | round trip (µs) | messages/s | CPU per message, both processes (µs) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (name, window), runs in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        seconds = statistics.median(s for s, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"| {name} | {window} | {seconds / messages * 1e6 * window:,.1f} | "
              f"{messages / seconds:,.0f} | {cpu / messages * 1e6:,.1f} |")
    print()


def main() -> int:
    parser = parser_for(__doc__)
    add_count(parser, "--rounds", 5, "alternating rounds")
    add_count(parser, "--messages", 20000, "small round trips per link, level and round")
    add_size(parser, "--payload", "16MiB", "the large message")
    add_count(parser, "--large", 50, "large round trips per way and round")
    args = parser.parse_args()
    small: dict[tuple[str, int], list[Result]] = {}
    large: dict[tuple[str, int], list[Result]] = {}
    payload = os.urandom(args.payload)
    with tempfile.TemporaryDirectory() as directory:
        for round_number in range(args.rounds):
            links = [("ZeroMQ ROUTER/DEALER, ipc", lambda n, w: run_zmq(n, w, directory)),
                     ("local link (SOCK_SEQPACKET)", run_link)]
            ways = [("link records", run_records), ("shared memory", run_shared)]
            if round_number % 2:
                links.reverse()
                ways.reverse()
            for window in (1, WINDOW):
                for name, run in links:
                    small.setdefault((name, window), []).append(run(args.messages, window))
            for name, send_large in ways:
                large.setdefault((name, 1), []).append(send_large(payload, args.large))
    print(f"{args.rounds} rounds, medians; load average {os.getloadavg()[0]:.2f} at the end\n")
    print_table(f"{args.messages} messages of {sum(map(len, FRAMES))} bytes in {len(FRAMES)} frames, echoed:",
                small, args.messages)
    print_table(f"{args.large} messages of {args.payload:,} bytes, answered with 8:", large, args.large)
    return 0


if __name__ == "__main__":
    sys.exit(main())
