"""A command's parser: usage errors in one line, its help texts, the function that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn, TypeAlias

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, as every other error, with where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def add_command(sub: Subcommands, name: str, handler: Handler | None, *, summary: str,
                description: str) -> Parser:
    """A subcommand with its ``summary`` (in ``workerpool --help``) and ``description`` (atop its
    own ``--help``), wired to the function that runs it (a command that only groups others has
    none)."""
    parser = sub.add_parser(name, help=summary, description=description)
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser
