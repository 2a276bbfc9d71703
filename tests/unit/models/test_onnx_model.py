"""The built-in ``onnx`` model against onnxruntime running the original graph, weights inside."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from support import onnx_graphs
from support.models import batch_outcomes

from workerpool import burnpack, models
from workerpool.linux.procfs import private_resident
from workerpool.models import ModelError, ModelInputError, onnx_layout, onnx_model
from workerpool.models.loaded import LoadedModel

RNG = np.random.default_rng(7)


def ids(batch: int, tokens: int, vocabulary: int = 50) -> np.ndarray:
    return RNG.integers(0, vocabulary, (batch, tokens), dtype=np.int64)


def mlp_input(batch: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((batch, 16), dtype=np.float32)}


def block_input(batch: int) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((batch, 5, 16), dtype=np.float32)}


def embedding_input(batch: int) -> dict[str, np.ndarray]:
    return {"ids": ids(batch, 6), "mask": (RNG.random((batch, 6)) > 0.3).astype(np.float32)}


CASES = {
    "mlp": (onnx_graphs.mlp, mlp_input, 3),
    "block": (onnx_graphs.block, block_input, 2),
    "embedding": (onnx_graphs.embedding, embedding_input, 4),
    "fixed batch": (lambda: onnx_graphs.mlp(batch=2), mlp_input, 2),
}


def served(tmp_path, graph) -> LoadedModel:
    return LoadedModel(onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", graph), None, "mmap", threads=1)


def reference(graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def assert_same(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(outputs) == set(expected)
    for name, value in expected.items():
        assert outputs[name].dtype == value.dtype
        np.testing.assert_allclose(outputs[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_answers_equal_onnxruntime_on_the_original_graph(tmp_path, case):
    build, make_input, batch = CASES[case]
    graph = build()
    loaded = served(tmp_path, graph)
    assert loaded.name == onnx_layout.NAME  # chosen from the file's metadata
    feeds = make_input(batch)
    assert_same(loaded.infer(feeds), reference(graph, feeds))


def test_the_weights_are_the_files_mapping_not_copies(tmp_path):
    loaded = served(tmp_path, onnx_graphs.mlp())
    values = loaded.model.initializers
    assert sorted(values) == ["b1", "b2", "w1", "w2"]
    assert all(np.shares_memory(value.numpy(), loaded.pack.tensors[name]) for name, value in values.items())


def test_info_lists_each_input_and_output_by_name(tmp_path):
    info = served(tmp_path, onnx_graphs.embedding()).describe()
    assert info["batching"] is True
    assert info["inputs"] == [{"name": "ids", "dtype": "<i8", "shape": [None, None]},
                              {"name": "mask", "dtype": "<f4", "shape": [None, None]}]
    assert info["outputs"] == [{"name": "states", "dtype": "<f4", "shape": [None, None, 8]},
                               {"name": "pooled", "dtype": "<f4", "shape": [None, 8]}]
    fixed = served(tmp_path, onnx_graphs.mlp(batch=2)).describe()
    assert fixed["batching"] is False
    assert fixed["inputs"] == [{"name": "x", "dtype": "<f4", "shape": [2, 16]}]


def test_a_single_input_graph_takes_a_bare_array_and_a_bare_row(tmp_path):
    graph = onnx_graphs.mlp()
    loaded = served(tmp_path, graph)
    x = mlp_input(2)["x"]
    expected = reference(graph, {"x": x})
    assert_same(loaded.infer(x), expected)
    assert_same(loaded.infer(x[0]), {"y": expected["y"][:1]})


@pytest.mark.parametrize("case", ["mlp", "embedding"])
def test_stacked_requests_answer_as_one_by_one(tmp_path, case):
    build, make_input, _ = CASES[case]
    loaded = served(tmp_path, build())
    requests = [make_input(rows) for rows in (1, 3, 2)]
    stacked = batch_outcomes(loaded, requests)
    for request, outputs in zip(requests, stacked, strict=True):
        assert_same(outputs, loaded.infer(request))


def test_a_malformed_request_in_a_batch_fails_alone(tmp_path):
    loaded = served(tmp_path, onnx_graphs.embedding())
    good = [embedding_input(2), embedding_input(1)]
    bad_ids = dict(embedding_input(1), ids=np.array([[1, 2, 3, 4, 5, 50]]))
    outcomes = batch_outcomes(loaded, [good[0], bad_ids, good[1], {"ids": ids(1, 6)}])
    assert_same(outcomes[0], loaded.infer(good[0]))
    assert_same(outcomes[2], loaded.infer(good[1]))
    assert isinstance(outcomes[1], ModelInputError) and "outside [-50, 49]" in str(outcomes[1])
    assert isinstance(outcomes[3], ModelInputError) and "arrays named ['ids']" in str(outcomes[3])


@pytest.mark.parametrize("request_, message", [
    ({"ids": ids(1, 6).astype(np.int32), "mask": np.ones((1, 6), np.float32)},
     "expected ids int64 [B, any], got ids int32 [1, 6]"),
    ({"ids": ids(1, 6)[0], "mask": np.ones(6, np.float32)}, "got ids int64 [6]"),
    ({"ids": ids(2, 6), "mask": np.ones((1, 6), np.float32)}, "batch sizes differ (ids 2, mask 1)"),
    ({"ids": ids(1, 6), "mask": np.ones((1, 6), np.float32), "extra": np.ones(1)}, "got arrays named"),
    (ids(1, 6), "expected arrays named ids int64 [B, any], mask float32 [B, any], got int64 [1, 6]"),
    ({"ids": -ids(1, 6) - 51, "mask": np.ones((1, 6), np.float32)}, "ids outside [-50, 49]"),
    ({"ids": ids(1, 6), "mask": np.ones((1, 5), np.float32)}, "axis tokens is 6 long in ids but 5 in mask"),
])
def test_a_request_the_graph_cannot_take_is_the_clients_error(tmp_path, request_, message):
    loaded = served(tmp_path, onnx_graphs.embedding())
    with pytest.raises(ModelInputError) as refused:
        loaded.infer(request_)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert set(loaded.infer(embedding_input(1))) == {"states", "pooled"}  # still serving


def test_an_initializer_missing_from_the_file_is_refused(tmp_path):
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp(), drop=("w2",))
    with pytest.raises(ModelError, match=r"^onnx: onnxruntime cannot build the graph: .*\bw2\b[^\n]*$"):
        LoadedModel(path, None, "mmap")


def graph_edited(tmp_path, edit) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """An mlp file's tensors and metadata, its graph bytes passed through ``edit``."""
    pack = burnpack.read(onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp()))
    graph = edit(pack.tensors[onnx_layout.GRAPH_TENSOR].tobytes())
    return dict(pack.tensors, **{onnx_layout.GRAPH_TENSOR: np.frombuffer(graph, np.uint8)}), dict(pack.metadata)


@pytest.mark.parametrize("edit, message", [
    (lambda graph: graph[:-9], ("onnx: onnxruntime cannot build the graph: Failed to load model because "
                                "protobuf parsing failed")),
    (lambda graph: graph.replace(b"Relu", b"Relx"),
     "onnx: onnxruntime cannot build the graph: This is an invalid model. In Node"),
])
def test_a_graph_that_does_not_build_is_refused(tmp_path, edit, message):
    tensors, metadata = graph_edited(tmp_path, edit)
    with pytest.raises(ModelError) as refused:
        models.build_model(tensors, metadata)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_what_onnxruntime_refuses_as_invalid_is_the_clients_error(tmp_path):
    """Past the declared signature (the model called without it), onnxruntime's own reason."""
    model = served(tmp_path, onnx_graphs.embedding()).model
    with pytest.raises(ModelInputError, match=r"^onnx: Unexpected input data type\. Actual: \(tensor\(int32\)\)"):
        model({"ids": ids(1, 6).astype(np.int32), "mask": np.ones((1, 6), np.float32)})


@pytest.mark.parametrize(("tensor", "changed", "message"), [
    ("w1", lambda w: w.astype(np.float64), r"tensor w1 is <f8 \[16, 32\], where the graph declares <f4 \[16, 32\]"),
    ("w1", lambda w: np.ascontiguousarray(w.T), r"tensor w1 is <f4 \[32, 16\], where the graph declares <f4 \[16, 32\]"),
    ("b2", lambda b: b[:4], r"tensor b2 is <f4 \[4\], where the graph declares <f4 \[8\]"),
])
def test_tensors_that_do_not_fit_the_graph_are_refused(tmp_path, tensor, changed, message):
    """onnxruntime takes a supplied initializer of another dtype or shape, then fails every
    request; the file is refused when it is loaded instead."""
    pack = burnpack.read(onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp()))
    tensors = {name: np.array(value) for name, value in pack.tensors.items()}
    tensors[tensor] = changed(tensors[tensor])
    burnpack.write(tmp_path / "bad.bpk", tensors, metadata=dict(pack.metadata))
    with pytest.raises(ModelError, match=f"^onnx: {message}$"):
        LoadedModel(str(tmp_path / "bad.bpk"), None, "mmap")


def give_back_scenario(folder: str) -> None:
    """The arena keeps what a pass needed; ordinary passes leave it below the bound, so they run
    without shrinkage, and a pass that grows the worker past the bound is followed by a give-back
    once its request is answered (the worker settles after sending the replies)."""
    loaded = served(Path(folder), onnx_graphs.mlp())
    model = loaded.model
    for batch in range(1, 51):
        loaded.infer(mlp_input(batch))
        loaded.settle()
    assert model.recoveries == 0
    before = private_resident()
    outputs = loaded.infer(mlp_input(400_000))  # some 150 MiB of intermediate arrays in the arena
    assert outputs["y"].shape == (400_000, 8) and model.recoveries == 0  # not while they are held
    del outputs
    loaded.settle()
    assert model.recoveries == 1
    assert private_resident() < before + onnx_model.RECOVER_GROWTH
    loaded.infer(mlp_input(4))
    loaded.settle()
    assert model.recoveries == 1


@pytest.mark.process
def test_memory_is_given_back_after_a_pass_that_grew_the_worker_and_not_otherwise(tmp_path):
    """In a fresh interpreter, as a worker is: in the test's own process, an earlier test's
    onnxruntime arena may already hold the room the big pass needs, and nothing grows."""
    code = (f"import sys; sys.path[:0] = {sys.path!r}; "
            f"import test_onnx_model; test_onnx_model.give_back_scenario({str(tmp_path)!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=False, cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr


def test_a_give_back_without_a_session_or_with_fixed_shapes_only_trims_the_heap(tmp_path):
    """No session is left after running out of memory when building it again failed; a graph of
    fixed shapes has no smaller input than a whole request, which it would run again."""
    fixed = served(tmp_path, onnx_graphs.mlp(batch=2))
    fixed.infer(mlp_input(2))
    assert fixed.model.smallest is None
    (tmp_path / "symbolic").mkdir()
    loaded = served(tmp_path / "symbolic", onnx_graphs.mlp())
    loaded.infer(mlp_input(3))
    assert {name: a.shape for name, a in loaded.model.smallest.items()} == {"x": (1, 16)}
    loaded.model.session = None
    for model in (fixed.model, loaded.model):
        model.settled = 0  # as if the worker had grown
        model.give_back()
        assert model.recoveries == 1
