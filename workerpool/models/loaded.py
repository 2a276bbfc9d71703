"""A model built on the weights of one generation, with the mapping it runs on."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from .. import burnpack
from ..config import DEFAULT_LOAD
from . import build_model, choose_model, signature
from .base import ModelInputError
from .contract import Contract

log = logging.getLogger("workerpool.worker")


class LoadedModel:
    """The model of one generation, with the mapping it runs on and what it declares."""

    def __init__(self, path: str, spec: str | None, load: str = DEFAULT_LOAD, generation: int = 0) -> None:
        self.pack = burnpack.read(path, mmap=load == "mmap")
        self.name = choose_model(spec, self.pack.tensors, self.pack.metadata)[0]
        self.model = build_model(self.pack.tensors, self.pack.metadata, self.name)
        self.contract = Contract.of(self.model, self.name)
        self.generation = generation
        self.misfit_logged = False  # whether this worker logged an output that broke the contract
        self.batching = bool(getattr(self.model, "batching", False)) and self.contract.batched
        self.batch_failure_logged = False

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

    def infer_batch(self, inputs: list[Any]) -> list[Any]:
        """Each input's outputs, or the exception that fails it alone.

        The inputs that fit the declaration are stacked along the batch axis and run in one
        forward pass, whose outputs are split back; a pass that raises is run again input by
        input, so that the good ones still get answers.
        """
        results: list[Any] = [None] * len(inputs)
        rows: dict[int, np.ndarray] = {}
        for i, one in enumerate(inputs):
            try:
                rows[i] = self.contract.as_batch(one)
            except ModelInputError as exc:
                results[i] = exc
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, array in rows.items():
            groups.setdefault((array.dtype, array.shape[1:]), []).append(i)
        for members in groups.values():
            for i, outputs in zip(members, self._run_stacked([rows[i] for i in members],
                                                              [inputs[i] for i in members]), strict=True):
                results[i] = outputs
        return results

    def _run_stacked(self, arrays: list[np.ndarray], originals: list[Any]) -> list[Any]:
        if len(arrays) == 1:
            return [self._outcome(originals[0])]
        counts = [len(a) for a in arrays]
        try:
            outputs = self.infer(np.concatenate(arrays))
        except Exception as exc:  # noqa: BLE001 - the model's own failure: try one by one
            if not self.batch_failure_logged:
                self.batch_failure_logged = True
                log.error("model %s failed on a stacked batch of %d requests (%s: %s); running "
                          "such batches request by request (logged once)", self.name, len(arrays),
                          type(exc).__name__, exc)
            return [self._outcome(one) for one in originals]
        bounds = np.cumsum(counts)[:-1]
        if isinstance(outputs, dict):
            parts = {name: np.split(value, bounds) for name, value in outputs.items()}
            return [{name: parts[name][k] for name in parts} for k in range(len(arrays))]
        return np.split(outputs, bounds)

    def _outcome(self, one: Any) -> Any:
        try:
            return self.infer(one)
        except Exception as exc:  # noqa: BLE001 - each request's own answer
            return exc

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
