"""The ``workerpool`` command line: one subcommand per job, errors as one line, no tracebacks.

Each group of commands registers its own options, help texts and handler (:mod:`.models`,
:mod:`.serve`, :mod:`.control`, :mod:`.request`, :mod:`.keys`); this module puts them together
and runs one.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from . import control, keys, models, request, serve
from .failures import CommandError
from .parser import Handler, Parser

DISTRIBUTION = "workerpool-mmap"  # the name pip knows this package by ("workerpool" is another one)


class _ShowVersion(argparse.Action):
    """``--version``: this package's version from its installed metadata, looked up only when
    asked (reading the metadata would add some 20 ms to every command)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version(DISTRIBUTION)
        except PackageNotFoundError:
            found = "(not installed)"
        print(f"{parser.prog} {found}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="workerpool",
        description="Serve a numpy model from many worker processes that share one "
        "memory-mapped copy of its Burnpack (.bpk) weights.",
    )
    parser.add_argument("--version", action=_ShowVersion)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_command in (models.add_inspect, models.add_new_model, models.add_convert, serve.add_serve,
                        control.add_reload, control.add_publish, control.add_status, control.add_models,
                        request.add_infer, request.add_embed, serve.add_workers, keys.add_keys):
        add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:  # `workerpool` alone: what it can do
            parser.print_help()
            return 2
        handler: Handler = args.handler
        if hasattr(args, "print_config"):  # serve and workers: a file and the environment too
            args = serve.with_sources(parser, argv, args)
            if args.print_config:
                print(serve.effective_config(args))
                return 0
        else:  # a pool's loop takes Ctrl-C itself; any other command gets it here (command.py)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one held back raises now
        return handler(args)
    except CommandError as exc:
        print(f"workerpool: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except RuntimeError as exc:  # Ctrl-C while a dataclass is built: Python 3.11 wraps it so
        if isinstance(exc.__cause__, KeyboardInterrupt):
            return 130
        raise
    except BrokenPipeError:  # e.g. piped into head: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
