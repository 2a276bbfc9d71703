"""Which models a pool serves, and the settings that differ from one model to another.

``serve`` takes one or more models: a weight file (served under its file's name without
``.bpk``), ``NAME=FILE`` (served as NAME), or a folder (every ``.bpk`` in it, a model
repository, read again on SIGHUP). A setting that may differ by model (:data:`PER_MODEL`) is
given as the option's value for every model, or as ``NAME=VALUE`` for one: ``--max-batch 32
--max-batch rerank=8`` batches 32 rows everywhere but 8 for the model named rerank.

A model's name travels in the route frame (``protocol/route.py``), in KServe's URL path
(``/v2/models/NAME``) and in OpenAI's ``model`` field, so it is kept to what all of them carry
without escaping (:data:`NAME_RULE`): the one rule for the command line, the wire and URLs.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MODEL_SUFFIX = ".bpk"
MAX_MODEL_NAME = 128
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_MODEL_NAME - 1}}}")
NAME_RULE = (f"letters, digits, '.', '_' and '-', starting with a letter or a digit, at most "
             f"{MAX_MODEL_NAME} characters")
PER_MODEL = ("model", "max_batch", "batch_wait", "pass_budget", "workers")  # the settings NAME=VALUE gives one model


def is_model_name(text: str) -> bool:
    return isinstance(text, str) and _NAME.fullmatch(text) is not None


def model_name_problem(text: str) -> str | None:
    """Why ``text`` cannot name a model, or None when it can."""
    if is_model_name(text):
        return None
    if not isinstance(text, str):
        return f"a model's name is a string, not {type(text).__name__}"
    return f"{text[:60]!r} cannot name a model: a name is {NAME_RULE}"


def stem(path: str) -> str:
    """The name a weight file serves under by default: its file name without ``.bpk``."""
    name = path.rstrip("/").rpartition("/")[2]
    return name[:-len(MODEL_SUFFIX)] if name.endswith(MODEL_SUFFIX) and len(name) > len(MODEL_SUFFIX) else name


class ModelsError(ValueError):
    """The models asked for cannot be served as given: the message says why."""


@dataclass(frozen=True)
class ModelEntry:
    """One model a pool serves: its name, its weight file, and its own settings."""

    name: str
    path: str
    factory: str | None = None  # --model: a built-in model or package.module:factory; None: the file says
    max_batch: int = 32
    batch_wait: float = 0.0
    pass_budget: float = 0.025  # seconds one message of texts may run (--pass-budget); 0: no bound
    workers: int | None = None  # workers that map it; None: every worker
    folder: str | None = None  # the folder it was found in, when it came from one
    truncate: bool = False  # --truncate: texts over the limit are cut, not refused


@dataclass(frozen=True)
class ModelList:
    """The models named on the command line (or in a config file), before their settings."""

    named: list[tuple[str, str, str | None]] = field(default_factory=list)  # name, path, folder
    folders: list[str] = field(default_factory=list)


def per_model(parse: Callable[[str], Any]) -> Callable[[str], tuple[str | None, Any]]:
    """A setting's parser that also takes ``NAME=VALUE``: (NAME or None, the value)."""

    def parse_for_model(text: str) -> tuple[str | None, Any]:
        name, equals, value = text.partition("=")
        if equals and is_model_name(name):
            return name, parse(value)
        return None, parse(text)

    parse_for_model.__name__ = getattr(parse, "__name__", "value")  # argparse names it in errors
    return parse_for_model


def split_per_model(given: Any, default: Any) -> tuple[Any, dict[str, Any]]:
    """The value for every model and the values for single models, from what an option that
    takes ``NAME=VALUE`` collected (a list of pairs; the last value for each wins)."""
    if not isinstance(given, list):
        return given, {}
    everyone, single = default, {}
    for name, value in given:
        if name is None:
            everyone = value
        else:
            single[name] = value
    return everyone, single


def list_models(arguments: Sequence[str], resolve: Callable[[str], str]) -> ModelList:
    """The models ``arguments`` name: ``FILE``, ``NAME=FILE`` or a folder. ``resolve`` finds the
    file a path names (an extensionless one gets ``.bpk``). Names must be distinct."""
    found = ModelList()
    for argument in arguments:
        name, equals, path = argument.partition("=")
        if equals and not is_model_name(name) and not os.path.exists(argument):
            raise ModelsError(f"{argument}: {model_name_problem(name)}")
        if equals and is_model_name(name) and not path:
            raise ModelsError(f"{argument}: name a weight file after '='")
        if not (equals and is_model_name(name)):
            name, path = "", argument
        if not name and os.path.isdir(path):
            found.folders.append(os.path.abspath(path))
            found.named.extend((stem(file), file, os.path.abspath(path)) for file in models_in(path))
            continue
        path = resolve(path)
        name = name or stem(path)
        problem = model_name_problem(name)
        if problem is not None:
            raise ModelsError(f"{argument}: {problem}; name it with NAME={path}")
        found.named.append((name, path, None))
    names = [name for name, _, _ in found.named]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ModelsError(f"two models would be named {', '.join(map(repr, twice))}: name them apart "
                          "with NAME=FILE")
    return found


def models_in(folder: str) -> list[str]:
    """The weight files in ``folder`` (a model repository), in order of name; a file whose name
    is no model's name is left out, with a warning."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise ModelsError(f"{folder}: cannot list it: {exc.strerror or exc}") from exc
    files = [name for name in names if name.endswith(MODEL_SUFFIX) and os.path.isfile(os.path.join(folder, name))]
    for name in files:
        if not is_model_name(stem(name)):
            log.warning("not serving %s in %s: %s", name, folder, model_name_problem(stem(name)))
    return [os.path.join(os.path.abspath(folder), name) for name in files if is_model_name(stem(name))]


def entries(found: ModelList, everyone: Mapping[str, Any],
            single: Mapping[str, Mapping[str, Any]]) -> list[ModelEntry]:
    """Each model with its settings: ``single[setting][name]`` where given, else
    ``everyone[setting]``. A setting given for a model that is not served is refused: a typo
    would otherwise change nothing without a word. With a folder it is only warned of: the
    folder may get the model later."""
    served = {name for name, _, _ in found.named}
    for setting, values in single.items():
        unknown = sorted(set(values) - served)
        if not unknown:
            continue
        why = (f"--{setting.replace('_', '-')} {unknown[0]}=...: no model is named {unknown[0]!r} "
               f"(served: {', '.join(sorted(served))})")
        if not found.folders:
            raise ModelsError(why)
        log.warning("%s; it applies if a folder gets one", why)
    return [entry_for(name, path, folder, everyone, single) for name, path, folder in found.named]


def entry_for(name: str, path: str, folder: str | None, everyone: Mapping[str, Any],
              single: Mapping[str, Mapping[str, Any]]) -> ModelEntry:
    """The entry of one model: its own settings where given, else every model's."""
    own = {setting: single.get(setting, {}).get(name, everyone.get(setting)) for setting in PER_MODEL}
    workers = own.pop("workers")
    return ModelEntry(name, path, own["model"], own["max_batch"], own["batch_wait"], own["pass_budget"],
                      workers if name in single.get("workers", {}) else None, folder,
                      bool(everyone.get("truncate")))


def named(entries_: Iterable[ModelEntry]) -> dict[str, ModelEntry]:
    return {entry.name: entry for entry in entries_}
