"""The served model as the HTTP protocols describe it: its name there, its version (the
generation) and its declared inputs and outputs, with the names those protocols give the
model's single unnamed input and output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadRequest
from ..models.contract import TEXT

UNNAMED_INPUT = "input"  # what the protocols call the model's single unnamed input and output
UNNAMED_OUTPUT = "output"


@dataclass(frozen=True)
class Tensor:
    """One declared input or output: its name here, numpy dtype string (or ``"text"``), shape
    with None for a free axis (None when undeclared), and the other dtypes it takes."""

    name: str
    dtype: str | None
    shape: list[int | None] | None
    also_accepted: tuple[str, ...] = ()
    wire_name: str | None = None  # the name on the router's protocol; None for the unnamed one


@dataclass(frozen=True)
class ModelView:
    """The served model as the routes describe it: ``version`` is the generation."""

    name: str
    kind: str
    version: int
    inputs: list[Tensor]
    outputs: list[Tensor]
    task: str | None = None  # a model of texts': "embed" or "classify"
    labels: tuple[str, ...] = ()  # a classifier's, by index
    max_input_tokens: int | None = None  # a model of texts': the tokens one text may have
    normalized: bool = False  # an embedder's embeddings are unit length already
    max_batch: int | None = None  # --max-batch, as the front door knows it

    def text_facts(self) -> dict[str, Any]:
        """What a model of texts tells of them beyond its inputs and outputs (none otherwise)."""
        if self.task is None:
            return {}
        return {"task": self.task, "max_input_tokens": self.max_input_tokens,
                **({"labels": list(self.labels)} if self.labels else {})}

    @property
    def takes_texts(self) -> bool:
        return any(tensor.dtype == TEXT for tensor in self.inputs)

    def input(self, name: str) -> Tensor:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        raise BadRequest(f"model {self.name!r} has no input {name!r}; its inputs are "
                         f"{', '.join(repr(t.name) for t in self.inputs)}")


@dataclass(frozen=True)
class ModelState:
    """A served model as the supervisor knows it: its signature (what ``info`` lists), its kind
    (``mlp``, ``bert``...) and its generation."""

    signature: Mapping[str, Any]
    kind: str
    generation: int
    max_batch: int | None = None  # --max-batch: rows (texts) one forward pass may take


@dataclass(frozen=True)
class Answer:
    """Outputs by name here, and which generation and worker gave them."""

    outputs: dict[str, np.ndarray]
    version: int | None
    worker_pid: int | None


def view_of(name: str, info: Mapping[str, Any], generation: int, max_batch: int | None = None) -> ModelView:
    """The view of a model whose signature is ``info`` (as ``describe`` gives it)."""
    def tensors(entries: Any, unnamed: str) -> list[Tensor]:
        found = []
        for entry in entries if isinstance(entries, list) else []:
            wire = entry.get("name")
            found.append(Tensor(wire or unnamed, entry.get("dtype"), entry.get("shape"),
                                tuple(entry.get("also_accepted") or ()), wire))
        return found

    task, labels, limit = info.get("task"), info.get("labels"), info.get("max_input_tokens")
    return ModelView(name, str(info.get("model", "")), generation,
                     tensors(info.get("inputs"), UNNAMED_INPUT), tensors(info.get("outputs"), UNNAMED_OUTPUT),
                     task if isinstance(task, str) else None,
                     tuple(map(str, labels)) if isinstance(labels, list) else (),
                     limit if type(limit) is int else None, info.get("normalized") is True, max_batch)


def wire_inputs(view: ModelView, inputs: Mapping[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
    """The arrays as the model takes them: the unnamed one alone, others by name."""
    unknown = sorted(set(inputs) - {tensor.name for tensor in view.inputs})
    if unknown:
        view.input(unknown[0])  # raises, naming the inputs there are
    if len(inputs) == 1:
        (name, array), = inputs.items()
        if view.input(name).wire_name is None:
            return array
    return {view.input(name).wire_name or name: array for name, array in inputs.items()}
