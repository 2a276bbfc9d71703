"""Small ONNX graphs made with ``onnx.helper``, and the Burnpack files the ``onnx`` model serves.

:func:`write_onnx_bpk` converts a model as ``workerpool convert`` does a real ``.onnx`` file.
Each builder returns a model with its weights inside, from which the tests build onnxruntime's
reference answers.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from workerpool import burnpack
from workerpool.weights.convert import convert

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def write_onnx_bpk(path: str | os.PathLike, model: onnx.ModelProto,
                   drop: tuple[str, ...] = ()) -> str:
    """Convert ``model`` to ``path``; the initializers named in ``drop`` are then left out of
    the file (but stay named in the graph)."""
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "model.onnx")
        onnx.save_model(model, source)
        convert(source, os.fspath(path))
    if drop:
        pack = burnpack.read(path)
        kept = {name: np.array(tensor) for name, tensor in pack.tensors.items() if name not in drop}
        burnpack.write(path, kept, metadata=dict(pack.metadata))
    return os.fspath(path)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], weights: dict[str, np.ndarray],
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs,
                              [numpy_helper.from_array(value, name) for name, value in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def mlp(width: int = 16, hidden: int = 32, out: int = 8, *, batch: str | int = "batch",
        seed: int = 0) -> onnx.ModelProto:
    """``relu(x @ w1 + b1) @ w2 + b2``; ``batch`` is the leading axis: a symbol, or fixed."""
    rng = np.random.default_rng(seed)
    weights = {"w1": rng.standard_normal((width, hidden), dtype=np.float32) / width ** 0.5,
               "b1": rng.standard_normal(hidden, dtype=np.float32),
               "w2": rng.standard_normal((hidden, out), dtype=np.float32) / hidden ** 0.5,
               "b2": rng.standard_normal(out, dtype=np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, [batch, width])],
                  [helper.make_tensor_value_info("y", FLOAT, [batch, out])], weights)


def mlp_of_size(size: int, width: int = 1024) -> onnx.ModelProto:
    """An mlp of about ``size`` bytes of float32 weights, in square ``width`` layers whose
    weights are used transposed (``Transpose`` then ``MatMul``): the graph an optimiser would
    fold into private copies."""
    layers = max(1, size // (4 * width * width))
    rng = np.random.default_rng(1)
    weights, nodes = {}, []
    for i in range(layers):
        weights[f"w{i}"] = rng.standard_normal((width, width), dtype=np.float32) / width ** 0.5
        nodes += [helper.make_node("Transpose", [f"w{i}"], [f"t{i}"], perm=[1, 0]),
                  helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"t{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], ["y" if i == layers - 1 else f"y{i}"])]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, ["batch", width])],
                  [helper.make_tensor_value_info("y", FLOAT, ["batch", width])], weights)


def block(width: int = 16, seed: int = 0) -> onnx.ModelProto:
    """LayerNorm, a Gelu MLP and a Softmax over the features (opset 20, for Gelu)."""
    rng = np.random.default_rng(seed)
    weights = {"scale": rng.standard_normal(width, dtype=np.float32),
               "bias": rng.standard_normal(width, dtype=np.float32),
               "w": rng.standard_normal((width, width), dtype=np.float32) / width ** 0.5}
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w"], ["m"]),
             helper.make_node("Gelu", ["m"], ["g"]),
             helper.make_node("Softmax", ["g"], ["y"], axis=-1)]
    return _model(nodes, [helper.make_tensor_value_info("x", FLOAT, ["batch", "tokens", width])],
                  [helper.make_tensor_value_info("y", FLOAT, ["batch", "tokens", width])],
                  weights, opset=20)


def embedding(vocabulary: int = 50, width: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Token ids (int64 ``[batch, tokens]``) and a float mask in, two outputs: the embedded
    tokens and their masked mean."""
    rng = np.random.default_rng(seed)
    weights = {"table": rng.standard_normal((vocabulary, width), dtype=np.float32),
               "axes": np.array([1], np.int64)}
    nodes = [helper.make_node("Gather", ["table", "ids"], ["states"]),
             helper.make_node("Unsqueeze", ["mask", "axes"], ["mask3"]),
             helper.make_node("Transpose", ["mask3"], ["maskT"], perm=[0, 2, 1]),
             helper.make_node("Mul", ["states", "maskT"], ["masked"]),
             helper.make_node("ReduceSum", ["masked", "axes"], ["total"], keepdims=0),
             helper.make_node("ReduceSum", ["mask", "axes"], ["count"], keepdims=1),
             helper.make_node("Div", ["total", "count"], ["pooled"])]
    inputs = [helper.make_tensor_value_info("ids", INT64, ["batch", "tokens"]),
              helper.make_tensor_value_info("mask", FLOAT, ["batch", "tokens"])]
    outputs = [helper.make_tensor_value_info("states", FLOAT, ["batch", "tokens", width]),
               helper.make_tensor_value_info("pooled", FLOAT, ["batch", width])]
    return _model(nodes, inputs, outputs, weights)
