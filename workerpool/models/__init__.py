"""Numpy models built on a weight file's tensors without copying them.

A model is made by a factory ``factory(weights, metadata)`` from the file's tensors (name to
array, typically read-only views of one shared mapping) and its metadata (text to text). It
keeps those arrays themselves, so every process serving the file shares one copy of the
weights. The result is called with an input array (or a mapping of named arrays) and returns
an array.

Which factory: a built-in name (:data:`BUILTIN_MODELS`) or ``package.module:factory``, given
explicitly, else from the metadata key ``workerpool.model``, else recognised from the tensor
names and shapes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from ..errors import exception_text
from . import bert, mlp, mnist, onnx_layout
from .base import MODEL_KEY, BuildOptions, ModelError, ModelInputError
from .contract import Contract, ModelOutputError, array_input, format_entries, takes_text
from .mlp import GeneratedMlp, Mlp, generate_mlp
from .mnist import BurnMnist
from .onnx_model import OnnxModel

Factory = Callable[[Mapping[str, np.ndarray], Mapping[str, str]], Callable[..., Any]]


class BuiltinModel(Protocol):
    """What recognition reads of a built-in model: every tensor it reads."""

    @property
    def tensor_names(self) -> frozenset[str]: ...

    def __call__(self, inputs: Any) -> Any: ...


# Typed as making a BuiltinModel, not any callable, so recognition can read its tensor names.
BUILTIN_MODELS: Mapping[str, Callable[[Mapping[str, np.ndarray], Mapping[str, str]], BuiltinModel]] = (
    MappingProxyType({mlp.NAME: Mlp, mnist.NAME: BurnMnist, bert.NAME: bert.Bert,
                      onnx_layout.NAME: OnnxModel})
)
# Built-in models that tune themselves to their worker (BuildOptions): its CPU budget for
# their thread pool, a cache folder for what they prepare once per machine.
TUNED_MODELS: Mapping[
    str, Callable[[Mapping[str, np.ndarray], Mapping[str, str], BuildOptions], BuiltinModel]
] = MappingProxyType({onnx_layout.NAME: OnnxModel})

__all__ = [
    "BUILTIN_MODELS",
    "MODEL_KEY",
    "TUNED_MODELS",
    "BurnMnist",
    "Contract",
    "Factory",
    "GeneratedMlp",
    "Mlp",
    "ModelError",
    "ModelInputError",
    "ModelOutputError",
    "array_input",
    "build_model",
    "choose_model",
    "generate_mlp",
    "recognise",
    "resolve",
    "signature_mismatch",
    "takes_text",
]

CHOICES = (
    f"a built-in model ({', '.join(BUILTIN_MODELS)}) or package.module:factory, "
    "where factory(weights, metadata) returns the model"
)


def resolve(name_or_spec: str) -> Factory:
    """The factory for a built-in model name or a ``package.module:factory`` spec."""
    if name_or_spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_spec]
    module_name, colon, attribute = name_or_spec.partition(":")
    if not colon:
        raise ModelError(f"unknown model {name_or_spec!r}: expected {CHOICES}")
    if not module_name or not attribute:
        raise ModelError(f"model spec {name_or_spec!r} is not of the form package.module:factory")
    try:
        target: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # a module that exits when imported is just as broken
        raise ModelError(
            f"model {name_or_spec!r}: cannot import {module_name}: {exception_text(exc, named=True)}"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ModelError(f"model {name_or_spec!r}: {module_name} has no attribute {attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"model {name_or_spec!r}: {attribute} is not callable")
    return target


def recognise(weights: Mapping[str, np.ndarray]) -> str | None:
    """The built-in model whose tensors are exactly these (names, float32, shapes), if any."""
    for name, factory in BUILTIN_MODELS.items():
        try:
            model = factory(weights, {})
        except ModelError:
            continue
        if model.tensor_names == set(weights):
            return name
    return None


def choose_model(
    name_or_spec: str | None, weights: Mapping[str, np.ndarray], metadata: Mapping[str, str]
) -> tuple[str, Factory]:
    """Pick the model: explicit name or spec, else ``workerpool.model`` metadata, else recognition."""
    if name_or_spec:
        return name_or_spec, resolve(name_or_spec)
    if MODEL_KEY in metadata:
        named = metadata[MODEL_KEY]
        try:
            return named, resolve(named)
        except ModelError as exc:
            raise ModelError(f"metadata {MODEL_KEY}={named!r}: {exc}") from exc
    recognised = recognise(weights)
    if recognised is None:
        raise ModelError(
            f"no model named and none recognised from the {len(weights)} tensors"
            f"{_transposed_hint(weights)}: name {CHOICES}, or set metadata {MODEL_KEY}"
        )
    return recognised, BUILTIN_MODELS[recognised]


def _transposed_hint(weights: Mapping[str, np.ndarray]) -> str:
    """Why a file of a built-in model's tensors is not recognised when its matrices are stored
    ``[out, in]``, as PyTorch's ``nn.Linear`` keeps them (Burn's Linear is ``[in, out]``)."""
    flipped = {name: tensor.T if tensor.ndim == 2 else tensor for name, tensor in weights.items()}
    fits = recognise(flipped)
    if fits is None:
        return ""
    first = min(name for name, tensor in weights.items() if tensor.ndim == 2)
    return (f" (they fit '{fits}' with every 2-D weight transposed: {first} is "
            f"{list(weights[first].shape)}, stored [out, in] as PyTorch's nn.Linear keeps it, where "
            f"'{fits}' takes [in, out]; save each one transposed, w.T.copy(), before converting)")


def build_model(
    weights: Mapping[str, np.ndarray], metadata: Mapping[str, str], name: str | None = None,
    *, options: BuildOptions | None = None,
) -> Callable[..., Any]:
    """Choose the model as :func:`choose_model` does and build it on ``weights`` (no copy);
    ``options`` are what :data:`TUNED_MODELS` are told of their worker (None: nothing).

    Every failure, including a user factory raising or returning a non-callable, is a
    :class:`ModelError`.
    """
    chosen, factory = choose_model(name, weights, metadata)
    try:
        model = (TUNED_MODELS[chosen](weights, metadata, options or BuildOptions())
                 if chosen in TUNED_MODELS else factory(weights, metadata))
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"model {chosen!r} failed to build: {exception_text(exc, named=True)}") from exc
    if not callable(model):
        raise ModelError(
            f"model {chosen!r}: factory returned a {type(model).__name__}, not a callable"
        )
    return model



def signature_mismatch(served: Mapping[str, Any], other: Mapping[str, Any]) -> str | None:
    """How the ``inputs`` and ``outputs`` of ``other`` (an ``info``, a worker's READY) differ from
    the ``served`` ones (:meth:`Contract.info`), in one line, or None when they fit."""
    differences = [f"{key} are {format_entries(other.get(key))}, "
                   f"the served model's {format_entries(served.get(key))}"
                   for key in ("inputs", "outputs") if other.get(key) != served.get(key)]
    return "; ".join(differences) or None
