"""The ``workerpool`` command line: one subcommand per job, errors as one line, no tracebacks."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from . import burnpack, models
from .units import format_size, parse_size


class CommandError(Exception):
    """A failure the user can act on; printed as ``workerpool: error: <message>``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def cmd_inspect(args: argparse.Namespace) -> int:
    pack = _read(args.file)
    model = models.recognise(pack.tensors)
    if args.json:
        print(json.dumps(_inspect_json(pack, model), indent=2))
    else:
        _print_inspect_table(pack, model)
    return 0


def _read(path: str) -> burnpack.Burnpack:
    try:
        return burnpack.read(path)
    except burnpack.BurnpackError as exc:
        raise CommandError(str(exc)) from exc


def _inspect_json(pack: burnpack.Burnpack, model: str | None) -> dict:
    return {
        "path": pack.path,
        "version": pack.version,
        "layout": pack.layout,
        "metadata": dict(pack.metadata),
        "scalars": dict(pack.scalars),
        "model": model,
        "total_bytes": pack.total_bytes,
        "tensors": [
            {
                "name": info.name,
                "dtype": info.dtype.name,
                "shape": list(info.shape),
                "offset": info.offset,
                "nbytes": info.nbytes,
            }
            for info in pack.infos.values()
        ],
    }


def _print_inspect_table(pack: burnpack.Burnpack, model: str | None) -> None:
    rows = [("name", "dtype", "shape", "bytes", "offset", "aligned")]
    for info in pack.infos.values():
        shape = "[" + ", ".join(str(d) for d in info.shape) + "]"
        rows.append(
            (info.name, info.dtype.name, shape, str(info.nbytes), str(info.offset), "yes" if info.aligned else "no")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {3, 4}
    print(f"{pack.path}: Burnpack version {pack.version}, {pack.layout} layout, {len(pack.infos)} tensors")
    for row in rows:
        cells = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        print("  " + "  ".join(cells).rstrip())
    print(f"total: {pack.total_bytes} bytes ({format_size(pack.total_bytes)}) of tensor data")
    print("metadata:" + ("" if pack.metadata else " (none)"))
    for key, value in pack.metadata.items():
        print(f"  {key} = {value}")
    print("scalars:" + ("" if pack.scalars else " (none)"))
    for key, value in pack.scalars.items():
        print(f"  {key} = {value!r}")
    print(f"model: {model or '(not recognised as a built-in model)'}")


def cmd_new_model(args: argparse.Namespace) -> int:
    try:
        summary = models.generate_mlp(args.out, args.size, width=args.width, seed=args.seed)
    except burnpack.BurnpackError as exc:
        raise CommandError(str(exc)) from exc
    except ValueError as exc:
        raise CommandError(f"{args.out}: {exc}") from exc
    print(f"workerpool: wrote {args.out}: {summary}")
    return 0


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workerpool",
        description="Serve a numpy model from many worker processes that share one "
        "memory-mapped copy of its Burnpack (.bpk) weights.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = sub.add_parser(
        "inspect",
        help="validate a Burnpack file and list its tensors",
        description="Validate a Burnpack file and print its tensors (name, dtype, shape, bytes, "
        "absolute offset, 256-byte alignment), metadata, scalars, layout and recognised model. "
        "Exit 0 when the file is valid, 1 with a one-line reason when it is not.",
    )
    inspect.add_argument("file", help="the .bpk file")
    inspect.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    inspect.set_defaults(handler=cmd_inspect)

    new_model = sub.add_parser(
        "new-model",
        help="write a deterministic mlp model of a given size",
        description="Write an 'mlp' Burnpack model of about --size bytes with deterministic "
        "weights, one layer at a time and atomically (the file appears only when complete).",
    )
    new_model.add_argument("out", help="the .bpk file to write (replaced if it exists)")
    new_model.add_argument("--size", type=_size, default=parse_size("256MiB"),
                           help="approximate file size, e.g. 1MiB, 512MiB, 2GiB (default: 256MiB)")
    new_model.add_argument("--width", type=int, default=None,
                           help="hidden width (default: chosen from the size)")
    new_model.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    new_model.set_defaults(handler=cmd_new_model)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except CommandError as exc:
        print(f"workerpool: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
