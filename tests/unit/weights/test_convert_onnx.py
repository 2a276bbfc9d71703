"""``workerpool convert`` of ONNX models: real graphs made with ``onnx.helper`` in, Burnpack
files out, read back with ``burnpack.read``, ``onnx`` and onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.commands import cli

from workerpool import burnpack
from workerpool.models.bert import CONFIG_KEY, TOKENIZER_KEY
from workerpool.models.onnx_layout import (
    GRAPH_TENSOR,
    INITIALIZERS_KEY,
    INLINE_BYTES,
    PLACEHOLDER,
    PLACEHOLDER_FOLDER,
    POOLING_KEY,
)
from workerpool.models.texts import MAX_LENGTH_KEY
from workerpool.weights.convert import convert
from workerpool.weights.onnx_convert import INTEGER_TYPES
from workerpool.weights.sources import ConvertError

onnx = pytest.importorskip("onnx", reason="needs the onnx package")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime")
TensorProto, helper, numpy_helper = onnx.TensorProto, onnx.helper, onnx.numpy_helper

RNG = np.random.default_rng(7)
MLP_WEIGHTS = {
    "layers.0.weight": RNG.standard_normal((3, 8), dtype=np.float32),
    "layers.0.bias": RNG.standard_normal(8, dtype=np.float32),
    "layers.1.weight": RNG.standard_normal((8, 2), dtype=np.float32),
    "layers.1.bias": RNG.standard_normal(2, dtype=np.float32),
}


def mlp_model() -> onnx.ModelProto:
    """x @ w0 + b0, ReLU, @ w1 + b1: float32 [B, 3] to [B, 2]."""
    nodes = [
        helper.make_node("MatMul", ["x", "layers.0.weight"], ["h0"]),
        helper.make_node("Add", ["h0", "layers.0.bias"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "layers.1.weight"], ["h3"]),
        helper.make_node("Add", ["h3", "layers.1.bias"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
        [numpy_helper.from_array(array, name) for name, array in MLP_WEIGHTS.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mixed_model() -> onnx.ModelProto:
    """int64 ids gathered from a float16 table, with a bfloat16, a bool and a scalar beside."""
    initializers = [
        numpy_helper.from_array(np.array([2, 0, 1], dtype=np.int64), "ids"),
        numpy_helper.from_array(np.arange(12, dtype=np.float16).reshape(4, 3), "table"),
        numpy_helper.from_array(np.array([True, False]), "flags"),
        numpy_helper.from_array(np.array(1.5, dtype=np.float64), "scale"),
        helper.make_tensor("bf16", TensorProto.BFLOAT16, [2], [1.0, -2.0]),
    ]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"])], "mixed", [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 3])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def converted(model: onnx.ModelProto, tmp_path: Path) -> burnpack.Burnpack:
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    done = convert(str(tmp_path / "model.onnx"), str(tmp_path / "out.bpk"))
    assert done.tensors == len(model.graph.initializer) + 1 and done.model == "onnx"
    return burnpack.read(tmp_path / "out.bpk")


def assert_holds(pack: burnpack.Burnpack, model: onnx.ModelProto, folder: Path | None = None) -> None:
    """Every initializer of ``model`` byte-identical under its name and aligned; the graph
    tensor ``model`` again, each initializer naming the placeholder with its length."""
    if folder is not None:
        onnx.load_external_data_for_model(model, str(folder))
    originals = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
    assert set(pack.tensors) == {*originals, GRAPH_TENSOR}
    for name, array in originals.items():
        assert pack.tensors[name].tobytes() == array.tobytes() and pack.tensors[name].shape == array.shape
    assert all(info.aligned for info in pack.infos.values())
    graph = onnx.load_from_string(pack.tensors[GRAPH_TENSOR].tobytes())
    assert [node.op_type for node in graph.graph.node] == [node.op_type for node in model.graph.node]
    for tensor in graph.graph.initializer:
        original = originals[tensor.name]
        assert list(tensor.dims) == list(original.shape)
        if tensor.data_type in INTEGER_TYPES and original.nbytes <= INLINE_BYTES:  # shapes, axes: inline too
            assert numpy_helper.to_array(tensor).tobytes() == original.tobytes()
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        assert tensor.data_location == TensorProto.EXTERNAL and not tensor.raw_data
        assert entries == {"location": PLACEHOLDER, "offset": "0", "length": str(original.nbytes)}


def declared(model: onnx.ModelProto) -> str:
    """What convert records of each initializer: its numpy dtype and shape, as the graph has them."""
    return json.dumps({t.name: [numpy_helper.to_array(t).dtype.str, list(t.dims)] for t in model.graph.initializer})


def test_an_mlp_keeps_every_initializer_and_runs_from_the_shared_tensors(tmp_path):
    pack = converted(mlp_model(), tmp_path)
    assert_holds(pack, mlp_model())
    assert dict(pack.metadata) == {"workerpool.model": "onnx", INITIALIZERS_KEY: declared(mlp_model())}
    options = ort.SessionOptions()  # as a worker builds it: the graph, and views of the mapping
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", PLACEHOLDER_FOLDER)
    values = {name: ort.OrtValue.ortvalue_from_numpy(np.asarray(pack.tensors[name])) for name in MLP_WEIGHTS}
    for name, value in values.items():
        options.add_initializer(name, value)
    served = ort.InferenceSession(pack.tensors[GRAPH_TENSOR].tobytes(), options, providers=["CPUExecutionProvider"])
    x = RNG.standard_normal((5, 3), dtype=np.float32)
    expected = np.maximum(x @ MLP_WEIGHTS["layers.0.weight"] + MLP_WEIGHTS["layers.0.bias"], 0) \
        @ MLP_WEIGHTS["layers.1.weight"] + MLP_WEIGHTS["layers.1.bias"]
    np.testing.assert_allclose(served.run(None, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)


def test_integer_half_bfloat16_and_bool_initializers_keep_their_dtypes(tmp_path):
    pack = converted(mixed_model(), tmp_path)
    assert_holds(pack, mixed_model())
    kinds = {name: pack.infos[name].dtype.name for name in ("ids", "table", "flags", "scale", "bf16")}
    assert kinds == {"ids": "I64", "table": "F16", "flags": "Bool(Native)", "scale": "F64", "bf16": "BF16"}
    np.testing.assert_array_equal(burnpack.bf16_to_float32(pack.tensors["bf16"]), [1.0, -2.0])
    assert pack.tensors["scale"].shape == () and pack.tensors["scale"] == 1.5


def test_external_data_beside_the_model_is_read_from_its_file(tmp_path):
    folder = tmp_path / "exported"
    folder.mkdir()
    onnx.save_model(mlp_model(), str(folder / "mlp.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="mlp.onnx.data", size_threshold=0)
    stored = onnx.load(str(folder / "mlp.onnx"), load_external_data=False)
    assert all(tensor.data_location == TensorProto.EXTERNAL for tensor in stored.graph.initializer)
    convert(str(folder / "mlp.onnx"), str(tmp_path / "out.bpk"))
    assert_holds(burnpack.read(tmp_path / "out.bpk"), stored, folder)


def tiny_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


LEGACY_MODULES = {"Transformer": "sentence_transformers.models.Transformer",  # sentence-transformers < 5
                  "Pooling": "sentence_transformers.models.Pooling",
                  "Normalize": "sentence_transformers.models.Normalize"}
MODULES_5 = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
             "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
             "Normalize": "sentence_transformers.sentence_transformer.modules.normalize.Normalize"}


def sentence_transformers_folder(root: Path, pooling: dict[str, Any] | None, normalize: bool,
                                 types: dict[str, str] = LEGACY_MODULES) -> Path:
    """A folder as sentence-transformers' ONNX backend writes it: the model in onnx/, the rest beside."""
    (root / "onnx").mkdir(parents=True)
    onnx.save_model(mlp_model(), str(root / "onnx" / "model.onnx"))
    tiny_tokenizer(root / "tokenizer.json")
    (root / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 512}))
    (root / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    modules = [{"idx": 0, "name": "0", "path": "", "type": types["Transformer"]},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": types["Pooling"]}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": types["Normalize"]})
    (root / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (root / "1_Pooling").mkdir()
        (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 2, **pooling}))
    return root


ALL_OFF = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
           "pooling_mode_mean_sqrt_len_tokens": False}


@pytest.mark.parametrize(("flag", "normalize", "pooling"), [
    ("pooling_mode_mean_tokens", True, {"mode": "mean", "normalize": True}),
    ("pooling_mode_cls_token", False, {"mode": "cls", "normalize": False}),
    ("pooling_mode_max_tokens", True, {"mode": "max", "normalize": True}),
])
def test_a_sentence_transformers_folder_carries_tokenizer_length_config_and_pooling(tmp_path, flag, normalize,
                                                                                      pooling):
    folder = sentence_transformers_folder(tmp_path / "st", ALL_OFF | {flag: True}, normalize)
    done = convert(str(folder), str(tmp_path / "out.bpk"))
    pack = burnpack.read(tmp_path / "out.bpk")
    assert_holds(pack, mlp_model())
    assert done.model == "onnx" and pack.metadata["workerpool.model"] == "onnx"  # not bert: the graph is served
    assert pack.metadata[TOKENIZER_KEY] == (folder / "tokenizer.json").read_text()
    assert pack.metadata[MAX_LENGTH_KEY] == "256"
    assert json.loads(pack.metadata[CONFIG_KEY]) == json.loads((folder / "config.json").read_text())
    assert json.loads(pack.metadata[POOLING_KEY]) == pooling


@pytest.mark.parametrize(("mode", "normalize"), [("mean", True), (["cls"], False), ("max", True)])
def test_the_pooling_of_sentence_transformers_5_is_read_too(tmp_path, mode, normalize):
    pooling = {"embedding_dimension": 2, "pooling_mode": mode, "include_prompt": True}
    folder = sentence_transformers_folder(tmp_path / "st", pooling, normalize, MODULES_5)
    convert(str(folder), str(tmp_path / "out.bpk"))
    metadata = burnpack.read(tmp_path / "out.bpk").metadata
    expected = mode[0] if isinstance(mode, list) else mode
    assert json.loads(metadata[POOLING_KEY]) == {"mode": expected, "normalize": normalize}


@pytest.mark.parametrize("mode", ["lasttoken", ["mean", "max"], 3])
def test_a_pooling_of_sentence_transformers_5_that_is_not_served_is_refused(tmp_path, mode):
    folder = sentence_transformers_folder(tmp_path / "st", {"pooling_mode": mode}, False, MODULES_5)
    with pytest.raises(ConvertError, match=r"pooling .* is not supported \(one of mean, cls, max\)"):
        convert(str(folder), str(tmp_path / "out.bpk"))
    assert not (tmp_path / "out.bpk").exists()


def test_a_bare_folder_with_model_onnx_carries_only_what_it_has(tmp_path):
    (tmp_path / "bare").mkdir()
    onnx.save_model(mixed_model(), str(tmp_path / "bare" / "model.onnx"))
    convert(str(tmp_path / "bare"), str(tmp_path / "out.bpk"), metadata={"origin": "test"})
    pack = burnpack.read(tmp_path / "out.bpk")
    views = {"ids": ["<i8", [3]], "table": ["<f2", [4, 3]], "flags": ["|b1", [2]], "scale": ["<f8", []],
             "bf16": ["<u2", [2]]}  # bfloat16 is viewed as its bits
    assert dict(pack.metadata) == {"workerpool.model": "onnx", "origin": "test", INITIALIZERS_KEY: json.dumps(views)}
    assert_holds(pack, mixed_model())


def broken(tmp_path: Path, case: str) -> tuple[Path, str]:
    """An ONNX source that cannot be converted, and what the one-line error says."""
    source = tmp_path / "x.onnx"
    if case == "garbage":
        source.write_bytes(b"this is not an onnx model\n" * 4)
        return source, "x.onnx: not an ONNX model"
    if case == "truncated":
        whole = mlp_model().SerializeToString()
        source.write_bytes(whole[: len(whole) // 2])
        return source, "x.onnx: not an ONNX model"
    if case in ("missing external data", "short external data"):
        onnx.save_model(mlp_model(), str(source), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="x.data", size_threshold=0)
        if case == "missing external data":
            (tmp_path / "x.data").unlink()
            return source, "external data file .*x.data: No such file"
        (tmp_path / "x.data").write_bytes((tmp_path / "x.data").read_bytes()[:-4])
        return source, "the tensor ends at byte"
    model = mlp_model()
    if case == "clashing name":
        model.graph.initializer[0].name = GRAPH_TENSOR
        onnx.save_model(model, str(source))
        return source, f"initializer {GRAPH_TENSOR}: the name is the one workerpool keeps for the graph"
    if case == "string initializer":
        model.graph.initializer.append(helper.make_tensor("words", TensorProto.STRING, [1], [b"a"]))
        onnx.save_model(model, str(source))
        return source, "initializer words has ONNX type STRING, which Burnpack cannot store"
    assert case == "empty graph"
    onnx.save_model(helper.make_model(helper.make_graph([], "empty", [], [])), str(source))
    return source, "the ONNX graph has no initializers and no nodes"


BROKEN = ["garbage", "truncated", "missing external data", "short external data", "clashing name",
          "string initializer", "empty graph"]


@pytest.mark.parametrize("case", BROKEN)
def test_what_cannot_be_converted_is_one_line_and_writes_nothing(tmp_path, case):
    source, message = broken(tmp_path, case)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ConvertError, match=message) as refused:
        convert(str(source), str(tmp_path / "out.bpk"))
    assert "\n" not in str(refused.value)
    assert sorted(tmp_path.iterdir()) == before


def test_an_unsupported_pooling_and_tensor_globs_are_refused(tmp_path):
    folder = sentence_transformers_folder(tmp_path / "st", ALL_OFF | {"pooling_mode_mean_sqrt_len_tokens": True},
                                          normalize=False)
    with pytest.raises(ConvertError, match="pooling pooling_mode_mean_sqrt_len_tokens is not supported"):
        convert(str(folder), str(tmp_path / "out.bpk"))
    (folder / "1_Pooling" / "config.json").unlink()
    with pytest.raises(ConvertError, match="--include and --exclude do not apply to an ONNX model"):
        convert(str(folder), str(tmp_path / "out.bpk"), exclude=["layers.1.*"])
    assert not (tmp_path / "out.bpk").exists()


@pytest.mark.process
def test_the_command_line_refuses_in_one_line_with_exit_1(tmp_path):
    source, message = broken(tmp_path, "short external data")
    done = cli("convert", source, tmp_path / "out.bpk")
    assert done.returncode == 1 and message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out.bpk").exists()
