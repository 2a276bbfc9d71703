"""This machine's prepacked copy of an ONNX model: made once per weight file in the cache folder,
the same answers and signature as the session on views, and views again whenever it cannot be
made or loaded."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import onnx_graphs, onnx_texts
from test_onnx_model import CASES, assert_same, reference

from workerpool.models import ModelError, onnx_copier, onnx_prepared
from workerpool.models.loaded import LoadedModel


def loaded(path, cache) -> LoadedModel:
    return LoadedModel(str(path), None, "mmap", threads=1, cache_dir=str(cache) if cache else None)


def copies(cache) -> list[str]:
    folder = cache / "onnx"
    return sorted(name for name in os.listdir(folder) if not name.startswith(".")) if folder.exists() else []


@pytest.mark.parametrize("case", ["block", "embedding"])  # the others run on copies in later tests
def test_the_copy_answers_as_onnxruntime_and_declares_what_views_declare(tmp_path, case):
    build, make_input, batch = CASES[case]
    graph = build()
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", graph)
    on_copy, on_views = loaded(path, tmp_path / "cache"), loaded(path, None)
    assert on_copy.model.prepared is not None and on_views.model.prepared is None
    assert on_copy.describe() == on_views.describe()
    feeds = make_input(batch)
    assert_same(on_copy.infer(feeds), reference(graph, feeds))


def test_the_copy_is_made_once_per_file_and_mapped_by_the_session(tmp_path):
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp_of_size(4 << 20))
    first = loaded(path, tmp_path / "cache")
    made = os.stat(first.model.prepared)
    second = loaded(path, tmp_path / "cache")
    assert second.model.prepared == first.model.prepared
    assert os.stat(second.model.prepared).st_ino == made.st_ino  # not made again
    data = os.path.join(os.path.dirname(first.model.prepared), onnx_copier.DATA_FILE)
    with open("/proc/self/maps") as maps:
        assert data in maps.read()  # onnxruntime maps the copy's data: shared, not read


def test_texts_on_the_copy_equal_onnxruntime_pooled(tmp_path):
    graph = onnx_texts.encoder()
    model = loaded(onnx_texts.converted(tmp_path / "st", graph, "mean", True), tmp_path / "cache")
    assert model.model.prepared is not None
    texts = ["hello world", "the cat sat", ""]
    np.testing.assert_allclose(model.infer(texts)["embedding"],
                               onnx_texts.reference(graph, texts, "mean", True), rtol=1e-5, atol=1e-6)


def test_a_new_file_at_the_path_gets_its_own_copy_and_old_ones_are_removed(tmp_path):
    path = tmp_path / "model.bpk"
    made = []
    for seed in range(onnx_prepared.KEEP + 1):
        incoming = onnx_graphs.write_onnx_bpk(tmp_path / "incoming.bpk", onnx_graphs.mlp(seed=seed))
        os.rename(incoming, path)  # a publish: a new inode at the served path
        made.append(os.path.basename(os.path.dirname(loaded(path, tmp_path / "cache").model.prepared)))
    assert len(set(made)) == len(made)
    assert copies(tmp_path / "cache") == sorted(made[-onnx_prepared.KEEP:])


def test_a_copy_that_does_not_load_is_removed_and_the_model_serves_on_views(tmp_path, caplog):
    graph = onnx_graphs.mlp()
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", graph)
    broken = loaded(path, tmp_path / "cache").model.prepared
    with open(broken, "r+b") as model_file:
        model_file.truncate(os.path.getsize(broken) // 2)
    with caplog.at_level(logging.WARNING):
        model = loaded(path, tmp_path / "cache")
    assert model.model.prepared is None and "does not load" in caplog.text
    assert not os.path.exists(broken)
    feeds = CASES["mlp"][1](2)
    assert_same(model.infer(feeds), reference(graph, feeds))
    assert loaded(path, tmp_path / "cache").model.prepared is not None  # made again


def test_a_cache_folder_that_cannot_be_made_leaves_the_model_on_views(tmp_path, caplog):
    (tmp_path / "not-a-folder").write_text("")
    graph = onnx_graphs.mlp()
    with caplog.at_level(logging.WARNING):
        model = loaded(onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", graph), tmp_path / "not-a-folder")
    assert model.model.prepared is None
    assert "no prepacked copy" in caplog.text and "without prepacking" in caplog.text
    feeds = CASES["mlp"][1](3)
    assert_same(model.infer(feeds), reference(graph, feeds))


def test_a_copy_is_never_made_for_a_private_copy_of_the_weights(tmp_path):
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp())
    model = LoadedModel(path, None, "copy", threads=1, cache_dir=str(tmp_path / "cache"))
    assert model.model.prepared is None and copies(tmp_path / "cache") == []


def test_a_graph_that_folds_a_weight_is_served_from_the_copy(tmp_path):
    """A Cast of a float16 weight before its MatMul: onnxruntime reads that weight while it
    optimises, which on views means the empty placeholder; the copy was made from real data."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float16), "h")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT), helper.make_node("MatMul", ["x", "hf"], ["y"])],
        "cast", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", model)
    with pytest.raises(ModelError, match="onnxruntime cannot build the graph"):
        loaded(path, None)
    feeds = {"x": np.ones((2, 16), np.float32)}
    assert_same(loaded(path, tmp_path / "cache").infer(feeds), reference(model, feeds))


def test_a_cache_folder_others_can_write_to_is_not_used(tmp_path, caplog):
    (tmp_path / "cache" / "onnx").mkdir(parents=True)
    (tmp_path / "cache" / "onnx").chmod(0o777)
    with caplog.at_level(logging.WARNING):
        model = loaded(onnx_graphs.write_onnx_bpk(tmp_path / "model.bpk", onnx_graphs.mlp()), tmp_path / "cache")
    assert model.model.prepared is None and "that no one else can write to" in caplog.text
    assert copies(tmp_path / "cache") == []
