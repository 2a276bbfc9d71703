"""Models of texts that classify: a BertForSequenceClassification (numpy ``bert``) and an ONNX
graph with ``logits``, on texts and pairs; the limit on a text's tokens; and what ``convert``
refuses rather than serve as something else."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import onnx_texts
from support.bert import POSITIONS, tiny_bert, tiny_tokenizer
from support.models import batch_outcomes

from workerpool import burnpack
from workerpool.models import ModelInputError
from workerpool.models.base import MODEL_KEY
from workerpool.models.loaded import LoadedModel
from workerpool.models.texts import CHARS_PER_TOKEN, WIDER, Texts
from workerpool.weights.convert import convert
from workerpool.weights.sources import ConvertError

LABELS = ["no", "yes", "maybe"]
safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="needs safetensors")


def classifier(tmp_path: Path, **options) -> LoadedModel:
    return LoadedModel(str(tiny_bert(tmp_path / "c.bpk", tokenizer=tiny_tokenizer(), labels=LABELS)), None, "mmap",
                       **options)


def head(path: Path, states: np.ndarray) -> np.ndarray:
    """The classifier head of transformers' BertForSequenceClassification, on the first token."""
    tensors = burnpack.read(str(path)).tensors
    pooled = np.tanh(states[:, 0] @ tensors["bert.pooler.dense.weight"].T + tensors["bert.pooler.dense.bias"])
    return pooled @ tensors["classifier.weight"].T + tensors["classifier.bias"]


def test_a_sequence_classifier_gives_logits_of_its_head_with_its_labels(tmp_path):
    model = classifier(tmp_path)
    info = model.describe()
    assert (info["task"], info["labels"], info["max_input_tokens"]) == ("classify", LABELS, POSITIONS)
    texts = model.infer(["hello world", "a text text"])
    ids = np.array([[1, 2, 0], [3, 4, 4]], np.int64)
    arrays = model.infer({"input_ids": ids, "attention_mask": np.array([[1, 1, 0], [1, 1, 1]], np.int64)})
    np.testing.assert_allclose(arrays["logits"], head(tmp_path / "c.bpk", arrays["last_hidden_state"]), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(texts["logits"], arrays["logits"], rtol=1e-5, atol=1e-6)
    assert texts["logits"].shape == (2, 3) and list(texts["tokens"]) == [2, 3]


def test_a_classifier_that_names_no_labels_has_transformers_two(tmp_path):
    path = tiny_bert(tmp_path / "c.bpk", tokenizer=tiny_tokenizer(), labels=["a", "b"], id2label=None)
    model = LoadedModel(str(path), None, "mmap")
    assert model.describe()["labels"] == ["LABEL_0", "LABEL_1"]
    assert model.infer(["hello"])["logits"].shape == (1, 2)


def test_a_pair_runs_as_one_sequence_with_the_second_sides_token_types(tmp_path):
    model = classifier(tmp_path)
    paired = model.infer(Texts([("hello world", "a text")]))["logits"]
    ids = np.array([[1, 2, 3, 4]], np.int64)
    arrays = model.infer({"input_ids": ids, "attention_mask": np.ones_like(ids),
                          "token_type_ids": np.array([[0, 0, 1, 1]], np.int64)})
    np.testing.assert_allclose(paired, arrays["logits"], rtol=1e-5, atol=1e-6)
    alone = model.infer(Texts(["hello world a text"]))["logits"]
    assert not np.allclose(paired, alone)  # the token types count


def test_each_request_of_a_batch_keeps_its_own_truncation(tmp_path):
    model = classifier(tmp_path)
    long = " ".join(["hello"] * (POSITIONS + 5))
    refused, cut, short, served_default = batch_outcomes(
        model, [Texts([long], False), Texts([long], True), Texts(["a text"], False), [long]])
    assert isinstance(refused, ModelInputError) and f"limit of {POSITIONS} tokens" in str(refused)
    assert list(cut["tokens"]) == [POSITIONS] and list(short["tokens"]) == [2]
    assert isinstance(served_default, ModelInputError)  # served without --truncate
    assert list(classifier(tmp_path, truncate=True).infer([long])["tokens"]) == [POSITIONS]


def test_a_text_far_over_the_limit_is_cut_before_it_is_tokenized_with_the_same_tokens(tmp_path):
    encoder = classifier(tmp_path).model.text_encoder
    far = "hello world " * (POSITIONS * CHARS_PER_TOKEN)
    unspaced = "hello.world." * (POSITIONS * CHARS_PER_TOKEN)  # words split at punctuation, not white space
    for text in (far, unspaced):
        cut, forced = encoder._prefix(text)
        assert cut != text and len(cut) <= POSITIONS * CHARS_PER_TOKEN and not forced
    spaces = " " * (POSITIONS * CHARS_PER_TOKEN * 2) + "hello"  # its start holds no token: kept whole
    one_word = "x" * (POSITIONS * CHARS_PER_TOKEN * 2)  # the cut would split the only word: kept whole
    assert encoder._prefix(spaces) == (spaces, False) and encoder._prefix(one_word) == (one_word, False)
    texts = [far, unspaced, spaces, one_word]
    tokenized = encoder.tokenize(texts)
    assert [e.ids for e in tokenized.encodings] == [encoder.tokenizer.encode(text).ids for text in texts]
    assert tokenized.over == [True, True, False, False]
    endless = "x" * (POSITIONS * CHARS_PER_TOKEN * WIDER + 1)  # one word past what is read whole: its start
    assert encoder._prefix(endless) == (endless[:POSITIONS * CHARS_PER_TOKEN * WIDER], True)
    assert encoder.tokenize([endless]).over == [True]


def folder(tmp_path: Path, config: dict, *, modules: bool = False) -> Path:
    root = tmp_path / "hf"
    root.mkdir()
    safetensors_numpy.save_file({"bert.embeddings.word_embeddings.weight": np.zeros((4, 2), np.float32)},
                                str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "bert", **config}))
    if modules:
        (root / "modules.json").write_text("[]")
    return root


@pytest.mark.parametrize("config, words", [
    ({"architectures": ["BertForMaskedLM"]}, "BertForMaskedLM is not served"),
    ({"architectures": ["BertForTokenClassification"]}, "its head would be dropped"),
    ({"model_type": "roberta", "architectures": ["RobertaForSequenceClassification"]}, "export it to ONNX"),
])
def test_convert_refuses_a_head_it_cannot_serve(tmp_path, config, words):
    with pytest.raises(ConvertError, match=words):
        convert(str(folder(tmp_path, config)), str(tmp_path / "out.bpk"))


def test_a_sentence_transformers_folder_is_an_embedder_whatever_its_checkpoints_head(tmp_path):
    convert(str(folder(tmp_path, {"architectures": ["BertForMaskedLM"]}, modules=True)), str(tmp_path / "st.bpk"))
    assert burnpack.read(str(tmp_path / "st.bpk")).metadata[MODEL_KEY] == "bert"


def onnx_classifier(root: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """A graph averaging word vectors into logits (no pooling in the folder, config with
    labels): a classifier, as optimum exports one; and its words and weights."""
    rng = np.random.default_rng(5)
    words = rng.standard_normal((len(onnx_texts.WORDS), onnx_texts.HIDDEN), dtype=np.float32)
    weight = rng.standard_normal((onnx_texts.HIDDEN, len(LABELS)), dtype=np.float32)
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"]),
             helper.make_node("ReduceMean", ["w", "axis"], ["mean"], keepdims=0),
             helper.make_node("MatMul", ["mean", "weight"], ["logits"])]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
              for name in ("input_ids", "attention_mask")]
    graph = helper.make_graph(nodes, "classifier", inputs,
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)])],
                              [numpy_helper.from_array(words, "words"), numpy_helper.from_array(weight, "weight"),
                               numpy_helper.from_array(np.array([1], np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx_texts.write_folder(root, model, mode=None)
    (root / "config.json").write_text(json.dumps({"id2label": dict(enumerate(LABELS))}))
    return root, words, weight


def test_an_onnx_graph_with_logits_and_no_pooling_classifies_texts_and_pairs(tmp_path):
    root, words, weight = onnx_classifier(tmp_path / "onnx")
    convert(str(root), str(tmp_path / "c.bpk"))
    model = LoadedModel(str(tmp_path / "c.bpk"), None, "mmap", threads=1)
    assert (model.describe()["task"], model.describe()["labels"]) == ("classify", LABELS)
    logits = model.infer(Texts(["hello world", ("the cat", "sat")]))["logits"]
    ids = [[2, 4, 5, 3], [2, 8, 9, 3, 10]]  # [CLS] ... [SEP], and a pair as the tokenizer joins it
    np.testing.assert_allclose(logits[0], words[ids[0]].mean(axis=0) @ weight, rtol=1e-5, atol=1e-5)
    assert logits.shape == (2, 3)
