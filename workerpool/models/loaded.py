"""A model built on the weights of one generation, with the mapping it runs on."""

from __future__ import annotations

import collections
import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import burnpack
from ..linux.controls import release_free_memory
from . import build_model, choose_model
from .base import BuildOptions, ModelInputError
from .contract import Contract, ModelOutputError
from .texts import TextEncoder, Texts, Tokenized, is_item

log = logging.getLogger(__name__)

_TEXTS = ("texts",)  # the stacking key of text inputs


class LoadedModel:
    """The model of one generation, with the mapping it runs on and what it declares."""

    def __init__(self, path: str, spec: str | None, load: str, generation: int = 0,
                 threads: int | None = None, cache_dir: str | None = None, source: str | None = None,
                 pack: burnpack.Burnpack | None = None, max_rows: int | None = None,
                 truncate: bool = False) -> None:
        """``threads``: the worker's CPU budget, for a model that sizes its own thread pool;
        ``cache_dir``: where a model keeps what it prepares once per machine (None, or a
        ``load`` other than mmap: nothing is prepared); ``source``: opened instead of ``path``
        (see :func:`burnpack.read`); ``pack``: the file, read already as ``load`` reads it;
        ``max_rows``: the rows (or texts) one forward pass may take (--max-batch; None: any);
        ``truncate``: whether texts over the model's limit are cut when their request does not
        say (--truncate), or refused."""
        self.pack = pack or burnpack.read(path, mmap=load == "mmap", source=source)
        self.name = choose_model(spec, self.pack.tensors, self.pack.metadata)[0]
        options = BuildOptions(threads, cache_dir if self.pack.mapped else None, path, self.pack.identity)
        self.model = build_model(self.pack.tensors, self.pack.metadata, self.name, options=options)
        self.contract = Contract.of(self.model, self.name)
        self.generation = generation
        self.misfit_logged = False  # whether this worker logged an output that broke the contract
        self.batching = bool(getattr(self.model, "batching", False)) and (
            self.contract.batched or self.contract.texts)
        self.batch_failure_logged = False
        self.max_rows = max_rows
        self.truncate = truncate
        self.views: dict[str, Any] = {}  # what the HTTP codecs make of it, by the name it is served as

    def infer(self, inputs: Any) -> Any:
        """The model's outputs for ``inputs``, both checked against what the model declares.

        Raises :class:`~.base.ModelInputError` before the model runs when the input does not fit,
        and :class:`~.contract.ModelOutputError` when the output does not; whatever the model
        itself raises passes through.
        """
        if isinstance(inputs, list):
            inputs = Texts(inputs, self._truncates(inputs))
        batch, admitted = self.contract.admit(inputs)
        outputs = self.model(admitted)
        self.contract.check_output(outputs, batch, texts=isinstance(inputs, list))
        return outputs

    def infer_batch(self, inputs: list[Any]) -> Iterator[tuple[int, Any]]:
        """Each input's index and outputs, or the exception that fails it alone, as soon as
        they are known.

        The inputs that fit together are stacked along the batch axis and run in forward
        passes of at most ``max_rows`` rows, whose outputs are split back; a pass that raises
        is run again input by input, so that the good ones still get answers. Texts are
        embedded in the passes their model plans (:mod:`.text_passes`), and a request is
        answered when the last pass holding one of its texts is done, not when the whole batch
        is.
        """
        if not self.batching:
            yield from ((i, self.outcome(one)) for i, one in enumerate(inputs))
            return
        groups: dict[tuple[Any, ...], list[tuple[int, Any]]] = {}
        for i, one in enumerate(inputs):
            try:
                part = self._part(one)
            except ModelInputError as exc:
                yield i, exc
                continue
            if part is None:
                yield i, self.outcome(one)
            else:
                groups.setdefault(part[0], []).append((i, part[1]))
        for key, members in groups.items():
            if key == _TEXTS:
                yield from self._run_texts(members)
            elif len(members) == 1 and _rows(members[0][1]) <= (self.max_rows or math.inf):
                yield members[0][0], self.outcome(inputs[members[0][0]])
            else:
                parts = [part for _, part in members]
                joined = _joined_arrays if isinstance(parts[0], Mapping) else np.concatenate
                outcomes = self._run_stacked(parts, [inputs[i] for i, _ in members], functools.partial(joined, parts))
                yield from zip((i for i, _ in members), outcomes, strict=True)

    def _run_texts(self, members: list[tuple[int, list[Any]]]) -> Iterator[tuple[int, Any]]:
        """The outcomes of requests of texts, each given once the passes holding its texts are
        done; with a model that plans no passes of its own, one call on all the texts."""
        encoder = getattr(self.model, "text_encoder", None)
        if encoder is None and len(members) == 1:
            yield members[0][0], self.outcome(members[0][1])
            return
        if encoder is None:
            parts = [texts for _, texts in members]
            outcomes = self._run_stacked(parts, parts, functools.partial(_joined_texts, parts))
            yield from zip((i for i, _ in members), outcomes, strict=True)
            return
        texts = _joined_texts([texts for _, texts in members])
        try:
            tokenized = encoder.tokenize(texts)
        except ModelInputError:  # one request's texts: each request is tokenized alone
            yield from ((i, self.outcome(texts)) for i, texts in members)
            return
        firsts = np.cumsum([0] + [len(texts) for _, texts in members])
        running: list[int] = []
        for k, (i, request) in enumerate(members):
            mine = range(firsts[k], firsts[k + 1])
            try:
                encoder.refuse_over(texts, tokenized, mine, truncate=self._truncates(request))
            except ModelInputError as exc:
                yield i, exc
            else:
                running.extend(mine)
        yield from self._answer_passes(encoder, members, tokenized, running, firsts)

    def _answer_passes(self, encoder: TextEncoder, members: list[tuple[int, list[Any]]], tokenized: Tokenized,
                       running: list[int], firsts: np.ndarray) -> Iterator[tuple[int, Any]]:
        """The outcomes of the requests whose texts are ``running`` (indices into ``tokenized``;
        a request's texts run from ``firsts[k]``), each once the passes holding its texts are done."""
        owners = np.searchsorted(firsts, np.arange(firsts[-1]), side="right") - 1
        waiting = collections.Counter(int(owners[t]) for t in running)
        outputs: np.ndarray | None = None
        answered: set[int] = set()
        try:
            for indices, answer in encoder.passes(tokenized, running, self.max_rows):
                if outputs is None:
                    outputs = np.empty((len(tokenized.lengths), *answer.shape[1:]), np.float32)
                outputs[indices] = answer
                done = collections.Counter(int(owners[t]) for t in indices)
                for k in sorted(done):
                    waiting[k] -= done[k]
                    if not waiting[k]:
                        rows = slice(firsts[k], firsts[k + 1])
                        outcome = self._checked({encoder.output: outputs[rows].copy(),
                                                 "tokens": np.array(tokenized.lengths[rows], np.int32)},
                                                len(members[k][1]))
                        answered.add(k)
                        yield members[k][0], outcome
        except Exception as exc:  # noqa: BLE001 - the requests not answered yet run alone
            self._log_batch_failure(len(waiting) - len(answered), exc)
            del exc
            yield from ((members[k][0], self.outcome(members[k][1])) for k in waiting if k not in answered)

    def _truncates(self, texts: Any) -> bool:
        """Whether texts over the model's limit are cut: as their request asks, else as the
        model is served (``--truncate``)."""
        asked = getattr(texts, "truncate", None)
        return self.truncate if asked is None else bool(asked)

    def _checked(self, outputs: dict[str, np.ndarray], texts: int) -> Any:
        """Texts' outputs, or the :class:`ModelOutputError` of what breaks the declaration."""
        try:
            self.contract.check_output(outputs, texts, texts=True)
        except ModelOutputError as exc:
            return exc
        return outputs

    def _part(self, inputs: Any) -> tuple[tuple[Any, ...], Any] | None:
        """What ``inputs`` brings to a stacked pass, under the key of those it stacks with; None
        when it runs alone. Raises :class:`ModelInputError` for an input that does not fit.

        Without a declared output shape, a bare row's output need not have the batch axis that
        a stacked pass gives it: it runs alone, so that its reply never depends on its company.
        """
        if isinstance(inputs, list):  # a list that is not all texts is refused alone
            return (_TEXTS, inputs) if self.contract.texts and inputs and all(map(is_item, inputs)) else None
        if not self.contract.batched:
            return None
        arrays, bare = self.contract.as_batch(inputs)
        if bare and self.contract.outputs is None:
            return None
        if isinstance(arrays, Mapping):  # stacked with those whose every array has its kind
            return tuple((name, a.dtype, a.shape[1:]) for name, a in arrays.items()), arrays
        return (arrays.dtype, arrays.shape[1:]), arrays

    def _run_stacked(self, parts: list[Any], originals: list[Any], join: Callable[[], Any]) -> list[Any]:
        """The outputs of ``originals`` (``parts``: each as rows to stack) from passes of at
        most ``max_rows`` rows over ``join()``, or of each alone when a pass fails: in one call
        when it fits one pass, else in passes of its own (its first failure is its answer)."""
        counts = [_rows(part) for part in parts]
        bounds = np.cumsum(counts)
        stacked = self._outcome_joined(join, int(bounds[-1]))
        if isinstance(stacked, BaseException) or not _split_along(stacked, int(bounds[-1])):
            self._log_batch_failure(len(originals), stacked)
            del stacked  # and what it holds, before the requests run again
            step = self.max_rows or math.inf
            return [self.outcome(one) if count <= step
                    else self._outcome_joined(functools.partial(_rows_of, part, 0, count), count)
                    for one, part, count in zip(originals, parts, counts, strict=True)]
        if isinstance(stacked, Mapping):
            split = {name: np.split(value, bounds[:-1]) for name, value in stacked.items()}
            return [{name: split[name][k] for name in split} for k in range(len(originals))]
        return np.split(stacked, bounds[:-1])

    def _log_batch_failure(self, requests: int, failure: Any) -> None:
        """Log once per model that a stacked pass failed (``failure``: what it raised, or the
        outputs that lacked the batch axis)."""
        if self.batch_failure_logged:
            return
        self.batch_failure_logged = True
        what = f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) \
            else "outputs without the batch axis"
        log.error("model %s failed on a stacked batch of %d requests (%s); such a batch is "
                  "answered request by request (logged once)", self.name, requests, what)

    def _outcome_joined(self, join: Callable[[], Any], rows: int) -> Any:
        """:meth:`outcome` of the joined inputs, run in passes of at most ``max_rows`` rows and
        put together again; an exception comes without its traceback, whose frames would keep
        the joined input and the pass's buffers alive."""
        try:
            joined = join()
            step = self.max_rows or rows
            outcome = self.outcome(joined) if rows <= step else self._in_passes(joined, rows, step)
        except MemoryError as exc:  # joining needs a copy that no request alone needs
            outcome = exc
        if isinstance(outcome, BaseException):
            outcome.__traceback__ = None
        return outcome

    def _in_passes(self, joined: Any, rows: int, step: int) -> Any:
        """The outputs of ``joined`` (``rows`` rows) run ``step`` rows a pass, put together; the
        first failure instead (what a pass raised, or outputs without the batch axis)."""
        passes = []
        for start in range(0, rows, step):
            outputs = self.outcome(_rows_of(joined, start, min(start + step, rows)))
            if isinstance(outputs, BaseException) or not _split_along(outputs, min(start + step, rows) - start):
                return outputs
            passes.append(outputs)
        if isinstance(passes[0], Mapping):
            return {name: np.concatenate([outputs[name] for outputs in passes]) for name in passes[0]}
        return np.concatenate(passes)

    def outcome(self, inputs: Any) -> Any:
        """The outputs for ``inputs``, or the exception that fails them (not raised)."""
        try:
            return self.infer(inputs)
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, SystemExit from a model too
            # Signals never raise here (the worker's stop signal only wakes its loop, the others
            # are ignored), so this swallows no request to leave: only what the model raised.
            return exc

    def settle(self) -> None:
        """Once a message's replies are sent: a model that holds memory a pass grew it by gives
        it back (an ONNX session's arena after long texts or large arrays)."""
        settle = getattr(self.model, "settle", None)
        if callable(settle):
            settle()

    def release_memory(self) -> None:
        """Give back what serving left free, while the worker is idle: the model's own (an
        ONNX session's arena) and the C heap's."""
        give_back = getattr(self.model, "give_back", None)
        if callable(give_back):
            give_back()
        else:
            release_free_memory()

    def describe(self) -> dict[str, Any]:
        """What clients and the router learn about the model (``info`` and registration)."""
        return {
            "model": self.name,
            "path": self.pack.path,
            "size": self.pack.identity.size,
            "inode": self.pack.identity.inode,
            "generation": self.generation,
            **self.signature(),
        }

    def signature(self) -> dict[str, Any]:
        """What a model of another generation or host must match (its inputs and outputs),
        whether it batches, and what a model of texts tells of them (task, limit, labels)."""
        encoder = getattr(self.model, "text_encoder", None)
        texts = encoder.describe() if isinstance(encoder, TextEncoder) else {}
        return {**self.contract.info(), "batching": self.batching, **texts}

    def take_usage(self) -> tuple[int, int, float] | None:
        """The texts tokenized since the last call, their tokens and the seconds it took; None
        for a model of no texts, or when none were."""
        encoder = getattr(self.model, "text_encoder", None)
        if not isinstance(encoder, TextEncoder) or not encoder.counted.texts:
            return None
        return encoder.counted.take()


def _split_along(outputs: Any, rows: int) -> bool:
    """Whether every output array has the batch axis of a ``rows``-row input."""
    arrays = outputs.values() if isinstance(outputs, Mapping) else [outputs]
    return all(isinstance(a, np.ndarray) and a.ndim >= 1 and len(a) == rows for a in arrays)


def _rows(part: Any) -> int:
    """The rows a request brings to a stacked pass: texts, rows, or rows of its named arrays."""
    return len(next(iter(part.values())) if isinstance(part, Mapping) else part)


def _joined_arrays(parts: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _rows_of(inputs: Any, start: int, stop: int) -> Any:
    """Rows ``start`` to ``stop`` of an array, or of each named array."""
    if isinstance(inputs, Mapping):
        return {name: array[start:stop] for name, array in inputs.items()}
    return inputs[start:stop]


def _joined_texts(parts: list[list[Any]]) -> list[Any]:
    return [text for texts in parts for text in texts]
