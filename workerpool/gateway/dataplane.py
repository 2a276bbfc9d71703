"""What the HTTP routes ask of the pool, in no protocol's terms: the model's description,
whether a name and version are served, and inference on arrays or texts.

Like KServe's data plane it knows no transport: the REST adapters (``kserve``, ``openai``)
turn requests into these calls and their results or errors into responses. Every inference goes
through the router as a ZeroMQ client's would (``upstream``), so it batches, queues, retries
and drains exactly as theirs do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BadRequest
from ..models.contract import TEXT
from ..protocol import messages as protocol
from .upstream import RouterLink

UNNAMED_INPUT = "input"  # what the protocols call the model's single unnamed input and output
UNNAMED_OUTPUT = "output"


class ModelNotFound(LookupError):
    """No model of that name, or not that version, is served here."""


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
class Answer:
    """Outputs by name here, and which generation and worker gave them."""

    outputs: dict[str, np.ndarray]
    version: int | None
    worker_pid: int | None


Describe = Callable[[], tuple[Mapping[str, Any], int]]


class DataPlane:
    """The pool behind the front door, named ``model_name``; ``describe`` gives the served
    model's signature (inputs, outputs, as ``info`` has them) and its generation, as the
    supervisor knows them: describing the model costs no request."""

    def __init__(self, link: RouterLink, model_name: str, describe: Describe, *, request_timeout: float) -> None:
        self.link = link
        self.model_name = model_name
        self.request_timeout = request_timeout
        self._describe = describe
        self._view: ModelView | None = None

    def model(self) -> ModelView:
        signature, generation = self._describe()
        view = self._view
        if view is None or view.version != generation:
            view = self._view = _view(self.model_name, signature, generation)
        return view

    def resolve(self, name: str, version: str | None = None) -> ModelView:
        """The model if ``name`` (and ``version``, when given) is what is served; else
        ``ModelNotFound``."""
        if name != self.model_name:
            raise ModelNotFound(f"no model named {name!r} is served here; this server serves "
                                f"{self.model_name!r}")
        view = self.model()
        if version is not None and version != str(view.version):
            raise ModelNotFound(f"model {name!r} serves version {view.version}, not {version!r}")
        return view

    async def infer(self, lane: bytes, view: ModelView, inputs: Mapping[str, np.ndarray] | list[str], *,
                    deadline: float | None) -> Answer:
        """Run the model on named arrays (names as ``view`` gives them) or on texts."""
        budget = self.request_timeout if deadline is None else deadline
        if isinstance(inputs, list) and not 0 < len(inputs) <= protocol.MAX_TEXTS:
            raise BadRequest(f"a request takes 1 to {protocol.MAX_TEXTS} texts, not {len(inputs)}")
        payload = inputs if isinstance(inputs, list) else _wire_inputs(view, inputs)
        reply = await self.link.call(lane, payload, method=protocol.METHOD_INFER, deadline=budget,
                                     patience=budget + self.request_timeout)
        generation = reply.header.get("generation")
        outputs = {name or UNNAMED_OUTPUT: array for name, array in zip(reply.names, reply.arrays, strict=True)}
        return Answer(outputs, generation if isinstance(generation, int) else None, reply.header.get("worker_pid"))


def _wire_inputs(view: ModelView, inputs: Mapping[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
    """The arrays as the router's protocol takes them: the unnamed one alone, others by name."""
    unknown = sorted(set(inputs) - {tensor.name for tensor in view.inputs})
    if unknown:
        view.input(unknown[0])  # raises, naming the inputs there are
    if len(inputs) == 1:
        (name, array), = inputs.items()
        if view.input(name).wire_name is None:
            return array
    return {view.input(name).wire_name or name: array for name, array in inputs.items()}


def _view(name: str, info: Mapping[str, Any], generation: int) -> ModelView:
    def tensors(entries: Any, unnamed: str) -> list[Tensor]:
        found = []
        for entry in entries if isinstance(entries, list) else []:
            wire = entry.get("name")
            found.append(Tensor(wire or unnamed, entry.get("dtype"), entry.get("shape"),
                                tuple(entry.get("also_accepted") or ()), wire))
        return found

    return ModelView(name, str(info.get("model", "")), generation,
                     tensors(info.get("inputs"), UNNAMED_INPUT), tensors(info.get("outputs"), UNNAMED_OUTPUT))
