"""A model built on the weights of one generation, with the mapping it runs on."""

from __future__ import annotations

from typing import Any

from .. import burnpack
from ..config import DEFAULT_LOAD
from . import build_model, choose_model, signature
from .contract import Contract


class LoadedModel:
    """The model of one generation, with the mapping it runs on and what it declares."""

    def __init__(self, path: str, spec: str | None, load: str = DEFAULT_LOAD, generation: int = 0) -> None:
        self.pack = burnpack.read(path, mmap=load == "mmap")
        self.name = choose_model(spec, self.pack.tensors, self.pack.metadata)[0]
        self.model = build_model(self.pack.tensors, self.pack.metadata, self.name)
        self.contract = Contract.of(self.model, self.name)
        self.generation = generation
        self.misfit_logged = False  # whether this worker logged an output that broke the contract

    def infer(self, inputs: Any) -> Any:
        """The model's outputs for ``inputs``, both checked against what the model declares.

        Raises :class:`~.base.ModelInputError` before the model runs when the input does not fit,
        and :class:`~.contract.ModelOutputError` when the output does not; whatever the model
        itself raises passes through.
        """
        batch = self.contract.check_input(inputs)
        outputs = self.model(inputs)
        self.contract.check_output(outputs, batch)
        return outputs

    def describe(self) -> dict[str, Any]:
        """What clients and the router learn about the model (``info`` and registration)."""
        return {
            "model": self.name,
            "path": self.pack.path,
            "size": self.pack.identity.size,
            "inode": self.pack.identity.inode,
            "generation": self.generation,
            **signature(self.model),
        }
