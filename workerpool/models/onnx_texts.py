"""Which texts an ONNX graph answers, and how: what the built-in ``onnx`` model asks once it
has its session.

A graph answers texts when the file carries a tokenizer and the graph's inputs are
``input_ids`` and ``attention_mask`` (and maybe ``token_type_ids``) of an integer dtype, and
either the file carries a pooling (as ``convert`` writes it from a sentence-transformers
folder) and the graph gives token states to pool (the rank-3 float output
``last_hidden_state``, else the first one): an embedder; or the file carries no pooling and
the graph gives a rank-2 float ``logits`` (a sequence classifier or cross-encoder as optimum
exports it): a classifier, its labels named by its config.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import NotAJSONObject, json_object
from .bert import CONFIG_KEY, label_count, labels
from .onnx_layout import NAME, POOLING_KEY
from .texts import (
    LOGITS,
    TOKENIZER_KEY,
    Encoder,
    TextEncoder,
    classify,
    max_length,
    pooling_of,
    text_outputs,
    tokenizer,
)

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the first two needed for texts
STATES = "last_hidden_state"  # the token states texts are pooled from, else the first rank-3 output
DEFAULT_MAX_LENGTH = 512  # tokens kept per text when the file names no max_seq_length (BERT's)
PASS_OVERHEAD = 8.0  # what a pass costs beyond its tokens, in tokens (see text_passes)


@dataclass(frozen=True)
class Output:
    """One of the graph's outputs: its name, its dims (a str for a named axis), its dtype."""

    name: str
    dims: list[Any]
    dtype: np.dtype


@dataclass(frozen=True)
class GraphTexts:
    """How the graph answers texts: the output each pass reads (``read``), the encoder, and
    what the model declares for texts."""

    read: str
    encoder: TextEncoder
    shapes: dict[str, tuple[int | None, ...]]
    dtypes: dict[str, type]


def graph_texts(metadata: Mapping[str, str], inputs: Mapping[str, np.dtype], outputs: list[Output],
                encode: Encoder) -> GraphTexts | None:
    """How the graph answers texts (``encode`` runs a pass and reads what ``read`` names), or
    None when it takes none (see the module)."""
    if TOKENIZER_KEY not in metadata or not set(TEXT_INPUTS[:2]) <= set(inputs) <= set(TEXT_INPUTS) \
            or not all(dtype.kind in "iu" for dtype in inputs.values()):
        return None
    states = sorted((out for out in outputs if len(out.dims) == 3 and out.dtype.kind == "f"),
                    key=lambda out: out.name != STATES)
    logits = [out for out in outputs if out.name == LOGITS and len(out.dims) == 2 and out.dtype.kind == "f"]
    length = max_length(NAME, metadata, DEFAULT_MAX_LENGTH)
    if POOLING_KEY in metadata and states:
        found = tokenizer(NAME, metadata[TOKENIZER_KEY], length)
        encoder = TextEncoder(NAME, found, encode, pooling_of(NAME, metadata[POOLING_KEY]), PASS_OVERHEAD, length)
        return GraphTexts(states[0].name, encoder, *text_outputs(_width(states[0].dims, metadata)))
    if POOLING_KEY not in metadata and logits:
        found = tokenizer(NAME, metadata[TOKENIZER_KEY], length)
        width = logits[0].dims[1]
        config = _config(metadata)
        count = width if isinstance(width, int) else label_count(config)
        encoder = TextEncoder(NAME, found, encode, classify, PASS_OVERHEAD, length, LOGITS, labels(config, count))
        return GraphTexts(LOGITS, encoder, *text_outputs(width if isinstance(width, int) else None, LOGITS))
    return None


def _width(dims: list[Any], metadata: Mapping[str, str]) -> int | None:
    """The embedding's width: the token states' last axis, else the model's ``hidden_size``
    from its config.json, else unknown (None)."""
    if isinstance(dims[-1], int):
        return dims[-1]
    size = _config(metadata).get("hidden_size")
    return size if type(size) is int and size > 0 else None


def _config(metadata: Mapping[str, str]) -> dict[str, Any]:
    """The model's config.json, if the file carries a readable one; else empty."""
    try:
        return json_object(metadata.get(CONFIG_KEY, "{}"))
    except NotAJSONObject:
        return {}
