"""A tiny random BERT with Hugging Face's tensor names, and a word-level tokenizer for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workerpool import burnpack
from workerpool.models.base import MODEL_KEY
from workerpool.models.bert import CONFIG_KEY, TOKENIZER_KEY

HIDDEN, HEADS, LAYERS, INNER, VOCAB, POSITIONS = 8, 2, 2, 16, 30, 12


def tiny_bert(path: Path, *, tokenizer: str | None = None, labels: list[str] | None = None,
              **config_changes) -> Path:
    """A random BERT with Hugging Face's names and ``[out, in]`` Linear weights; a tokenizer
    (``tokenizer.json`` text) only when given; with ``labels``, a BertForSequenceClassification
    (the encoder under ``bert.``, a pooler and a classifier of that many labels)."""
    rng = np.random.default_rng(3)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.5

    tensors = {"embeddings.word_embeddings.weight": normal(VOCAB, HIDDEN),
               "embeddings.position_embeddings.weight": normal(POSITIONS, HIDDEN),
               "embeddings.token_type_embeddings.weight": normal(2, HIDDEN),
               "embeddings.LayerNorm.weight": 1 + normal(HIDDEN), "embeddings.LayerNorm.bias": normal(HIDDEN)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        for name, (out, inp) in {"attention.self.query": (HIDDEN, HIDDEN), "attention.self.key": (HIDDEN, HIDDEN),
                                 "attention.self.value": (HIDDEN, HIDDEN), "attention.output.dense": (HIDDEN, HIDDEN),
                                 "intermediate.dense": (INNER, HIDDEN), "output.dense": (HIDDEN, INNER)}.items():
            tensors[f"{p}.{name}.weight"], tensors[f"{p}.{name}.bias"] = normal(out, inp), normal(out)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[f"{p}.{norm}.weight"], tensors[f"{p}.{norm}.bias"] = 1 + normal(HIDDEN), normal(HIDDEN)
    config = {"model_type": "bert", "hidden_size": HIDDEN, "num_attention_heads": HEADS,
              "num_hidden_layers": LAYERS, "intermediate_size": INNER, "hidden_act": "gelu",
              "layer_norm_eps": 1e-12}
    if labels is not None:
        tensors = {f"bert.{name}": value for name, value in tensors.items()}
        tensors |= {"bert.pooler.dense.weight": normal(HIDDEN, HIDDEN), "bert.pooler.dense.bias": normal(HIDDEN),
                    "classifier.weight": normal(len(labels), HIDDEN), "classifier.bias": normal(len(labels))}
        config |= {"architectures": ["BertForSequenceClassification"],
                   "id2label": {str(i): label for i, label in enumerate(labels)}}
    config |= config_changes
    metadata = {CONFIG_KEY: json.dumps(config), MODEL_KEY: "bert"}
    if tokenizer is not None:
        metadata[TOKENIZER_KEY] = tokenizer
    burnpack.write(path, tensors, metadata=metadata)
    return path


def tiny_tokenizer() -> str:
    """A word-level ``tokenizer.json`` over a few words, within the tiny BERT's vocabulary."""
    tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers package")
    words = ["[UNK]", "hello", "world", "a", "text"]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                                 unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return tokenizer.to_str()


