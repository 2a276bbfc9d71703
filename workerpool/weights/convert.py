"""``workerpool convert``: weights from the Python world into one Burnpack file.

Sources are ``.safetensors`` files (read tensor by tensor with the safetensors library's numpy
API), ``.npz`` archives (read without pickle), ONNX models (``onnx_convert``: the initializers
and the graph without them, served by the ``onnx`` model), or a Hugging Face model folder: its
``*.safetensors`` files or its ``model.onnx``, with ``config.json``, ``tokenizer.json``, the
sentence-transformers maximum sequence length and pooling carried in the metadata, so that
weights and tokenizer are one file that a reload swaps at once. Names, dtypes and shapes are
kept as they are; each tensor is read only when the writer reaches it, so a file larger than
memory converts.
"""

from __future__ import annotations

import fnmatch
import json
import os
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import burnpack, extras
from ..burnpack import dtypes
from ..errors import NotAJSONObject, exception_text, json_object
from ..models.base import MODEL_KEY
from ..models.bert import CLASSIFIER, CONFIG_KEY, TOKENIZER_KEY
from ..models.bert import NAME as BERT
from ..models.onnx_layout import NAME as ONNX
from ..models.onnx_layout import POOLING_KEY
from ..models.texts import (
    MAX_LENGTH_KEY,
    POOLING_MODES,  # sentence-transformers 5 names them ("pooling_mode": "mean")
)
from . import npy
from .sources import ConvertError, Tensors, read_values

# safetensors' dtype names and the Burn dtype each is stored as.
SAFETENSORS_DTYPES = {
    "F64": "F64", "F32": "F32", "F16": "F16", "BF16": "BF16",
    "I64": "I64", "I32": "I32", "I16": "I16", "I8": "I8",
    "U64": "U64", "U32": "U32", "U16": "U16", "U8": "U8", "BOOL": "Bool(Native)",
}
SAFETENSORS_HEADER_MAX = 100 * 1024 * 1024  # the safetensors library's own limit
ONNX_FILE = "model.onnx"  # in a folder, or in its onnx/ as optimum and sentence-transformers write it
# sentence-transformers' pooling flags (1_Pooling/config.json) for the modes onnx_layout knows.
POOLING_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_max_tokens": "max"}
NORMALIZE_MODULES = ("sentence_transformers.models.Normalize",  # what 2.x to 4.x write, then 5.x
                     "sentence_transformers.sentence_transformer.modules.normalize.Normalize")
# What reading a damaged .npz raises: a bad CRC, a cut stream, an impossible size.
_NPZ_ERRORS = (OSError, ValueError, EOFError, MemoryError, zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True)
class Converted:
    """What was written: the tensors' count and bytes, the model named, the metadata keys."""

    tensors: int
    nbytes: int
    model: str | None
    metadata: list[str]


def convert(source: str, destination: str, *, model: str | None = None,
            metadata: dict[str, str] | None = None, include: Sequence[str] = (),
            exclude: Sequence[str] = ()) -> Converted:
    """Write ``source``'s tensors (those ``include`` globs match, if any, and no ``exclude``
    glob does) to ``destination``, atomically."""
    if not os.path.exists(source):
        raise ConvertError(f"{source}: no such file or folder")
    with ExitStack() as stack:
        onnx_model = _onnx_model(source)
        if onnx_model is not None:
            tensors, meta = _onnx_source(source, onnx_model, include, exclude)
        else:
            tensors, meta = _tensor_source(source, stack, include, exclude)
        meta.update(metadata or {})
        if model is not None:
            meta[MODEL_KEY] = model
        try:
            burnpack.write(destination, tensors, metadata=meta)
        except burnpack.BurnpackError as exc:
            raise ConvertError(str(exc)) from exc
    nbytes = sum(_nbytes(tensor) for _, tensor in tensors)
    return Converted(len(tensors), nbytes, meta.get(MODEL_KEY), sorted(meta))


def _tensor_source(source: str, stack: ExitStack, include: Sequence[str],
                   exclude: Sequence[str]) -> tuple[Tensors, dict[str, str]]:
    """The tensors of a safetensors file, an .npz archive or a folder of safetensors files,
    and the metadata the folder carries."""
    folder = os.path.isdir(source)
    files = _weight_files(source) if folder else [source]
    meta = _safetensors_folder_metadata(source) if folder else {}
    tensors = [(name, tensor) for path in files for name, tensor in _read(path, stack)
               if _chosen(name, include, exclude)]
    names = [name for name, _ in tensors]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConvertError(f"{source}: tensor {duplicates[0]} appears in more than one file")
    if not tensors:
        raise ConvertError(f"{source}: no tensor left to write (check --include and --exclude)")
    return tensors, meta


def _chosen(name: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if include and not any(fnmatch.fnmatchcase(name, glob) for glob in include):
        return False
    return not any(fnmatch.fnmatchcase(name, glob) for glob in exclude)


def _nbytes(tensor: burnpack.Deferred) -> int:
    itemsize = tensor.dtype.itemsize if isinstance(tensor.dtype, dtypes.DType) else np.dtype(tensor.dtype).itemsize
    return int(np.prod(tensor.shape, dtype=np.int64)) * (itemsize or 1)


# Hugging Face folders.


def _weight_files(folder: str) -> list[str]:
    found = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
    if not found:
        raise ConvertError(f"{folder}: no .safetensors file or {ONNX_FILE} in this folder")
    return [os.path.join(folder, name) for name in found]


def _safetensors_folder_metadata(folder: str) -> dict[str, str]:
    """What :func:`_folder_metadata` reads, from a folder that must have its ``config.json``,
    and the built-in model a BERT config names (:func:`_served_as`)."""
    config = _json_file(folder, "config.json")
    if config is None:
        raise ConvertError(f"{folder}: a model folder needs its config.json")
    meta = _folder_metadata(folder, config)
    if _served_as(folder, config) == BERT:
        meta[MODEL_KEY] = BERT
    return meta


def _served_as(folder: str, config: dict[str, Any]) -> str | None:
    """The built-in model that serves the folder's weights (``bert``), None for weights a
    factory of the user's serves; refuse an architecture whose head no built-in model runs,
    rather than serve its encoder as something else. A sentence-transformers folder (with its
    ``modules.json``) is an embedder whatever head its checkpoint had, as sentence-transformers
    itself loads only the encoder."""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list):
        raise ConvertError(f"{folder}/config.json: architectures is not a list")
    heads = [str(name) for name in architectures if not str(name).endswith("Model")]
    classifier = any(name.endswith("ForSequenceClassification") for name in heads)
    sentence_transformers = os.path.exists(os.path.join(folder, "modules.json"))
    if config.get("model_type") != "bert":
        if classifier:
            raise ConvertError(
                f"{folder}: {heads[0]} (model_type {config.get('model_type')!r}) is not served by the "
                "built-in numpy model, which runs BERT only: export it to ONNX (optimum-cli export onnx "
                "--task text-classification) and convert the folder with its model.onnx")
        return None
    if heads and heads != [CLASSIFIER] and not sentence_transformers:
        raise ConvertError(
            f"{folder}: architecture {', '.join(heads)} is not served: the numpy bert serves BertModel "
            f"(embeddings) and {CLASSIFIER} (scores: rerank, classify); its head would be dropped")
    if classifier and sentence_transformers:
        raise ConvertError(f"{folder}: a sentence-transformers folder whose checkpoint is a {CLASSIFIER}: "
                           "serve it as one or the other (remove modules.json for scores)")
    return BERT


def _folder_metadata(folder: str, config: dict[str, Any] | None) -> dict[str, str]:
    """``config`` (the folder's ``config.json``, if it has one) and ``tokenizer.json`` as they
    are, and the maximum sequence length."""
    meta: dict[str, str] = {}
    if config is not None:
        meta[CONFIG_KEY] = json.dumps(config)
    tokenizer = os.path.join(folder, "tokenizer.json")
    if os.path.exists(tokenizer):
        meta[TOKENIZER_KEY] = _text(tokenizer)
    length = _max_length(folder, config or {})
    if length is not None:
        meta[MAX_LENGTH_KEY] = str(length)
    return meta


def _max_length(folder: str, config: dict[str, Any]) -> int | None:
    """The sequence length the model is used with: sentence-transformers' ``max_seq_length``,
    else the tokenizer's ``model_max_length``, at most the model's position embeddings."""
    wanted = None
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        settings = _json_file(folder, name) or {}
        if type(settings.get(key)) is int and settings[key] > 0:
            wanted = settings[key]
            break
    positions = config.get("max_position_embeddings")
    if type(positions) is int and positions > 0:
        wanted = positions if wanted is None else min(wanted, positions)
    return wanted


def _json_file(folder: str, name: str) -> dict[str, Any] | None:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    try:
        return json_object(_text(path))
    except NotAJSONObject as exc:
        raise ConvertError(f"{path}: not valid JSON: {exc}" if exc.found is None
                           else f"{path}: not a JSON object") from exc


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConvertError(f"{path}: cannot read: {exc}") from exc


# ONNX models.


def _onnx_model(source: str) -> str | None:
    """The ONNX model file ``source`` is, or holds as ``model.onnx`` or ``onnx/model.onnx``."""
    if not os.path.isdir(source):
        return source if source.endswith(".onnx") else None
    found = [path for path in (os.path.join(source, ONNX_FILE), os.path.join(source, "onnx", ONNX_FILE))
             if os.path.isfile(path)]
    return found[0] if found else None


def _onnx_source(source: str, model_file: str, include: Sequence[str],
                 exclude: Sequence[str]) -> tuple[Tensors, dict[str, str]]:
    """The model's graph and initializers, and what its folder carries; only this imports ``onnx``."""
    if include or exclude:
        raise ConvertError(f"{source}: --include and --exclude do not apply to an ONNX model, "
                           "whose graph needs every initializer")
    if not extras.installed("onnx"):
        raise ConvertError(f"{source}: {extras.missing('onnx', 'converting an ONNX model')}")
    from .onnx_convert import onnx_tensors

    meta = _onnx_folder_metadata(source) if os.path.isdir(source) else {}
    tensors, implied = onnx_tensors(model_file)
    return tensors, meta | implied | {MODEL_KEY: ONNX}


def _onnx_folder_metadata(folder: str) -> dict[str, str]:
    """What :func:`_folder_metadata` reads (``config.json`` is optional here), and the pooling."""
    meta = _folder_metadata(folder, _json_file(folder, "config.json"))
    pooling = _pooling(folder)
    if pooling is not None:
        meta[POOLING_KEY] = json.dumps(pooling)
    return meta


def _pooling(folder: str) -> dict[str, Any] | None:
    """How sentence-transformers makes one embedding of the token states: the mode its
    ``1_Pooling/config.json`` sets (``pooling_mode`` since 5.0, one ``pooling_mode_*`` flag
    before), and whether ``modules.json`` has a Normalize module."""
    settings = _json_file(folder, os.path.join("1_Pooling", "config.json"))
    if settings is None:
        return None
    if "pooling_mode" in settings:
        mode = settings["pooling_mode"]
        chosen = [str(m) for m in mode] if isinstance(mode, list) else [str(mode)]
        modes = dict(zip(POOLING_MODES, POOLING_MODES))
    else:
        chosen = sorted(key for key, value in settings.items()
                        if key.startswith("pooling_mode_") and value is True)
        modes = POOLING_FLAGS
    if len(chosen) != 1 or chosen[0] not in modes:
        raise ConvertError(f"{os.path.join(folder, '1_Pooling', 'config.json')}: pooling "
                           f"{' + '.join(chosen) or 'none'} is not supported (one of "
                           f"{', '.join(modes)})")
    return {"mode": modes[chosen[0]], "normalize": _normalizes(folder)}


def _normalizes(folder: str) -> bool:
    path = os.path.join(folder, "modules.json")
    if not os.path.exists(path):
        return False
    try:
        modules = json.loads(_text(path))
    except ValueError as exc:
        raise ConvertError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(modules, list) or not all(isinstance(module, dict) for module in modules):
        raise ConvertError(f"{path}: not a JSON list of modules")
    return any(module.get("type") in NORMALIZE_MODULES for module in modules)


# Tensor files.


def _read(path: str, stack: ExitStack) -> Iterator[tuple[str, burnpack.Deferred]]:
    if path.endswith(".safetensors"):
        return _read_safetensors(path, stack)
    if path.endswith(".npz"):
        return _read_npz(path, stack)
    raise ConvertError(f"{path}: not a .safetensors file, an .npz archive or a model folder, "
                       "nor an .onnx model")


def _read_safetensors(path: str, stack: ExitStack) -> Iterator[tuple[str, burnpack.Deferred]]:
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ConvertError(f"{path}: {extras.missing('safetensors', 'reading .safetensors')}") from None

    try:
        handle = stack.enter_context(safe_open(path, framework="np"))
        names = list(handle.keys())
        shapes = {name: handle.get_slice(name) for name in names}
    except (OSError, SafetensorError) as exc:
        raise ConvertError(f"{path}: cannot read as safetensors: {exception_text(exc)}") from exc
    raw: dict[str, Any] | None = None
    for name in names:
        kind, shape = shapes[name].get_dtype(), tuple(shapes[name].get_shape())
        burn = SAFETENSORS_DTYPES.get(kind)
        if burn is None:
            raise ConvertError(f"{path}: tensor {name} has dtype {kind}, which Burnpack cannot "
                               f"store (supported: {', '.join(SAFETENSORS_DTYPES)})")
        if kind == "BF16":  # numpy has no bfloat16: its bits, as Burnpack stores them
            raw = raw if raw is not None else _safetensors_offsets(path)
            load = _byte_range(path, raw, name, shape)
            yield name, burnpack.Deferred(dtypes.BY_NAME["BF16"], shape, load)
        else:
            yield name, burnpack.Deferred(dtypes.BY_NAME[burn].numpy, shape,
                                          _tensor_of(handle, path, name))


def _tensor_of(handle: Any, path: str, name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        try:
            return np.asarray(handle.get_tensor(name))
        except Exception as exc:
            raise ConvertError(f"{path}: cannot read tensor {name}: {exception_text(exc)}") from exc
    return load


def _safetensors_offsets(path: str) -> dict[str, Any]:
    """The header of a safetensors file (8-byte length, then JSON): where each tensor's bytes
    are, which the numpy API does not say; only needed for BF16, which it cannot read."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length > SAFETENSORS_HEADER_MAX:
            raise ConvertError(f"{path}: safetensors header of {length} bytes is too large")
        header = json.loads(f.read(length))
    return {"start": 8 + length, "tensors": header}


def _byte_range(path: str, raw: dict[str, Any], name: str, shape: tuple[int, ...]) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        begin, end = raw["tensors"][name]["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != 2 * count:
            raise ConvertError(f"{path}: tensor {name} holds {end - begin} bytes, not {2 * count}")
        return read_values(path, raw["start"] + begin, np.dtype("<u2"), shape, f"{path}: tensor {name}")
    return load


def _read_npz(path: str, stack: ExitStack) -> Iterator[tuple[str, burnpack.Deferred]]:
    try:
        archive = stack.enter_context(np.load(path, allow_pickle=False))
    except _NPZ_ERRORS as exc:
        raise ConvertError(f"{path}: cannot read as .npz: {exception_text(exc)}") from exc
    for name in archive.files:
        header, data = _npy_header(path, archive, name)
        dtype, shape = header.dtype, header.shape
        try:
            dtypes.from_numpy(dtype)
        except burnpack.BurnpackError:
            raise ConvertError(f"{path}: array {name} has dtype {dtype}, which Burnpack cannot "
                               "store") from None
        if header.nbytes != data:  # checked before reading, which would allocate what the header says
            raise ConvertError(f"{path}: array {name}: its header says {dtype} {list(shape)} "
                               f"({header.nbytes} bytes), the archive holds {data}")
        yield name, burnpack.Deferred(dtype.newbyteorder("<"), shape, _member(archive, path, name))


def _npy_header(path: str, archive: Any, name: str) -> tuple[npy.NpyHeader, int]:
    """An array's .npy header, and the bytes of data the member holds, without reading its data."""
    try:
        with archive.zip.open(f"{name}.npy") as member:
            header = npy.read_header(member)
            data = archive.zip.getinfo(f"{name}.npy").file_size - member.tell()
    except (*_NPZ_ERRORS, KeyError) as exc:
        raise ConvertError(f"{path}: array {name}: {exception_text(exc)}") from exc
    return header, data


def _member(archive: Any, path: str, name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        try:
            return np.ascontiguousarray(archive[name])
        except _NPZ_ERRORS as exc:
            raise ConvertError(f"{path}: array {name}: {exception_text(exc)}") from exc
    return load

