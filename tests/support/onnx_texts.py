"""A tiny BERT-like ONNX encoder in a sentence-transformers folder, converted as ``workerpool
convert`` does it, and the reference embeddings of texts: onnxruntime on the original graph,
one text at a time, pooled in numpy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import tokenizers
from onnx import TensorProto, helper, numpy_helper

from workerpool.weights.convert import convert

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "a", "text", "the", "cat", "sat"]
HIDDEN, POSITIONS = 8, 32
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
FLAGS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens"}


def encoder(ids_type: int = TensorProto.INT64, *, token_types: bool = True) -> onnx.ModelProto:
    """Word, position (and token type) embeddings, a LayerNorm, then zeros where the mask is 0:
    ``last_hidden_state`` [batch, seq, HIDDEN], and a pooled output beside it."""
    rng = np.random.default_rng(11)
    weights = {"words": rng.standard_normal((len(WORDS), HIDDEN), dtype=np.float32),
               "positions": rng.standard_normal((POSITIONS, HIDDEN), dtype=np.float32),
               "types": rng.standard_normal((2, HIDDEN), dtype=np.float32),
               "scale": rng.standard_normal(HIDDEN, dtype=np.float32),
               "bias": rng.standard_normal(HIDDEN, dtype=np.float32),
               "one": np.array(1, np.int64), "zero": np.array(0, np.int64), "last": np.array([-1], np.int64)}
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"]),
             helper.make_node("Shape", ["input_ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["length"]),
             helper.make_node("Range", ["zero", "length", "one"], ["where"]),
             helper.make_node("Gather", ["positions", "where"], ["p"]),
             helper.make_node("Add", ["w", "p"], ["wp"])]
    if token_types:
        nodes += [helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
                  helper.make_node("Add", ["wp", "t"], ["x"])]
    else:
        del weights["types"]
        nodes.append(helper.make_node("Identity", ["wp"], ["x"]))
    nodes += [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"], axis=-1),
              helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
              helper.make_node("Unsqueeze", ["m", "last"], ["m3"]),
              helper.make_node("Mul", ["n", "m3"], ["last_hidden_state"]),
              helper.make_node("ReduceMax", ["n", "one_axis"], ["pooler_output"], keepdims=0)]
    weights["one_axis"] = np.array([1], np.int64)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if token_types else [])
    inputs = [helper.make_tensor_value_info(name, ids_type, ["batch", "seq"]) for name in names]
    outputs = [helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", HIDDEN]),
               helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN])]
    graph = helper.make_graph(nodes, "encoder", inputs, outputs,
                              [numpy_helper.from_array(value, name) for name, value in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tokenizer() -> tokenizers.Tokenizer:
    """Words of :data:`WORDS` (others [UNK]) between [CLS] and [SEP], as BERT's tokenizer frames them."""
    made = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)},
                                                            unk_token="[UNK]"))
    made.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    made.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return made


def write_folder(root: Path, model: onnx.ModelProto, mode: str | None = "mean",
                 normalize: bool = True) -> Path:
    """A sentence-transformers folder: the graph, tokenizer.json, config.json and, unless
    ``mode`` is None, 1_Pooling/config.json and modules.json (with Normalize if ``normalize``)."""
    root.mkdir(parents=True)
    onnx.save_model(model, root / "model.onnx")
    (root / "tokenizer.json").write_text(tokenizer().to_str())
    (root / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "max_position_embeddings": POSITIONS}))
    if mode is not None:
        (root / "1_Pooling").mkdir()
        flags = dict.fromkeys(FLAGS.values(), False) | {FLAGS[mode]: True}
        (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": HIDDEN, **flags}))
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        (root / "modules.json").write_text(json.dumps(modules + [NORMALIZE] * normalize))
    return root


def converted(root: Path, model: onnx.ModelProto, mode: str | None = "mean", normalize: bool = True) -> str:
    """:func:`write_folder` converted by the real ``convert`` to ``root``.bpk."""
    path = f"{root}.bpk"
    convert(str(write_folder(root, model, mode, normalize)), path)
    return path


def reference(model: onnx.ModelProto, texts: list[str], mode: str, normalize: bool) -> np.ndarray:
    """Each text's embedding, run alone (no padding) by onnxruntime on the original graph."""
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    dtypes = {arg.name: np.int32 if arg.type == "tensor(int32)" else np.int64 for arg in session.get_inputs()}
    cutting = tokenizer()
    cutting.enable_truncation(POSITIONS)
    rows = []
    for text in texts:
        encoding = cutting.encode(text)
        given = {"input_ids": encoding.ids, "attention_mask": encoding.attention_mask,
                 "token_type_ids": encoding.type_ids}
        feeds = {name: np.array([given[name]], dtype) for name, dtype in dtypes.items()}
        states = session.run(["last_hidden_state"], feeds)[0][0]
        pooled = {"mean": states.mean(axis=0), "cls": states[0], "max": states.max(axis=0)}[mode]
        rows.append(pooled / np.linalg.norm(pooled) if normalize else pooled)
    return np.array(rows, np.float32)
