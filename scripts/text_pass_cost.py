#!/usr/bin/env python3
"""What one encoder pass costs per real token, by batch size and padding: the figures behind
the text models' batching rule (``workerpool.models.text_passes``).

A text model converted by ``workerpool convert`` (``onnx`` or ``bert``) is built in this process
as a worker builds it, with ``--threads`` intra-op and BLAS threads, and its encoder is run on
``B`` rows of ``L`` tokens, of which ``real`` are tokens and the rest padding. Each cell is the
median of ``--repeat`` passes after one warm-up, as microseconds per real token. Last, a line
fitted to the passes without padding (weighted by their relative error) splits a pass's cost
into what it costs per token and per pass: the per-pass part, in tokens, is the overhead the
batching rule weighs padding against.

    python3 scripts/text_pass_cost.py minilm.bpk [--threads 1] [--repeat 7]
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from benchlib.arguments import parser_for
from threadpoolctl import threadpool_limits

from workerpool.models.loaded import LoadedModel
from workerpool.models.texts import Encoder
from workerpool.runtime import default_cache_dir

BATCHES = (1, 2, 4, 8, 16, 32, 64)
LENGTHS = (16, 32, 64, 128, 256)
PADDING = (0.0, 0.25, 0.5, 1.0)  # padding as a share of the real tokens


def pass_seconds(encode: Encoder, rows: int, length: int, real: int, repeat: int) -> float:
    """Median seconds of one pass over ``rows`` rows of ``length`` tokens, ``real`` of them
    tokens and the rest padding."""
    ids = np.full((rows, length), 1000, np.int64)
    mask = np.zeros((rows, length), np.int64)
    mask[:, :real] = 1
    ids[:, real:] = 0
    types = np.zeros_like(ids)
    encode(ids, mask, types)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        encode(ids, mask, types)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("model", help="a text model's .bpk (onnx or bert)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op and BLAS threads (default 1)")
    parser.add_argument("--repeat", type=int, default=7, help="passes per cell (default 7)")
    parser.add_argument("--cache-dir", default=default_cache_dir(),
                        help="where an onnx model's prepacked copy is kept, as serve's --cache-dir "
                        "(default: serve's default)")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                        help="comma-separated real tokens per row (default: %(default)s)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="comma-separated rows per pass (default: %(default)s)")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    with threadpool_limits(args.threads):
        loaded = LoadedModel(args.model, None, "mmap", threads=args.threads, cache_dir=args.cache_dir)
        encoder = getattr(loaded.model, "text_encoder", None)
        if encoder is None:
            sys.exit(f"text_pass_cost: {args.model} holds a {loaded.name} model that takes no texts")
        encode = encoder.encode
        print(f"{loaded.name} {args.model}, {args.threads} thread(s); µs per real token, median of "
              f"{args.repeat} passes\n")
        print("| real tokens | batch | " + " | ".join(f"+{p:.0%} padding" for p in PADDING) + " |")
        print("| ---: | ---: | " + " | ".join("---:" for _ in PADDING) + " |")
        unpadded: list[tuple[int, float]] = []  # (tokens, seconds) of the passes without padding
        for real in lengths:
            for rows in batches:
                cells = []
                for padding in PADDING:
                    length = real + round(real * padding)
                    seconds = pass_seconds(encode, rows, length, real, args.repeat)
                    cells.append(f"{seconds / (rows * real) * 1e6:.1f}")
                    if not padding:
                        unpadded.append((rows * real, seconds))
                print(f"| {real} | {rows} | " + " | ".join(cells) + " |")
    tokens, times = (np.array(column, float) for column in zip(*unpadded, strict=True))
    per_token, per_pass = np.polyfit(tokens, times, 1, w=1 / times)  # relative errors: small passes count
    print(f"\nfit of the passes without padding: {per_pass * 1e3:.2f} ms a pass + {per_token * 1e6:.0f} µs "
          f"a token, so a pass costs {per_pass / per_token:.1f} tokens beyond its own (the rule's overhead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
