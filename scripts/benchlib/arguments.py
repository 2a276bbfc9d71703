"""The command-line pieces the scripts share: counts, levels of requests in flight, model
sizes, where the raw figures go, and the options every pool-driving benchmark takes."""

from __future__ import annotations

import argparse
from typing import Any

from workerpool.units import parse_size


def parser_for(doc: str | None, **more: Any) -> argparse.ArgumentParser:
    """A script's parser, described by the first paragraph of its docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0], **more)


def at_least_one(text: str) -> int:
    """A count on a benchmark's command line: a run of nothing measures nothing."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 1")
    return value


def levels(text: str) -> list[int]:
    """Requests in flight, comma-separated: ``1,16,64``."""
    return [at_least_one(k) for k in text.split(",")]


def add_count(parser: argparse.ArgumentParser, flag: str, default: int, text: str) -> None:
    """An option that counts something, at least 1; its help ends with its default."""
    parser.add_argument(flag, type=at_least_one, default=default, help=f"{text} (default: {default})")


def add_levels(parser: argparse.ArgumentParser, flag: str, default: str, text: str = "requests in flight",
               **more: Any) -> None:
    """Comma-separated counts (``1,16,64``), each run in turn; its help ends with its default."""
    parser.add_argument(flag, type=levels, default=default, help=f"comma-separated {text} (default: {default})",
                        **more)


def add_size(parser: argparse.ArgumentParser, flag: str, default: str, text: str) -> None:
    """A size in bytes, written as ``16MiB``; its help ends with its default."""
    parser.add_argument(flag, type=parse_size, default=parse_size(default), help=f"{text} (default: {default})")


def add_mlp_pool(parser: argparse.ArgumentParser, size: str, workers: int, workers_text: str) -> None:
    """``--size`` of the generated mlp a benchmark serves and ``--workers`` of each pool."""
    add_size(parser, "--size", size, "mlp model size")
    add_count(parser, "--workers", workers, workers_text)


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="write the raw figures here")


def rounds_arguments(doc: str | None, *, rounds: int, seconds: float, baseline: bool = False) -> argparse.Namespace:
    """The command line of a benchmark that alternates servers over ``--rounds``, ``--seconds``
    per figure; ``baseline``: it can also serve another workerpool tree (``--baseline TREE``)."""
    parser = parser_for(doc)
    add_count(parser, "--rounds", rounds, "alternating rounds")
    parser.add_argument("--seconds", type=float, default=seconds, help=f"per figure (default: {seconds:g})")
    if baseline:
        parser.add_argument("--baseline", metavar="TREE", help="another workerpool checkout (a git worktree of "
                            "an earlier commit, say), served beside this one in every round")
    return parser.parse_args()


def load_arguments(doc: str | None, *, workers: int, in_flight: str, seconds: float, repeat: int,
                   **more: tuple[type, Any, str]) -> argparse.Namespace:
    """The command line of a benchmark that drives a pool: the options they all share, and
    ``more`` of its own, each ``name=(type, default, help)``; ``args.in_flight`` is the list of
    levels."""
    parser = parser_for(doc)
    add_count(parser, "--workers", workers, "workers")
    add_levels(parser, "--in-flight", in_flight)
    parser.add_argument("--seconds", type=float, default=seconds, help=f"per figure and run (default: {seconds:g})")
    add_count(parser, "--repeat", repeat, "alternating rounds")
    for name, (kind, default, text) in more.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default, help=text)
    return parser.parse_args()
