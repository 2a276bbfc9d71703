"""The BERT encoder family as Hugging Face stores it, in numpy, with sentence embeddings or
a sequence classifier's logits.

Hyper-parameters come from the ``config.json`` that ``workerpool convert`` carries in the
metadata; Linear weights are used as stored (``[out, in]``) through transposed views, never
copied; exact GELU to float32 precision. Tensor names are ``BertModel``'s, or
``BertForSequenceClassification``'s (the same under ``bert.``). The output ``embedding`` is
the mean of the last hidden states over the attention mask, L2-normalised, as
sentence-transformers computes it. A config whose ``architectures`` is
``BertForSequenceClassification`` (a cross-encoder, a text classifier) gives ``logits``
instead: ``classifier(tanh(pooler(first token)))``, as transformers computes them, with the
labels of its ``id2label``.

Inputs are ``input_ids`` and ``attention_mask`` (and optionally ``token_type_ids``), int64
``[B, L]``; or, when the file carries a ``tokenizer.json``, a list of texts, which the worker
tokenizes and embeds as :mod:`.texts` does for every model that takes texts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import NotAJSONObject, json_object
from .base import Model, ModelError, ModelInputError
from .ops import gelu_float32
from .tensors import require_tensor
from .texts import (
    LOGITS,
    MEAN_NORMALIZED,
    TOKENIZER_KEY,
    TextEncoder,
    max_length,
    text_outputs,
    tokenizer,
)

NAME = "bert"
CONFIG_KEY = "workerpool.hf_config"  # config.json, as text
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
MAX_TOKENS = 65_536  # input_ids per request: its last_hidden_state alone is 1.5 KiB a token here
CHUNK_TOKENS = 4096  # tokens of input_ids per pass: attention's memory grows with length squared
PASS_OVERHEAD = 16.0  # what a pass costs beyond its tokens, in tokens (see text_passes)
CLASSIFIER = "BertForSequenceClassification"


class Bert(Model):
    """A BERT encoder built on ``encoder.layer.{i}.*`` tensors without copying them."""

    name = NAME
    input_dtype = None  # named integer inputs or texts, checked here
    output_dtype = None

    def __init__(self, weights: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
        config = _config(metadata)
        self.hidden, self.heads = config["hidden_size"], config["num_attention_heads"]
        self.text_output_shape, self.text_output_dtype = text_outputs(self.hidden)
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        layers = config["num_hidden_layers"]

        root = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""

        def tensor(name: str, *shape: int | str) -> np.ndarray:
            return require_tensor(NAME, weights, root + name, shape)

        hidden, inner = self.hidden, config["intermediate_size"]
        self.words = tensor("embeddings.word_embeddings.weight", "vocab", hidden)
        self.positions = tensor("embeddings.position_embeddings.weight", "positions", hidden)
        self.types = tensor("embeddings.token_type_embeddings.weight", "types", hidden)
        self.embedding_norm = _norm(tensor, "embeddings.LayerNorm", hidden)
        self.layers = []
        for i in range(layers):
            prefix = f"encoder.layer.{i}"
            self.layers.append({
                "query": _linear(tensor, f"{prefix}.attention.self.query", hidden, hidden),
                "key": _linear(tensor, f"{prefix}.attention.self.key", hidden, hidden),
                "value": _linear(tensor, f"{prefix}.attention.self.value", hidden, hidden),
                "attention_out": _linear(tensor, f"{prefix}.attention.output.dense", hidden, hidden),
                "attention_norm": _norm(tensor, f"{prefix}.attention.output.LayerNorm", hidden),
                "intermediate": _linear(tensor, f"{prefix}.intermediate.dense", inner, hidden),
                "output": _linear(tensor, f"{prefix}.output.dense", hidden, inner),
                "output_norm": _norm(tensor, f"{prefix}.output.LayerNorm", hidden),
            })
        self.classifier = CLASSIFIER in (config.get("architectures") or ())
        unused = ("embeddings.position_ids",) if self.classifier else ("embeddings.position_ids", "pooler.")
        self.tensor_names = frozenset(name for name in weights if not name.removeprefix(root).startswith(unused))
        self.head = _classifier_head(tensor, weights, hidden, config) if self.classifier else None
        self.max_length = min(max_length(NAME, metadata, len(self.positions)), len(self.positions))
        found = tokenizer(NAME, metadata.get(TOKENIZER_KEY), self.max_length)
        self.text_encoder = None if found is None else TextEncoder(
            NAME, found, self._encode_rows, self._logits if self.classifier else MEAN_NORMALIZED,
            PASS_OVERHEAD, self.max_length, LOGITS if self.classifier else "embedding",
            labels(config, len(self.head[1][1])) if self.head is not None else ())
        self.accepts_text = self.text_encoder is not None  # what info tells clients it takes
        if self.head is not None:
            self.text_output_shape, self.text_output_dtype = text_outputs(len(self.head[1][1]), LOGITS)

    def __call__(self, inputs: Any) -> Any:
        if isinstance(inputs, list):
            return self._embed_texts(inputs)
        ids, mask, types = self._arrays(inputs)
        states = self._encode(ids, mask, types)
        if self.classifier:
            return {LOGITS: self._logits(states, mask), "last_hidden_state": states}
        return {"embedding": MEAN_NORMALIZED(states, mask), "last_hidden_state": states}

    def _logits(self, states: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """A sequence classifier's logits ``[B, labels]``: its pooler (dense and tanh over the
        first token's state), then its classifier."""
        assert self.head is not None
        pooler, classifier = self.head
        return _apply(np.tanh(_apply(states[:, 0], pooler)), classifier).astype(np.float32)

    def __repr__(self) -> str:
        return f"<Bert {self.hidden} hidden, {len(self.layers)} layers, {self.heads} heads>"

    # Inputs.

    def _embed_texts(self, texts: Sequence[Any]) -> dict[str, np.ndarray]:
        if self.text_encoder is None:
            raise ModelInputError(f"{NAME}: this file carries no tokenizer: send input_ids and "
                                  "attention_mask")
        return self.text_encoder(texts)

    def _arrays(self, inputs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not isinstance(inputs, Mapping) or not {"input_ids", "attention_mask"} <= set(inputs) \
                or not set(inputs) <= set(INPUT_NAMES):
            raise ModelInputError(f"{NAME}: expected arrays named input_ids and attention_mask "
                                  "(and optionally token_type_ids), int64 [B, L], or a list of texts")
        ids = inputs["input_ids"]
        if isinstance(ids, np.ndarray) and ids.ndim == 2 and ids.shape[1] == 0:
            raise ModelInputError(f"{NAME}: input_ids has no tokens (shape {list(ids.shape)})")
        for name in inputs:
            value = inputs[name]
            if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu" or value.ndim != 2 \
                    or value.shape != ids.shape:
                raise ModelInputError(f"{NAME}: {name} must be an integer array of the same [B, L] "
                                      f"shape as input_ids {list(np.shape(ids))}")
        if ids.shape[1] > len(self.positions):
            raise ModelInputError(f"{NAME}: {ids.shape[1]} tokens, over the model's "
                                  f"{len(self.positions)} positions")
        if ids.size > MAX_TOKENS:
            raise ModelInputError(f"{NAME}: {ids.size} tokens in one request, over {MAX_TOKENS}")
        types = inputs.get("token_type_ids", np.zeros_like(ids))
        for name, value, limit in (("input_ids", ids, len(self.words)),
                                   ("token_type_ids", types, len(self.types)),
                                   ("attention_mask", inputs["attention_mask"], 2)):
            if value.size and (value.min() < 0 or value.max() >= limit):
                raise ModelInputError(f"{NAME}: {name} must be from 0 to {limit - 1}")
        return ids.astype(np.int64), inputs["attention_mask"].astype(np.int64), types.astype(np.int64)

    # The encoder.

    def _encode(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        """The last hidden states, ``CHUNK_TOKENS`` tokens of rows at a time."""
        rows = max(1, CHUNK_TOKENS // max(ids.shape[1], 1))
        if len(ids) <= rows:
            return self._encode_rows(ids, mask, types)
        return np.concatenate([self._encode_rows(ids[i:i + rows], mask[i:i + rows], types[i:i + rows])
                               for i in range(0, len(ids), rows)])

    def _encode_rows(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        batch, length = ids.shape
        x = self.words[ids] + self.positions[:length] + self.types[types]
        x = _layer_norm(x, *self.embedding_norm, self.eps)
        # Masked keys get the lowest float32, as transformers does: exp() of it is exactly 0.
        bias = ((1 - mask) * np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
        size = self.hidden // self.heads
        scale = np.float32(1 / math.sqrt(size))

        def split(t: np.ndarray) -> np.ndarray:
            return t.reshape(batch, length, self.heads, size).transpose(0, 2, 1, 3)

        for layer in self.layers:
            q, k, v = (split(_apply(x, layer[name])) for name in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2)
            scores *= scale
            scores += bias
            context = _softmax(scores) @ v
            context = context.transpose(0, 2, 1, 3).reshape(batch, length, self.hidden)
            x = _layer_norm(_apply(context, layer["attention_out"]) + x, *layer["attention_norm"], self.eps)
            inner = gelu_float32(_apply(x, layer["intermediate"]))
            x = _layer_norm(_apply(inner, layer["output"]) + x, *layer["output_norm"], self.eps)
        return x


def _config(metadata: Mapping[str, str]) -> dict[str, Any]:
    if CONFIG_KEY not in metadata:
        raise ModelError(f"{NAME}: the file's metadata has no {CONFIG_KEY} (convert a model folder "
                         "with its config.json: workerpool convert FOLDER OUT.bpk)")
    try:
        config = json_object(metadata[CONFIG_KEY])
    except NotAJSONObject as exc:
        raise ModelError(f"{NAME}: {CONFIG_KEY} is not valid JSON: {exc}" if exc.found is None
                         else f"{NAME}: {CONFIG_KEY} is not a JSON object") from exc
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size"):
        if type(config.get(key)) is not int or config[key] <= 0:
            raise ModelError(f"{NAME}: config {key} must be a positive integer")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ModelError(f"{NAME}: hidden_size is not a multiple of num_attention_heads")
    if config.get("hidden_act", "gelu") != "gelu":
        raise ModelError(f"{NAME}: activation {config['hidden_act']!r} is not supported (only exact gelu)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelError(f"{NAME}: only absolute position embeddings are supported")
    return config


Linear = tuple[np.ndarray, np.ndarray]


def _classifier_head(tensor: Any, weights: Mapping[str, np.ndarray], hidden: int,
                     config: Mapping[str, Any]) -> tuple[Linear, Linear]:
    """A sequence classifier's pooler (``tensor`` finds it beside the encoder) and classifier
    (outside ``bert.``), as many labels wide as its config says."""
    def outside(name: str, *shape: int | str) -> np.ndarray:
        return require_tensor(NAME, weights, name, shape)

    return (_linear(tensor, "pooler.dense", hidden, hidden),
            _linear(outside, "classifier", label_count(config), hidden))


def label_count(config: Mapping[str, Any]) -> int:
    """A classifier's labels, as transformers counts them: ``num_labels``, else its
    ``id2label``'s, else 2."""
    named = config.get("id2label")
    count = config.get("num_labels", len(named) if isinstance(named, Mapping) and named else 2)
    if type(count) is not int or count < 1:
        raise ModelError(f"{NAME}: config num_labels must be a positive integer")
    return count


def labels(config: Mapping[str, Any], count: int) -> tuple[str, ...]:
    """The names of a classifier's ``count`` labels by index, from its config's ``id2label``
    (``LABEL_0`` and so on where it names none)."""
    named = config.get("id2label")
    named = named if isinstance(named, Mapping) else {}
    return tuple(str(named.get(str(i), named.get(i, f"LABEL_{i}"))) for i in range(count))


def _linear(tensor: Any, prefix: str, out: int, inp: int) -> Linear:
    """A Hugging Face Linear: its ``[out, in]`` weight as a transposed view, and its bias."""
    return tensor(f"{prefix}.weight", out, inp).T, tensor(f"{prefix}.bias", out)


def _norm(tensor: Any, prefix: str, size: int) -> Linear:
    return tensor(f"{prefix}.weight", size), tensor(f"{prefix}.bias", size)


def _apply(x: np.ndarray, linear: Linear) -> np.ndarray:
    """``x @ W.T + b`` over the last axis, as one matrix product for every token of the batch."""
    weight, bias = linear
    y = x.reshape(-1, x.shape[-1]) @ weight
    y += bias
    return y.reshape(*x.shape[:-1], weight.shape[1])


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    centred /= np.sqrt(variance + np.float32(eps))
    centred *= weight
    centred += bias
    return centred


def _softmax(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores
