"""Texts served by the ``onnx`` model: tokenized in the worker, run in planned passes, pooled as the
file's sentence-transformers pooling says, against onnxruntime on the original graph."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto
from support import onnx_texts
from support.models import batch_outcomes

from workerpool import burnpack
from workerpool.models import ModelError, ModelInputError, text_passes
from workerpool.models.loaded import LoadedModel

TEXTS = ["hello world", "the cat sat", "a", "", "text text text the world sat a hello",
         "unknown words here", " ".join(["cat"] * 40)]  # the last is cut at the 32 positions


def served(path: str) -> LoadedModel:
    return LoadedModel(path, None, "mmap", threads=1, truncate=True)  # the reference cuts as sentence-transformers does


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_text_embeddings_equal_onnxruntime_on_the_original_graph_pooled(tmp_path, mode, normalize):
    graph = onnx_texts.encoder()
    loaded = served(onnx_texts.converted(tmp_path / "st", graph, mode, normalize))
    embedding = loaded.infer(TEXTS)["embedding"]
    assert embedding.dtype == np.float32 and embedding.shape == (len(TEXTS), onnx_texts.HIDDEN)
    np.testing.assert_allclose(embedding, onnx_texts.reference(graph, TEXTS, mode, normalize),
                               rtol=1e-5, atol=1e-6)


def test_int32_inputs_without_token_types_are_fed_as_the_graph_declares(tmp_path):
    graph = onnx_texts.encoder(TensorProto.INT32, token_types=False)
    loaded = served(onnx_texts.converted(tmp_path / "st", graph, "max", True))
    np.testing.assert_allclose(loaded.infer(TEXTS)["embedding"],
                               onnx_texts.reference(graph, TEXTS, "max", True), rtol=1e-5, atol=1e-6)


def test_info_lists_texts_and_the_graphs_arrays(tmp_path):
    loaded = served(onnx_texts.converted(tmp_path / "st", onnx_texts.encoder()))
    info = loaded.describe()
    assert info["inputs"][0] == {"name": None, "dtype": "text", "shape": [None]}
    assert [entry["name"] for entry in info["inputs"][1:]] == ["input_ids", "attention_mask", "token_type_ids"]
    *arrays, embedding, tokens = info["outputs"]
    assert [entry["name"] for entry in arrays] == ["pooler_output", "last_hidden_state"]
    assert embedding == {"name": "embedding", "dtype": "<f4", "shape": [None, onnx_texts.HIDDEN]}
    assert tokens == {"name": "tokens", "dtype": "<i4", "shape": [None]}


def test_texts_of_several_requests_stacked_give_each_its_own_embeddings(tmp_path):
    loaded = served(onnx_texts.converted(tmp_path / "st", onnx_texts.encoder(), "cls", False))
    assert loaded.batching
    requests = [TEXTS[:2], TEXTS[2:3], TEXTS[3:]]
    stacked = batch_outcomes(loaded, requests)
    for request, outputs in zip(requests, stacked, strict=True):
        np.testing.assert_allclose(outputs["embedding"], loaded.infer(request)["embedding"], rtol=1e-6)


def test_more_texts_than_a_pass_holds_run_in_several_passes_with_the_same_answers(tmp_path):
    graph = onnx_texts.encoder()
    loaded = served(onnx_texts.converted(tmp_path / "st", graph))
    many = [" ".join(["hello", "world", "cat"][: 1 + i % 3] * (1 + i % 9)) for i in range(1000)]
    assert sum(min(len(t.split()) + 2, onnx_texts.POSITIONS) for t in many) > 2 * text_passes.PASS_TOKENS
    embedding = loaded.infer(many)["embedding"]
    np.testing.assert_allclose(embedding, onnx_texts.reference(graph, many, "mean", True),
                               rtol=1e-5, atol=1e-6)


def counting_passes(loaded: LoadedModel) -> list[tuple[int, int]]:
    """Record each pass the model's encoder is given: its rows and its tokens with padding."""
    seen: list[tuple[int, int]] = []
    encoder = loaded.model.text_encoder

    def encode(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        seen.append((int(mask.sum()), ids.size))
        return encoder.encode(ids, mask, types)
    loaded.model.text_encoder = dataclasses.replace(encoder, encode=encode)
    return seen


def test_texts_of_very_different_lengths_run_in_passes_padded_within_the_bound(tmp_path):
    graph = onnx_texts.encoder()
    loaded = served(onnx_texts.converted(tmp_path / "st", graph))
    passes = counting_passes(loaded)
    many = [" ".join(["cat"] * (1 + i * 7 % 29)) for i in range(60)]  # 3 to 31 tokens
    requests = [many[i:i + 4] for i in range(0, len(many), 4)]
    outcomes = batch_outcomes(loaded, requests)
    real, padded = sum(r for r, _ in passes), sum(p for _, p in passes)
    assert real == sum(len(t.split()) + 2 for t in many)
    assert padded <= (1 + text_passes.PADDING_SHARE) * real
    assert 1 < len(passes) < len(many)  # several passes, and texts that share them
    for request, outputs in zip(requests, outcomes, strict=True):
        np.testing.assert_allclose(outputs["embedding"], onnx_texts.reference(graph, request, "mean", True),
                                   rtol=1e-5, atol=1e-6)


def test_a_request_is_answered_when_its_passes_are_done_not_when_the_batch_is(tmp_path):
    loaded = served(onnx_texts.converted(tmp_path / "st", onnx_texts.encoder()))
    passes = counting_passes(loaded)
    short, long = ["hello"], [" ".join(["cat"] * 29)] * 40
    answered = []
    for index, outputs in loaded.infer_batch([short, long, long[:3]]):
        answered.append((index, len(passes)))
        assert outputs["embedding"].shape[0] == [1, len(long), 3][index]
    assert answered[0] == (0, 1)  # the first request's pass runs first, and it is answered then
    assert sorted(index for index, _ in answered) == [0, 1, 2]
    assert answered[-1][1] == len(passes) > 2


def test_a_batch_with_one_bad_request_answers_the_others(tmp_path):
    loaded = served(onnx_texts.converted(tmp_path / "st", onnx_texts.encoder()))
    good, bad, empty = ["hello world"], ["a text", 3], []
    outcomes = batch_outcomes(loaded, [good, bad, good, empty])
    assert isinstance(outcomes[1], ModelInputError) and isinstance(outcomes[3], ModelInputError)
    for outputs in (outcomes[0], outcomes[2]):
        np.testing.assert_allclose(outputs["embedding"], loaded.infer(good)["embedding"], rtol=1e-6)


@pytest.mark.parametrize("inputs", [[], ["a text", 3], [None]])
def test_an_empty_list_or_one_that_is_not_all_strings_is_the_clients_error(tmp_path, inputs):
    loaded = served(onnx_texts.converted(tmp_path / "st", onnx_texts.encoder()))
    with pytest.raises(ModelInputError, match="texts must be a non-empty list of strings"):
        loaded.infer(inputs)


def test_a_file_without_a_pooling_config_takes_no_texts(tmp_path):
    loaded = served(onnx_texts.converted(tmp_path / "st", onnx_texts.encoder(), mode=None))
    assert loaded.contract.texts is False
    assert "text" not in [entry["dtype"] for entry in loaded.describe()["inputs"]]
    with pytest.raises(ModelInputError, match="takes arrays, not texts"):
        loaded.infer(["hello world"])


def test_an_unreadable_pooling_is_refused_when_the_model_is_built(tmp_path):
    path = onnx_texts.converted(tmp_path / "st", onnx_texts.encoder())
    pack = burnpack.read(path)
    burnpack.write(tmp_path / "bad.bpk", {name: np.array(t) for name, t in pack.tensors.items()},
                   metadata={**pack.metadata, "workerpool.pooling": '{"mode": "sum"}'})
    with pytest.raises(ModelError, match="onnx: pooling .* is not"):
        served(str(tmp_path / "bad.bpk"))


def test_arrays_the_graph_cannot_run_on_are_the_clients_error(tmp_path):
    """Positions past the graph's table fail inside onnxruntime (not in a check of ours); that is
    the request's fault, answered as such, and the model keeps answering."""
    loaded = served(onnx_texts.converted(tmp_path / "st", onnx_texts.encoder()))

    def ids(length: int) -> dict[str, np.ndarray]:
        return {name: np.ones((2, length), np.int64) for name in ("input_ids", "attention_mask", "token_type_ids")}
    with pytest.raises(ModelInputError, match=r"^onnx: the graph cannot run on this input: .*Add node.*32 by 40$"):
        loaded.infer(ids(onnx_texts.POSITIONS + 8))
    assert loaded.infer(ids(onnx_texts.POSITIONS))["last_hidden_state"].shape == (2, onnx_texts.POSITIONS, onnx_texts.HIDDEN)
