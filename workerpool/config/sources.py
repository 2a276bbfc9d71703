"""Where ``serve`` and ``workers`` options come from besides the command line.

A TOML file (``--config FILE``) and environment variables ``WORKERPOOL_<OPTION>`` (the option's
long name in capitals, dashes as underscores: ``WORKERPOOL_MAX_BATCH=16``) are turned into
command-line arguments placed before the real ones, file first, so that argparse itself
applies the precedence: command line over environment over file over default. Every value goes
through the same checks as on the command line, first here, so that a bad one is reported with
the key and file, or the variable, it came from. A key the command does not know is an error
naming it and the closest one; a ``WORKERPOOL_`` variable that names no option gets a warning
(:func:`unknown_variables`), and an empty one counts as unset. Keys are written as the options
are, with dashes (``max-batch``); underscores are read too.

The models to serve are the command line's arguments, else ``WORKERPOOL_MODELS`` (separated by
white space, quoted as a shell would), else the file's ``models`` key (a string or a list). An
option that takes ``NAME=VALUE`` for one model takes a list in a file (``max-batch = [32,
"rerank=8"]``) and items separated by white space in a variable.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .settings import SETTINGS

ENV_PREFIX = "WORKERPOOL_"
NOT_FROM_SOURCES = {"help"} | {setting.name for setting in SETTINGS if not setting.from_files}
MODELS_KEY = "models"  # the file's key, and the variable's suffix, for the models to serve
# Variables read by other commands or by workers, not options of serve and workers.
OTHER_VARIABLES = {ENV_PREFIX + "CONTROL", ENV_PREFIX + "WORKER_TOKEN", ENV_PREFIX + MODELS_KEY.upper()}
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


class SourceError(Exception):
    """A configuration file or variable that cannot be used; the message names it."""


def options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options a file or the environment may set, by key (``max_batch``)."""
    return {action.dest: action for action in parser._actions
            if action.option_strings and action.dest not in NOT_FROM_SOURCES}


def arguments(parser: argparse.ArgumentParser, config: str | None, environ: Mapping[str, str]) -> list[str]:
    """Command-line arguments for the file's settings, then the environment's."""
    options = options_of(parser)
    found: list[str] = []
    if config is not None:
        for key, value in _read(config).items():
            if key == MODELS_KEY:
                continue
            action = options.get(key.replace("-", "_"))
            if action is None:
                raise SourceError(f"{config}: unknown key {key!r}{closest(key_of(key), map(key_of, options))} "
                                  f"(the keys are the long options of '{parser.prog} --help')")
            found += _as_arguments(parser, action, value, f"{config}: {key}")
    for dest, action in options.items():
        name = ENV_PREFIX + dest.upper()
        if not environ.get(name):  # set and not empty: `WORKERPOOL_X=` unsets X, as shells expect
            continue
        items = environ[name].split() if isinstance(action, argparse._AppendAction) else [environ[name]]
        for item in items:
            found += _as_arguments(parser, action, item, name)
    return found


def models(config: str | None, environ: Mapping[str, str]) -> list[str]:
    """The models to serve that the environment, else the file, names (none: an empty list)."""
    variable = environ.get(ENV_PREFIX + MODELS_KEY.upper())
    if variable:
        try:
            return shlex.split(variable)
        except ValueError as exc:
            raise SourceError(f"{ENV_PREFIX}{MODELS_KEY.upper()}: {exc}") from None
    if config is None:
        return []
    value = _read(config).get(MODELS_KEY, [])
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(item, str) for item in listed):
        raise SourceError(f"{config}: {MODELS_KEY} is a weight file, NAME=FILE or folder, or a list of them")
    return listed


def unknown_variables(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> list[str]:
    """A line for each ``WORKERPOOL_`` variable that names no option of ``parser``: a misspelt
    one would otherwise be ignored without a word. An empty one is unset, so it is not one:
    an environment made for ``serve`` (a container image's) unsets for ``workers`` what only
    ``serve`` takes."""
    known = {ENV_PREFIX + dest.upper() for dest in options_of(parser)}
    return [f"{name} names no option of '{parser.prog}' and is ignored{closest(name, known)}"
            for name in sorted(environ) if name.startswith(ENV_PREFIX) and environ[name]
            and name not in known and name not in OTHER_VARIABLES]


def closest(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the choice nearest ``word``, or nothing when none is near."""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def key_of(dest: str) -> str:
    """How a setting is written in a file and in docs: ``max_batch`` is ``max-batch``."""
    return dest.replace("_", "-")


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SourceError(f"{path}: not valid TOML: {exc}") from exc


def _as_arguments(parser: argparse.ArgumentParser, action: argparse.Action, value: Any,
                  where: str) -> list[str]:
    if isinstance(value, list) and isinstance(action, argparse._AppendAction) \
            and not any(isinstance(item, list) for item in value):  # a value for every model, or for one
        return [argument for item in value for argument in _as_arguments(parser, action, item, where)]
    flag = action.option_strings[-1]
    if action.nargs == 0:  # a switch such as --no-watch
        if isinstance(value, str) and value.lower() in TRUE | FALSE:
            value = value.lower() in TRUE
        if not isinstance(value, bool):
            raise SourceError(f"{where}: {flag} is a switch: give true or false, not {value!r}")
        return [flag] if value else []
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SourceError(f"{where}: {flag} takes a value such as on the command line, not {value!r}")
    try:
        parser._get_values(action, [str(value)])  # argparse's own checks, named by ``where``
    except argparse.ArgumentError as exc:
        raise SourceError(f"{where}: {exc.message}") from None
    return [f"{flag}={value}"]


def effective(parser: argparse.ArgumentParser, args: argparse.Namespace,
              shown: Mapping[str, Any] | None = None) -> str:
    """The settings ``args`` holds, as a TOML file ``--config`` would read back: ``shown``
    maps a key to how its value is written when that differs from the parsed value (a list:
    the value for every model, then ``NAME=VALUE`` for single ones)."""
    lines = [f"{MODELS_KEY} = {_toml(list(args.models))}"] if getattr(args, MODELS_KEY, None) else []
    for dest in sorted(options_of(parser)):
        value = (shown or {}).get(dest, getattr(args, dest))
        key = key_of(dest)
        lines.append(f"# {key}: not set" if value is None else f"{key} = {_toml(value)}")
    return "\n".join(lines)


def _toml(value: Any) -> str:
    """``value`` as TOML writes it: a boolean, a number, a string or a list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return json.dumps(str(value))


def command_line(argv: Sequence[str], extra: list[str]) -> list[str]:
    """``argv`` (``[command, ...]``) with ``extra`` placed before the command's own arguments."""
    return [argv[0], *extra, *argv[1:]]

