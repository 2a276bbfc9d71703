"""``serve`` and ``workers``: the commands that run a pool, their options from the settings
table, a ``--config`` file and the environment."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from .. import burnpack, extras, security
from ..config import settings
from ..config import sources as config_sources
from ..config.models import (
    PER_MODEL,
    ModelList,
    ModelsError,
    list_models,
    model_name_problem,
    split_per_model,
)
from ..config.models import entries as model_entries
from ..config.pool import HostConfig, PoolConfig, ServeConfig, StartupError
from ..config.values import unpaired
from ..logs import setup_logging
from ..pool import run as pool
from .arguments import add_settings, client_keys
from .failures import CommandError, reported
from .parser import Handler, Subcommands, add_command, command_name

Config = TypeVar("Config", bound=PoolConfig)


def add_serve(sub: Subcommands) -> None:
    _add_pool_command(sub, cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """serve one or more models from N worker processes

    Serve each MODEL from --workers processes that each map its file read-only, so the weights sit
    in memory once, however many workers there are: every worker serves every model unless
    --workers NAME=N gives a model fewer. A request names its model (one with no name goes to the
    only model). Prints one 'workerpool: serving ...' line on stdout when every worker is ready;
    logs go to stderr. SIGTERM/SIGINT finish in-flight requests and exit 0; SIGTTIN/SIGTTOU
    add/remove a worker; SIGHUP checks the weight files and reads model folders again. Exit 2
    when a file or model is invalid.

    Settings that may differ by model (--model, --max-batch, --batch-wait, --pass-budget,
    --workers) are given once for every model, or as NAME=VALUE for one: --max-batch 32
    --max-batch rerank=8.
    """
    if split_per_model(args.workers, None)[0] == 0 and not args.backend:
        raise CommandError("--workers 0 serves nothing unless worker hosts can join: give --backend",
                           exit_code=2)
    if args.http and not extras.installed("httptools"):
        raise CommandError(extras.missing("httptools", "--http"), exit_code=2)
    return _run_pool(pool.serve, _pool_config(ServeConfig, args, server_keys=_server_keys(args)))


def add_workers(sub: Subcommands) -> None:
    _add_pool_command(sub, cmd_workers)


def cmd_workers(args: argparse.Namespace) -> int:
    """run N workers on this host for a router on another host

    Start N worker processes on this host that map MODEL.bpk (this host's own copy) and serve
    through the router of 'workerpool serve --backend tcp://...' on another host. Workers are
    replaced when they die, reconnect when the router restarts, and roll to new weights one at a
    time when MODEL.bpk is replaced by rename.
    """
    if not args.connect:
        raise CommandError("workers needs --connect ENDPOINT (or connect in --config, or "
                           "WORKERPOOL_CONNECT)", exit_code=2)
    return _run_pool(pool.run_host, _pool_config(HostConfig, args, keys=client_keys(args)))


def _add_pool_command(sub: Subcommands, handler: Handler) -> None:
    """A command whose options are the settings it takes (:func:`with_sources` reads the file
    and the environment by its parser, ``command_parser``)."""
    parser = add_command(sub, handler)
    add_settings(parser, command_name(handler))


def with_sources(parser: argparse.ArgumentParser, argv: list[str],
                 args: argparse.Namespace) -> argparse.Namespace:
    """``args`` again with the settings of ``--config`` and ``WORKERPOOL_*`` placed before the
    command line's, which therefore wins; the models too, when the command line names none."""
    for line in config_sources.unknown_variables(args.command_parser, os.environ):
        print(f"workerpool: warning: {line}", file=sys.stderr)
    with reported(config_sources.SourceError, exit_code=2):
        extra = config_sources.arguments(args.command_parser, args.config, os.environ)
        listed = config_sources.models(args.config, os.environ)
    if extra:
        args = parser.parse_args(config_sources.command_line(argv, extra))
    args.models = args.models or listed
    return args


def effective_config(args: argparse.Namespace) -> str:
    """``--print-config``: the settings in effect, as a ``--config`` file."""
    shown = {}
    for setting in settings.of_command(args.command):
        if setting.per_model:
            everyone, single = split_per_model(getattr(args, setting.name), setting.initial())
            write = setting.file_value or (lambda value: value)
            listed = [*([] if everyone is None else [write(everyone)]),
                      *(f"{name}={write(value)}" for name, value in single.items())]
            shown[setting.name] = listed if single else (listed[0] if listed else None)
        elif setting.file_value:
            shown[setting.name] = setting.file_value(getattr(args, setting.name))
    return config_sources.effective(args.command_parser, args, shown)


def _pool_config(kind: type[Config], args: argparse.Namespace, **derived: Any) -> Config:
    """A config from the options named like its fields, so each setting is named once (by its
    option), plus the settings ``derived`` from several options, and the models served."""
    options = {f.name: getattr(args, f.name) for f in fields(kind) if hasattr(args, f.name)}
    options["watch_interval"] = None if args.no_watch else args.watch_interval
    everyone, single = {}, {}
    for name in PER_MODEL:
        default = settings.setting(name).initial()  # a setting serve alone takes: every model its default
        everyone[name], single[name] = split_per_model(getattr(args, name, default), default)
    options["workers"] = everyone["workers"]
    everyone["truncate"] = getattr(args, "truncate", False)
    with reported(ModelsError, exit_code=2):
        found = list_models(args.models, burnpack.resolve)  # "model" for model.bpk, as later checks read it
        served = _served(found, args, everyone["workers"], single["workers"])
        options["models"] = model_entries(_renamed(served, getattr(args, "model_name", None)), everyone, single)
    options["folders"] = found.folders
    options["model_defaults"], options["model_settings"] = everyone, single
    return kind(**options | derived)


def _served(found: ModelList, args: argparse.Namespace, workers: int, own: dict[str, int]) -> ModelList:
    """``found``, refused when it names no model or a model's worker count does not fit."""
    if found.folders and not found.named:  # a folder serves its .bpk files, and holds none
        folder = found.folders[0]
        raise ModelsError(f"{folder}: a folder of no Burnpack file; {burnpack.folder_hint(folder)}")
    if not found.named:
        raise ModelsError(f"no model to serve: give a weight file (MODEL.bpk), NAME=FILE or a folder of "
                          f".bpk files ({args.command} --help)")
    for name, count in own.items():
        if not 1 <= count <= max(workers, 1):
            raise ModelsError(f"--workers {name}={count}: a model is served by 1 to --workers "
                              f"({workers}) workers")
    limited = [own[name] for name, _, _ in found.named if name in own]
    if not found.folders and len(limited) == len(found.named) and max(limited) < workers:
        raise ModelsError(f"every model is given fewer workers than --workers {workers}: the other "
                          f"{workers - max(limited)} would serve nothing; leave one model to every "
                          f"worker, or give --workers {max(limited)}")
    return found


def _renamed(found: ModelList, name: str | None) -> ModelList:
    """``found`` with its one model named ``name`` (--model-name), when given."""
    if name is None:
        return found
    if len(found.named) != 1 or found.folders:
        raise ModelsError("--model-name names the one model served; with several, name each with NAME=FILE")
    problem = model_name_problem(name)
    if problem is not None:
        raise ModelsError(f"--model-name: {problem}")
    _, path, _ = found.named[0]
    return ModelList([(name, path, None)])


def _run_pool(run: Callable[[Config], int], config: Config) -> int:
    """Run a pool until it stops; one that cannot start exits 2, like a usage error."""
    setup_logging(config.log_level, config.log_format)
    with reported(StartupError, exit_code=2):
        return run(config)


def _server_keys(args: argparse.Namespace) -> security.ServerKeys | None:
    """``serve``'s CURVE keys: its own secret key and the allowed clients' (and worker hosts')."""
    mismatch = unpaired(("--curve-secret-key", args.curve_secret_key),
                        ("--curve-client-keys", args.curve_client_keys))
    if mismatch:
        raise CommandError(mismatch, exit_code=2)
    if args.curve_worker_keys and not args.curve_secret_key:
        raise CommandError("--curve-worker-keys needs --curve-secret-key and --curve-client-keys",
                           exit_code=2)
    if not args.curve_secret_key:
        return None
    return security.ServerKeys(args.curve_secret_key, args.curve_client_keys, args.curve_worker_keys)
