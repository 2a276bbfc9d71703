"""A model built on the weights of one generation, with the mapping it runs on."""

from __future__ import annotations

from typing import Any

from .. import burnpack
from ..config import DEFAULT_LOAD
from . import build_model, choose_model, signature


class LoadedModel:
    """The model of one generation, with the mapping it runs on."""

    def __init__(self, path: str, spec: str | None, load: str = DEFAULT_LOAD, generation: int = 0) -> None:
        self.pack = burnpack.read(path, mmap=load == "mmap")
        self.name = choose_model(spec, self.pack.tensors, self.pack.metadata)[0]
        self.model = build_model(self.pack.tensors, self.pack.metadata, self.name)
        self.generation = generation

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
