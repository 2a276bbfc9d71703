"""The built-in ``onnx`` model: an onnxruntime session on the file's tensors, never copied.

The session runs on this machine's prepacked copy of the model (:mod:`.onnx_prepared`) when the
worker is given a cache folder and the copy can be made: onnxruntime maps the copy's data, so
the workers share its packed weights. Otherwise it runs on views of the mapping, as follows.
The file is laid out as :mod:`.onnx_layout` describes. Each initializer is handed to
onnxruntime as an ``OrtValue`` over the mapped view (``SessionOptions.add_initializer`` uses
the buffer in place); the OrtValues live as long as the model, since onnxruntime does not keep
them alive itself. Prepacking is off, as it copies MatMul weights. The optimisation level is
the highest, less constant folding: folding reads a weight's data from the graph (the empty
placeholder, so the session would not build) to make a private copy of it, while the other
optimisations, such as fusing a weight's Transpose into its MatMul, keep the weights shared.

Every tensor of the file but the graph is supplied, so the worker needs no ONNX parser: a
tensor the graph does not use is ignored by onnxruntime, one it needs and the file lacks fails
the build (its data would be read from the empty placeholder). Inputs and outputs are the
graph's, by name; a single-input graph takes a bare array too. onnxruntime is imported when a
model is built, so that importing the models stays light.

Texts are taken as :mod:`.onnx_texts` decides (an embedder's token states pooled, or a
classifier's logits), tokenized and run as :mod:`.texts` does, in the passes
:mod:`.text_passes` plans, fed in the dtypes the graph declares.

What a pass needed is given back off the common path (:meth:`OnnxModel.give_back`): once a
request whose pass left the worker :data:`RECOVER_GROWTH` above where it last settled (long
texts, large arrays) is answered and its outputs let go of (:meth:`OnnxModel.settle`, before
the worker checks ``--max-worker-memory``; outputs may sit in the arena), and when the worker
has been idle for a second (``worker.main``). A give-back runs one more pass, on the first row
(and token) of the last inputs, with the arena shrinkage run option, then trims the C heap; a
graph of fixed shapes, whose smallest input is a whole request, only has the heap trimmed. The
arena never gives back the region of its first pass, so a text model runs its first pass on
the empty text when it is built. Ordinary passes (texts in passes of at most ``PASS_TOKENS``
tokens) stay below the bound and run without shrinkage, which would hand the arena's blocks
back to the C library after every pass for the next pass to fault in again.
Measured in one process with all-MiniLM-L6-v2, one thread: 100 batches of 8 one-sentence
requests left the worker 7.5 MiB larger (arena and heap), 1.8 MiB after a give-back; the arena
alone holds about 5 MiB after one pass of 256 tokens, 24 MiB after one of 1,024 and 159 MiB
after one of 4,096. The memory pattern is off: onnxruntime plans one per input shape, and
texts come in every shape (28 against 16 MiB kept after 150 passes of 8 sentences, the same
CPU). Earlier, on a 4-layer, 384-wide encoder, 24 texts of 502 tokens left +90 MiB with the
default arena, +110 MiB without one (glibc keeps what it frees), +5 MiB with shrinkage and the
trim.

A pass that runs out of memory (``--max-worker-memory``, or the machine's) fails as a
``MemoryError``, and what the arena took for it is given back (see ``_recover_memory``): the
arena keeps it otherwise, so that every later request would fail too.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import extras
from ..errors import NotAJSONObject, exception_text, json_object
from ..linux.controls import release_free_memory
from ..linux.procfs import private_resident
from ..units import MiB
from . import onnx_prepared
from .base import BuildOptions, ModelError, ModelInputError, Shape
from .onnx_layout import (
    GRAPH_TENSOR,
    INITIALIZERS_KEY,
    LOOKUPS_KEY,
    NAME,
    PLACEHOLDER_FOLDER,
)
from .onnx_texts import TEXT_INPUTS, Output, graph_texts
from .texts import TextEncoder

log = logging.getLogger(__name__)

# onnxruntime's element types (NodeArg.type) as numpy dtypes.
ORT_DTYPES = {f"tensor({name})": np.dtype(dtype) for name, dtype in (
    ("float", np.float32), ("double", np.float64), ("float16", np.float16), ("int8", np.int8),
    ("int16", np.int16), ("int32", np.int32), ("int64", np.int64), ("uint8", np.uint8),
    ("uint16", np.uint16), ("uint32", np.uint32), ("uint64", np.uint64), ("bool", np.bool_))}
ONNXRUNTIME_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
OUT_OF_MEMORY = re.compile(r"bad_alloc|Failed to allocate memory")  # in onnxruntime's messages
DISABLED_OPTIMIZERS = ["ConstantFolding"]
FATAL_ONLY = 4  # onnxruntime log severity: a request it refuses is answered, not logged
SHRINK_ARENA = ("memory.enable_memory_arena_shrinkage", "cpu:0")
RECOVER_GROWTH = 16 * MiB  # private memory past where it settled that a pass gives back
GIVE_BACK_LEAST = 1 * MiB  # less than this past where it settled is not worth a give-back


class OnnxModel:
    """An ONNX graph served by onnxruntime on the file's tensors (see the module)."""

    name = NAME

    def __init__(self, weights: Mapping[str, np.ndarray], metadata: Mapping[str, str],
                 options: BuildOptions | None = None) -> None:
        """Build the session: on this machine's prepacked copy when ``options`` name a cache
        folder and the copy can be made (:mod:`.onnx_prepared`), else on views of ``weights``;
        ``options.threads`` is the worker's CPU budget (None: onnxruntime's default), its
        intra-op threads."""
        graph = _graph_bytes(weights)
        onnxruntime = extras.imported("onnxruntime", "an ONNX model", ModelError)

        # What onnxruntime raises for a request it cannot take: an input it refuses, or a graph
        # (one that built, on tensors that fit it) failing on this input.
        state = onnxruntime.capi.onnxruntime_pybind11_state
        self.refused, self.failed = state.InvalidArgument, (state.Fail, state.RuntimeException)
        views = {name: view for name, view in weights.items() if name != GRAPH_TENSOR}
        _check_initializers(views, metadata)
        self.tensor_names = frozenset(weights)
        self._open(graph, views, options or BuildOptions())
        self.shrinking = onnxruntime.RunOptions()  # gives the arena back after the pass
        self.shrinking.add_run_config_entry(*SHRINK_ARENA)
        self.settled = private_resident()  # where private memory stood after the last give-back
        self.smallest: dict[str, np.ndarray] | None = None  # what a give-back runs on
        self.grown = False  # a pass grew the worker past the bound: give back once it is answered
        self.recoveries = 0  # give-backs so far
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self.input_shape = {arg.name: _shape(arg.shape) for arg in inputs}
        self.input_dtype = {arg.name: _dtype(arg) for arg in inputs}
        self.output_names = [arg.name for arg in outputs]
        self.symbols = {arg.name: [(axis, d) for axis, d in enumerate(arg.shape) if isinstance(d, str)]
                        for arg in inputs}  # named axes, one size wherever they appear
        batch = _common_batch_symbol(inputs)
        self.output_shape = {arg.name: _output_shape(arg.shape, batch) for arg in outputs}
        self.output_dtype = {arg.name: _dtype(arg) for arg in outputs}
        # Rows are independent where every input and output runs along one symbolic batch axis.
        self.batching = batch is not None and all(_leading(arg.shape) == batch for arg in outputs)
        self.vocabularies = {name: (table, views[table].shape[axis])
                             for name, (table, axis) in _lookups(metadata).items()
                             if table in views and -views[table].ndim <= axis < views[table].ndim
                             and name in self.input_dtype and self.input_dtype[name].kind in "iu"}
        self._take_texts(metadata, outputs)

    def _open(self, graph: bytes, views: Mapping[str, np.ndarray], options: BuildOptions) -> None:
        """The session, on the prepacked copy (``prepared``, its model file) or on views (see
        the module); ``rebuild`` builds it again the same way."""
        threads = options.threads
        self.prepared = _prepared_file(options)
        if self.prepared is not None:
            prepared = self.prepared
            self.rebuild = lambda: _prepared_session(prepared, threads)
            try:
                self.session, self.initializers = self.rebuild()
                return
            except ModelError as exc:
                log.warning("%s; this process serves %s without prepacking (the copy is removed, and "
                            "made again by the next process that builds the model)", exc, options.path)
                onnx_prepared.forget(prepared)
                self.prepared = None
        self.rebuild = lambda: _session(graph, views, threads)
        self.session, self.initializers = self.rebuild()

    def _take_texts(self, metadata: Mapping[str, str], outputs: list[Any]) -> None:
        """Texts are taken as :mod:`.onnx_texts` decides; a first pass runs on the empty text."""
        found = graph_texts(metadata, self.input_dtype,
                            [Output(arg.name, list(arg.shape), _dtype(arg)) for arg in outputs], self._encode)
        self.accepts_text = found is not None
        self.text_encoder: TextEncoder | None = None if found is None else found.encoder
        if found is None:
            return
        self.states = found.read
        self.text_output_shape, self.text_output_dtype = found.shapes, found.dtypes
        try:  # the arena's first region, which it never gives back, stays small
            found.encoder([""])
        except Exception as exc:  # noqa: BLE001 - such a graph fails texts when they come
            log.warning("%s: a first pass on the empty text failed (%s); texts are tried as they come",
                        NAME, exception_text(exc, named=True))

    def __call__(self, inputs: Mapping[str, np.ndarray] | list[str]) -> dict[str, np.ndarray]:
        if isinstance(inputs, list) and not self.accepts_text:
            raise ModelInputError(f"{NAME}: this graph takes no texts: send its arrays")
        if isinstance(inputs, list):
            assert self.text_encoder is not None
            return self.text_encoder(inputs)
        return dict(zip(self.output_names, self._run(self.output_names, inputs), strict=True))

    def _run(self, names: list[str], inputs: Mapping[str, np.ndarray]) -> list[Any]:
        self._check_axes(inputs)
        if self.session is None:  # building it again after running out of memory failed
            self._build_again()
        outputs: list[Any] | None = None
        try:
            outputs = list(self.session.run(names, dict(inputs)))
        except self.refused as exc:
            raise ModelInputError(f"{NAME}: {_reason(exc)}") from None
        except self.failed as exc:
            if not OUT_OF_MEMORY.search(str(exc)):
                raise ModelInputError(f"{NAME}: the graph cannot run on this input: {_reason(exc)}") from None
        if outputs is None:  # out of memory: recovered once the exception has let go of the pass
            self._recover_memory(inputs)
            raise MemoryError(f"{NAME}: onnxruntime ran out of memory for this request")
        self.smallest = self._smallest(inputs)
        self.grown = self.grown or private_resident() > self.settled + RECOVER_GROWTH
        return outputs

    def settle(self) -> None:
        """After a request whose pass grew the worker past :data:`RECOVER_GROWTH`, once its
        outputs are let go of (they may sit in the arena): give back."""
        if self.grown:
            self.grown = False
            self.give_back()

    def give_back(self) -> None:
        """Shrink the arena and trim the heap, if the worker holds more than where it settled:
        the arena shrinks at the end of a pass run with the shrinkage option, so one runs on
        the smallest part of the last inputs (see :meth:`_smallest`); a graph with no named
        axis, or no session left after running out of memory, only has the heap trimmed."""
        if private_resident() <= self.settled + GIVE_BACK_LEAST:
            return
        if self.smallest is not None and self.session is not None:
            with contextlib.suppress(Exception):  # best effort: the arena stays as it is
                self.session.run(self.output_names[:1], self.smallest, self.shrinking)
        release_free_memory()
        self.settled = private_resident()
        self.recoveries += 1

    def _smallest(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Copies of the first item of ``inputs`` along every named axis (a row and a token of
        texts): what the graph takes, at almost no cost; None for a graph of fixed shapes,
        whose smallest input is a whole request."""
        if not any(self.symbols.values()):
            return None
        return {name: array[tuple(slice(0, 1) if any(axis == named for named, _ in self.symbols[name])
                                  else slice(None) for axis in range(array.ndim))].copy()
                for name, array in inputs.items()}

    def _recover_memory(self, inputs: Mapping[str, np.ndarray]) -> None:
        """What the arena took for a pass that ran out of memory goes back: on the prepacked
        copy, by a pass that shrinks the arena (a session built again would map the copy again,
        over the bound); on views, where packing each weight needs memory beside the arena, by
        building the session again (or at the next request, if that fails too)."""
        if self.prepared is not None:
            self.smallest = self._smallest(inputs)
            self.give_back()
            return
        self.session, self.initializers = None, {}  # the old arena goes before a new one
        release_free_memory()
        with contextlib.suppress(MemoryError):
            self._build_again()

    def _build_again(self) -> None:
        try:
            self.session, self.initializers = self.rebuild()
        except ModelError as exc:
            if not OUT_OF_MEMORY.search(str(exc)):
                raise
            raise MemoryError(f"{NAME}: not enough memory to build the session again") from None

    def _encode(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        """The token states (or logits) of one chunk of tokenized texts, fed in the dtypes the
        graph takes."""
        given = dict(zip(TEXT_INPUTS, (ids, mask, types), strict=True))
        feeds = {name: given[name].astype(dtype, copy=False) for name, dtype in self.input_dtype.items()}
        states: np.ndarray = self._run([self.states], feeds)[0]
        return states

    def _check_axes(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Refuse what onnxruntime would fail on deep inside the graph: one named axis of two
        sizes across the inputs, token ids beyond their embedding table."""
        sizes: dict[str, tuple[str, int]] = {}
        for name, axes in self.symbols.items():
            for axis, symbol in axes:
                size = inputs[name].shape[axis]
                seen, first = sizes.setdefault(symbol, (name, size))
                if first != size:
                    raise ModelInputError(f"{NAME}: axis {symbol} is {first} long in {seen} but "
                                          f"{size} in {name}")
        for name, (table, rows) in self.vocabularies.items():
            ids = inputs[name]
            if ids.size and (ids.min() < -rows or ids.max() >= rows):
                raise ModelInputError(f"{NAME}: {name} holds ids outside [{-rows}, {rows - 1}], "
                                      f"the rows of {table}")

    def __repr__(self) -> str:
        return f"<OnnxModel {sorted(self.input_shape)} -> {self.output_names}>"


def _graph_bytes(weights: Mapping[str, np.ndarray]) -> bytes:
    graph = weights.get(GRAPH_TENSOR)
    if graph is None:
        raise ModelError(f"{NAME}: the file has no {GRAPH_TENSOR} tensor (convert an .onnx file "
                         "with workerpool convert)")
    if not isinstance(graph, np.ndarray) or graph.dtype != np.uint8 or graph.ndim != 1:
        raise ModelError(f"{NAME}: tensor {GRAPH_TENSOR} is not a 1-D uint8 tensor")
    return graph.tobytes()


def _check_initializers(views: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """Refuse tensors of another dtype or shape than the graph declares for them (convert
    wrote what it declares; files from before that are not checked)."""
    declared = _metadata_pairs(metadata, INITIALIZERS_KEY, "[dtype, shape]", lambda shape: isinstance(shape, list))
    for name, (dtype, shape) in declared.items():
        view = views.get(name)
        if view is None:
            raise ModelError(f"{NAME}: onnxruntime cannot build the graph: its initializer {name} is "
                             "missing from the file")
        if [dtype, shape] != [view.dtype.str, list(view.shape)]:
            raise ModelError(f"{NAME}: tensor {name} is {view.dtype.str} {list(view.shape)}, where the "
                             f"graph declares {dtype} {shape}")


def _lookups(metadata: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """The inputs that index a table directly, from the metadata convert wrote."""
    return _metadata_pairs(metadata, LOOKUPS_KEY, "[table, axis]", lambda axis: type(axis) is int)


def _metadata_pairs(metadata: Mapping[str, str], key: str, form: str,
                    second: Callable[[Any], bool]) -> dict[str, tuple[str, Any]]:
    """``metadata[key]``, a JSON object that convert wrote of names to pairs ``form``: a string
    and a value that ``second`` accepts; empty where the file has no such key."""
    if key not in metadata:
        return {}
    try:
        found = json_object(metadata[key])
    except NotAJSONObject as exc:
        raise ModelError(f"{NAME}: metadata {key} is not a JSON object") from exc
    pairs = {}
    for name, entry in found.items():
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and second(entry[1])):
            raise ModelError(f"{NAME}: metadata {key}: {name} is not {form}")
        pairs[name] = (entry[0], entry[1])
    return pairs


def _prepared_file(options: BuildOptions) -> str | None:
    if options.cache_dir is None or options.path is None or options.identity is None:
        return None
    return onnx_prepared.prepared_model(options.cache_dir, options.path, options.identity)


def _prepared_session(model_file: str, threads: int | None) -> tuple[Any, dict[str, Any]]:
    """A session on this machine's prepacked copy, which onnxruntime maps; already optimised."""
    import onnxruntime as ort

    options = _options(threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    try:
        session = ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's exceptions have no common base
        raise ModelError(f"{NAME}: the prepacked copy {model_file} does not load: {_reason(exc)}") from None
    release_free_memory()  # loading leaves some 7 MiB freed on the heap, in every worker
    return session, {}


def _session(graph: bytes, views: Mapping[str, np.ndarray],
             threads: int | None) -> tuple[Any, dict[str, Any]]:
    """The session, and the OrtValues over ``views``, by name, that must outlive it."""
    import onnxruntime as ort

    options = _options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     PLACEHOLDER_FOLDER)
    values = {name: ort.OrtValue.ortvalue_from_numpy(view) for name, view in views.items()}
    for name, value in values.items():
        options.add_initializer(name, value)
    try:
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=DISABLED_OPTIMIZERS)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's exceptions have no common base
        raise ModelError(f"{NAME}: onnxruntime cannot build the graph: {_reason(exc)}") from None
    return session, values


def _options(threads: int | None, level: Any) -> Any:
    """What every session of a worker shares: the CPU provider's threads, one inter-op, the
    intra-op ones its CPU budget (None: onnxruntime's default); only fatal errors logged."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = threads or 0
    options.log_severity_level = FATAL_ONLY
    options.enable_mem_pattern = False  # a pattern, and its block, per input shape: texts vary
    return options


def _dtype(arg: Any) -> np.dtype:
    if arg.type not in ORT_DTYPES:
        raise ModelError(f"{NAME}: {arg.name} is a {arg.type}, which is not served")
    return ORT_DTYPES[arg.type]


def _shape(dims: list[Any]) -> Shape:
    """onnxruntime's shape, None for a symbolic or unknown axis."""
    return tuple(d if isinstance(d, int) else None for d in dims)


def _leading(dims: list[Any]) -> Any:
    return dims[0] if dims else None


def _common_batch_symbol(inputs: list[Any]) -> str | None:
    """The symbol every input's leading axis is named by, if there is one."""
    symbols = {_leading(arg.shape) for arg in inputs}
    symbol = symbols.pop() if len(symbols) == 1 else None
    return symbol if isinstance(symbol, str) else None


def _output_shape(dims: list[Any], batch: str | None) -> Shape | None:
    """An output's declared shape; undeclared when its leading axis is dynamic but not the
    inputs' batch axis, which the contract would otherwise hold to the batch size."""
    if dims and not isinstance(dims[0], int) and (batch is None or dims[0] != batch):
        return None
    return _shape(dims)


def _reason(exc: BaseException) -> str:
    """onnxruntime's message on one line, without its ``[ONNXRuntimeError] : 2 : ...`` prefix."""
    return ONNXRUNTIME_PREFIX.sub("", " ".join(str(exc).split()))
