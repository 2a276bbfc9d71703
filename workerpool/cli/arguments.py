"""The options several commands share, made from the settings table or declared here once,
and the argument types only the command line uses."""

from __future__ import annotations

import argparse

from .. import models, security
from ..config import settings, values
from ..config.models import per_model
from ..units import format_size, parse_size
from .failures import CommandError

CONTROL_HELP = "the server's control endpoint (default: as serve's default)"
SMALLEST_MODEL = "16KiB"  # below it new-model could not come near the size asked for


def add_settings(parser: argparse.ArgumentParser, command: str) -> None:
    """The options of :data:`~workerpool.config.settings.SETTINGS` that ``command`` takes.

    Defaults found at run time (the CPUs, the memory) are found now; a help text's
    ``{builtin_models}`` names the built-in models, its ``{default_size}`` the default as a size.
    """
    for setting in settings.of_command(command):
        default = setting.initial()
        facts = {"builtin_models": ", ".join(models.BUILTIN_MODELS), "default": default}
        if isinstance(default, int) and not isinstance(default, bool):
            facts["default_size"] = format_size(default)
        text = setting.help_for(command).format_map(facts)
        if setting.positional:
            parser.add_argument(setting.name, metavar=setting.metavar, help=text, nargs="*")
        elif setting.switch:
            parser.add_argument(setting.flag, action="store_true", help=text)
        elif setting.per_model:  # every NAME=VALUE and VALUE given, read by config.models
            parser.add_argument(setting.flag, dest=setting.name, type=per_model(setting.parse or str),
                                action="append", default=[], metavar=setting.metavar, help=text)
        else:
            parser.add_argument(setting.flag, dest=setting.name, type=setting.parse or str,
                                default=default, metavar=setting.metavar, choices=setting.choices,
                                help=text)


def client_keys(args: argparse.Namespace) -> security.ClientKeys | None:
    """The CURVE keys of a command that connects (``workers``, ``infer``, ``embed``)."""
    unpaired = values.unpaired(("--curve-key", args.curve_key),
                               ("--curve-server-key", args.curve_server_key))
    if unpaired:
        raise CommandError(unpaired, exit_code=2)
    if not args.curve_key:
        return None
    return security.ClientKeys(args.curve_key, args.curve_server_key)


def add_control(parser: argparse.ArgumentParser, text: str = CONTROL_HELP) -> None:
    parser.add_argument("--control", metavar="ENDPOINT", type=values.control_endpoint, help=text)


def add_model(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--model", metavar=settings.MODEL_METAVAR, help=text)


def add_timeout(parser: argparse.ArgumentParser, seconds: float, what: str = "seconds to wait") -> None:
    parser.add_argument("--timeout", type=values.positive_seconds, default=seconds,
                        help=f"{what} (default: {seconds:g})")


def model_size(text: str) -> int:
    """``new-model``'s ``--size``: a size it can come near."""
    size = values.size(text)
    if size < parse_size(SMALLEST_MODEL):
        raise argparse.ArgumentTypeError(f"{text} is too small: give {SMALLEST_MODEL} or more")
    return size


def add_source_and_destination(parser: argparse.ArgumentParser, source: tuple[str, str],
                               destination_help: str) -> None:
    """The two files of a command that writes one from the other: ``source`` is its metavar and
    help; the destination is always a ``DEST.bpk``."""
    metavar, source_help = source
    parser.add_argument("source", metavar=metavar, help=source_help)
    parser.add_argument("destination", metavar="DEST.bpk", help=destination_help)
