"""A command's parser: usage errors in one line, its help texts, the function that runs it."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeAlias

from ..config.sources import closest

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, as every other error, with where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: Any = None) -> argparse.Namespace:
        """argparse's, but an unknown option is named alone, with the closest the command has,
        by the command's parser: the arguments after it (``--workrs 2 model.bpk`` leaves
        ``model.bpk`` over) are not the mistake."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras and isinstance(getattr(parsed, "models", None), list) \
                and not any(extra.startswith("-") for extra in extras):
            parsed.models += extras  # ``serve a.bpk --workers 2 b.bpk``: the models among the options
            return parsed
        if not extras:
            return parsed
        command: Parser = getattr(parsed, "command_parser", self)
        unknown = [extra.partition("=")[0] for extra in extras if extra.startswith("-")]
        if not unknown:
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        options = [option for action in command._actions for option in action.option_strings]
        command.error(f"unknown option {unknown[0]}{closest(unknown[0], options)}")


def add_command(sub: Subcommands, handler: Handler) -> Parser:
    """The subcommand ``handler`` runs, named after it (``cmd_new_model`` is ``new-model``), its
    help texts from its docstring: the first paragraph is its line in ``workerpool --help``, the
    rest heads its own ``--help``, so that a command's words stand beside its code."""
    parser = add_group(sub, command_name(handler), inspect.getdoc(handler) or "")
    parser.set_defaults(handler=handler, command_parser=parser)
    return parser


def command_name(handler: Handler) -> str:
    """The command ``handler`` runs: ``cmd_new_model`` runs ``new-model``."""
    return handler.__name__.removeprefix("cmd_").replace("_", "-")


def add_group(sub: Subcommands, name: str, texts: str) -> Parser:
    """A subcommand with its help ``texts`` (a summary, a blank line, a description), for a
    command that only groups others or one that :func:`add_command` wires to its handler."""
    summary, _, description = texts.partition("\n\n")
    return sub.add_parser(name, help=summary, description=description)
