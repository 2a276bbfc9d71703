"""``inspect``, ``new-model`` and ``convert``: the commands about weight files."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from .. import burnpack, models
from ..linux import procfs
from ..units import format_size, parse_size
from . import render
from .arguments import add_model, add_source_and_destination, model_size
from .failures import CommandError, reported
from .parser import Subcommands, add_command

NEW_MODEL_SIZE = "256MiB"


def add_inspect(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_inspect)
    parser.add_argument("file", help="the .bpk file")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def cmd_inspect(args: argparse.Namespace) -> int:
    """validate a Burnpack file and list its tensors

    Validate a Burnpack file and print its tensors (name, dtype, shape, bytes, absolute offset,
    256-byte alignment), metadata, scalars, layout and recognised model. Exit 0 when the file is
    valid, 1 with a one-line reason when it is not.
    """
    with reported(burnpack.BurnpackError):
        pack = burnpack.read(args.file)
    model = pack.metadata.get(models.MODEL_KEY) or models.recognise(pack.tensors)
    if args.json:
        print(json.dumps(render.inspect_document(pack, model), indent=2))
    else:
        render.print_inspect_table(pack, model)
    return 0


def add_new_model(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_new_model)
    parser.add_argument("out", help="the .bpk file to write (replaced if it exists)")
    parser.add_argument("--size", type=model_size, default=parse_size(NEW_MODEL_SIZE),
                        help=f"approximate file size, e.g. 1MiB, 512MiB, 2GiB (default: {NEW_MODEL_SIZE})")
    parser.add_argument("--width", type=int, help="hidden width (default: chosen from the size)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")


def cmd_new_model(args: argparse.Namespace) -> int:
    """write a deterministic mlp model of a given size

    Write an 'mlp' Burnpack model of about --size bytes with deterministic weights, one layer at a
    time and atomically (the file appears only when complete).
    """
    def progress(done: int, total: int) -> None:  # on a terminal only: logs stay clean
        print(f"\rwriting {args.out}: layer {done} of {total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    with reported(ValueError, saying=lambda exc: f"{args.out}: {exc}"), reported(burnpack.BurnpackError):
        summary = models.generate_mlp(args.out, args.size, width=args.width, seed=args.seed,
                                      progress=progress if sys.stderr.isatty() else None)
    dims = summary.dims
    widths = " -> ".join(map(str, dims)) if len(dims) <= 6 else \
        f"{dims[0]} -> {len(dims) - 3} x {dims[1]} -> {dims[-2]} -> {dims[-1]}"
    print(f"workerpool: wrote {args.out}: mlp {widths} ({summary.layers} layers, {summary.activation}), "
          f"{format_size(summary.size_bytes)}")
    return 0


def add_convert(sub: Subcommands) -> None:
    parser = add_command(sub, cmd_convert)
    add_source_and_destination(parser, ("SRC", ("a .safetensors file, an .npz archive, an .onnx model "
                                                 "or a model folder (safetensors or ONNX)")),
                               "the Burnpack file to write (an existing one only with --force; written atomically)")
    add_model(parser, "record this model in the metadata (default: 'onnx' for an ONNX model, 'bert' for a BERT model folder, "
              "else none)")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                        help="add a metadata pair (repeatable)")
    parser.add_argument("--include", action="append", default=[], metavar="GLOB",
                        help="only tensors whose name matches (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="leave out tensors whose name matches (repeatable)")
    parser.add_argument("--force", action="store_true",
                        help="replace DEST.bpk if it exists (never one a running server maps: give a server "
                             "new weights with 'workerpool publish')")


def cmd_convert(args: argparse.Namespace) -> int:
    """convert .safetensors, .npz, .onnx or a Hugging Face model folder to a .bpk

    Write the tensors of SRC (a .safetensors file, an .npz archive read without pickle, an .onnx
    model with any external data beside it, or a model folder: safetensors with config.json, or
    ONNX with model.onnx or onnx/model.onnx; a folder's config.json, tokenizer.json and
    sentence-transformers pooling travel in the metadata) to DEST.bpk, names, dtypes and shapes
    unchanged, one tensor at a time. An ONNX model's graph, without its weights, is one more
    tensor, and the file names the 'onnx' model.
    """
    from ..weights.convert import convert
    from ..weights.sources import ConvertError

    _check_destination(args.destination, force=args.force)
    metadata = {}
    for pair in args.metadata:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise CommandError(f"--metadata {pair!r}: expected KEY=VALUE", exit_code=2)
        metadata[key] = value
    with reported(ConvertError):
        done = convert(args.source, args.destination, model=args.model, metadata=metadata,
                       include=args.include, exclude=args.exclude)
    model = f", model {done.model}" if done.model else ""
    print(f"workerpool: wrote {args.destination}: {done.tensors} tensors, "
          f"{format_size(done.nbytes)}{model}")
    if done.model:
        from ..weights.reload import WeightsRefused, validate_new

        # As serve takes new weights: a model that needs what it prepares (an ONNX model that
        # builds only on its prepacked copy) prepares it, here in a throwaway folder.
        with tempfile.TemporaryDirectory(prefix="workerpool-check-") as cache:
            try:
                validate_new(args.destination, None, cache)
            except WeightsRefused as exc:
                print(f"workerpool: warning: serve would refuse it: {exc}", file=sys.stderr)
    return 0


def _check_destination(destination: str, *, force: bool) -> None:
    """Refuse to replace a file unasked, and ever a file a server maps: a served file changes
    by ``publish``, which checks the new weights against the old first."""
    if not os.path.lexists(destination):
        return
    publish = (f"to give a running server new weights, convert to another file and run "
               f"'workerpool publish NEW.bpk {destination}'")
    if not force:
        raise CommandError(f"{destination} exists: give --force to replace it, or another name ({publish})",
                           exit_code=2)
    serving = procfs.processes_mapping(destination)
    if serving:
        raise CommandError(f"{destination} is mapped by process{'es' if len(serving) > 1 else ''} "
                           f"{', '.join(map(str, serving[:5]))}: a server serves it, so it is not replaced; "
                           f"{publish}", exit_code=2)
