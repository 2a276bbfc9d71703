"""The contract between a supervisor and the worker processes it starts.

:class:`WorkerSpec` is everything a worker needs to know, typed, with a :class:`ModelSpec` for
each model it maps and serves; each checks its own values. A
spawned worker is a fresh interpreter (``python -m workerpool.worker.child worker``), so its
spec crosses a command line (:meth:`WorkerSpec.to_argv`, :meth:`WorkerSpec.from_argv`); a
forked one's crosses the template's socket as a JSON object (:meth:`WorkerSpec.to_data`,
:meth:`WorkerSpec.from_data`) and reaches the worker as a spec, never parsed as arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from ..config import values
from ..config.models import model_name_problem
from ..config.pool import (
    DEFAULT_LOAD,
    DEFAULT_LOG_LEVEL,
    HEARTBEAT_SECONDS,
    LIVENESS_BEATS,
    LOAD_MODES,
)
from ..logs import LEVELS

MAX_TEXT = 4096  # characters of a path, endpoint or name in a spec (the kernel's PATH_MAX)
MAX_NUMBERS = 8  # items of a list of numbers in a spec (a file identity has four)
MAX_MODELS = 256  # models one worker may serve
MIN_HEARTBEAT = 0.001  # seconds: ZeroMQ's heartbeat options count whole milliseconds

# Exit codes by which a worker tells its supervisor why it stopped.
EXIT_LOAD_FAILED = 3  # the file or the model is unusable
EXIT_FILE_CHANGED = 4  # the file was replaced while the worker started: validate the new one
EXIT_REFUSED = 5  # the router refused the worker: its model does not fit
TOKEN_ENV = "WORKERPOOL_WORKER_TOKEN"  # the secret a local worker registers with
EXIT_RECYCLED = 6  # the worker's private memory passed --max-worker-memory: replace it
# How a supervisor tells a worker to leave the pool. Not SIGTERM: a forked worker shares the
# supervisor's command line, and ``pkill -f`` or a service manager's SIGTERM to every process
# must drain the pool through the supervisor, not make each worker walk away from its queue.
STOP_SIGNAL = signal.SIGUSR1
# The supervisor's own control signals: a template or worker that shares its command line (so
# ``pkill -HUP -f 'workerpool serve'`` reaches it) must neither die nor stop on them.
CONTROL_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGTTIN, signal.SIGTTOU)


class InvalidSpec(ValueError):
    """What makes a spec's values no spec: said to whoever gave them."""


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model a worker serves: its name, the file it maps and the generation of it."""

    name: str
    path: str
    factory: str | None = None  # --model; None: as the file says
    generation: int = field(default=1, metadata={"least": 1})
    expect: list[int] | None = None  # the file identity the supervisor validated
    source: str | None = None  # opened instead of the path: the supervisor's descriptor of the file it validated
    max_batch: int = field(default=32, metadata={"least": 1})  # rows one forward pass may take
    truncate: bool = False  # texts over the model's limit are cut, not refused

    def __post_init__(self) -> None:
        _check(self)
        problem = model_name_problem(self.name)
        if problem is not None:
            raise InvalidSpec(f"name: {problem}")

    def to_data(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_data(cls, data: object) -> ModelSpec:
        return cls(**_known_fields(cls, data, "a model's spec"))


def _models(text: str) -> list[ModelSpec]:
    """The models of a worker's command line: a JSON list of :meth:`ModelSpec.to_data`."""
    listed = json.loads(text)
    if not isinstance(listed, list):
        raise InvalidSpec("models: not a JSON list")
    return [ModelSpec.from_data(item) for item in listed]


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """What one worker serves and how it reaches its router.

    Each field is also an option of the worker's command line, ``--`` and its name: its type
    says how the option is parsed (``bool``: a switch, a list: JSON), its metadata adds the
    option's help and choices. A field without a default is a required option. A spec that
    breaks its types, sizes, choices or key pairs is not made: :class:`InvalidSpec` says why.
    """

    models: list[ModelSpec] = field(metadata={"help": "the models to serve, as a JSON list"})
    backend: str | None = field(default=None, metadata={
        "help": "the router's endpoint, for a worker host's worker (a local worker has a link)"})
    link_fd: int | None = field(default=None, metadata={
        "help": "the inherited end of this worker's link to its router", "least": 0})
    load: str = field(default=DEFAULT_LOAD, metadata={"choices": LOAD_MODES})
    heartbeat: float = field(default=HEARTBEAT_SECONDS, metadata={"least": MIN_HEARTBEAT})
    liveness: int = field(default=LIVENESS_BEATS, metadata={"least": 1})
    log_level: str = field(default=DEFAULT_LOG_LEVEL, metadata={"choices": LEVELS})
    remote: bool = field(default=False, metadata={
        "help": "the router is on another host: wait for it instead of exiting"})
    ready_fd: int | None = field(default=None, metadata={
        "help": "write to this inherited pipe once the model is built", "least": 0})
    curve_key: str | None = field(default=None, metadata={"help": "this host's secret key file"})
    curve_server_key: str | None = field(default=None, metadata={"help": "the router's public key file"})
    max_memory: int | None = field(default=None, metadata={
        "help": "bytes of private memory past which the worker recycles itself", "least": 1})
    parent: int | None = field(default=None, metadata={
        "help": "the supervisor's pid: exit at once if it is already gone", "least": 1})
    threads: int | None = field(default=None, metadata={
        "help": "threads for numpy's BLAS and OpenMP pools", "least": 1})  # None leaves the libraries' defaults
    cache_dir: str | None = field(default=None, metadata={
        "help": "where the model keeps what it prepares once per machine"})  # None: nothing

    def __post_init__(self) -> None:
        _check(self)
        names = [model.name for model in self.models]
        if len(set(names)) != len(names):
            raise InvalidSpec(f"models: two are named alike ({', '.join(names)})")
        unpaired = values.unpaired(("--curve-key", self.curve_key),
                                   ("--curve-server-key", self.curve_server_key))
        if unpaired:
            raise InvalidSpec(unpaired)
        if self.backend is not None and self.link_fd is not None:
            raise InvalidSpec("a worker reaches its router through --backend or --link-fd, not both")

    def to_data(self) -> dict[str, Any]:
        """Every field by name, as a JSON object holds them (``from_data`` reads it back)."""
        return {f.name: [m.to_data() for m in self.models] if f.name == "models" else getattr(self, f.name)
                for f in fields(self)}

    @classmethod
    def from_data(cls, data: object) -> WorkerSpec:
        """The spec ``to_data`` gave, arrived from another process: checked as any spec is,
        and with no field unknown or missing."""
        known = _known_fields(cls, data, "a worker spec")
        listed = known.get("models")
        if not isinstance(listed, list):
            raise InvalidSpec(f"models: {type(listed).__name__} where a list belongs")
        return cls(**known | {"models": [ModelSpec.from_data(item) for item in listed]})

    def to_argv(self) -> list[str]:
        """The settings every worker is given, then those given only when set."""
        given = [f for f in fields(self) if not _unset(f.default)]
        when_set = [f for f in fields(self) if _unset(f.default)]
        argv = []
        for f in given + when_set:
            value = getattr(self, f.name)
            if f.name == "models":
                argv += [_flag(f), json.dumps(self.to_data()["models"])]
            elif value is True:
                argv.append(_flag(f))
            elif not _unset(value):
                argv += [_flag(f), str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> WorkerSpec:
        parser = build_parser()
        try:
            return cls(**vars(parser.parse_args(argv)))
        except InvalidSpec as exc:
            parser.error(str(exc))


_PARSE: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "list[ModelSpec]": _models}
"""How an option's text becomes its field's value, by the field's type (``str``: as it is)."""


_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float),
                                        "bool": (bool,), "list[int]": (list,), "list[ModelSpec]": (list,)}
"""The Python types a field's value may have, by the field's type."""


def _check(spec: Any) -> None:
    """Refuse a spec (worker or model) whose fields break their types, sizes or choices."""
    for f in fields(spec):
        problem = _problem(f, getattr(spec, f.name))
        if problem:
            raise InvalidSpec(f"{f.name}: {problem}")


def _known_fields(kind: type, data: object, what: str) -> dict[str, Any]:
    """``data`` when it is a JSON object with every field of ``kind`` it needs and no other."""
    if not isinstance(data, dict):
        raise InvalidSpec(f"{what} is a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in fields(kind)})
    missing = [f.name for f in fields(kind) if f.default is MISSING and f.name not in data]
    if unknown or missing:
        raise InvalidSpec(f"unknown fields {unknown}, missing fields {missing}")
    return data


def _kind(f: Field[Any]) -> str:
    return str(f.type).removesuffix(" | None")


def _problem(f: Field[Any], value: object) -> str | None:
    """What is wrong with ``value`` for the field ``f``, or None."""
    kind = _kind(f)
    if value is None:
        return None if str(f.type).endswith(" | None") else "must be given"
    if not isinstance(value, _TYPES[kind]) or (isinstance(value, bool) and kind != "bool"):
        return f"{type(value).__name__} where {kind} belongs"
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return f"{len(value)} characters, more than {MAX_TEXT}"
    if isinstance(value, str) and "\0" in value:
        return "holds a NUL character, which no path, endpoint or name may"
    least = f.metadata.get("least")
    if isinstance(value, int | float) and not isinstance(value, bool) \
            and not (math.isfinite(value) and (least is None or value >= least)):
        return f"{value!r} is not a number from {least} up"
    if kind == "list[ModelSpec]":
        if not isinstance(value, list) or not 0 < len(value) <= MAX_MODELS \
                or not all(isinstance(item, ModelSpec) for item in value):
            return f"not a list of 1 to {MAX_MODELS} models"
    elif isinstance(value, list) and (len(value) > MAX_NUMBERS or
                                      not all(type(item) is int for item in value)):
        return f"not a list of at most {MAX_NUMBERS} integers"
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
        return f"{value!r} is not one of {', '.join(choices)}"
    return None


def _described(f: Field[Any]) -> dict[str, Any]:
    """What argparse takes of a field's metadata (the rest, such as ``least``, is checked here)."""
    return {key: f.metadata[key] for key in ("help", "choices") if key in f.metadata}


def _flag(f: Field[Any]) -> str:
    return "--" + f.name.replace("_", "-")


def _unset(value: object) -> bool:
    """A value that the worker's command line leaves out: it is the default of the option."""
    return value is None or value is False


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workerpool-worker",
                                     description="One worker process; started by a supervisor.")
    for f in fields(WorkerSpec):
        if _kind(f) == "bool":
            parser.add_argument(_flag(f), action="store_true", **_described(f))
        elif f.default is MISSING:
            parser.add_argument(_flag(f), type=_PARSE.get(_kind(f), str), required=True, **_described(f))
        else:
            parser.add_argument(_flag(f), type=_PARSE.get(_kind(f), str), default=f.default, **_described(f))
    return parser
