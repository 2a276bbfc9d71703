"""The ``workerpool`` command line: one subcommand per job, errors as one line, no tracebacks."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, NoReturn, TypeAlias, TypeVar, cast

import zmq

from .. import burnpack, endpoints, models, runtime, security
from ..client import reach
from ..config import sources as config_sources
from ..config.pool import (
    DEFAULT_BIND,
    DEFAULT_LOAD,
    DEFAULT_LOG_LEVEL,
    DEFAULT_START,
    GRACEFUL_TIMEOUT_SECONDS,
    LOAD_MODES,
    MAX_BATCH,
    MAX_CONNECTIONS,
    MAX_QUEUE,
    RELOAD_TIMEOUT_SECONDS,
    REQUEST_TIMEOUT_SECONDS,
    START_METHODS,
    WATCH_INTERVAL_SECONDS,
    HostConfig,
    PoolConfig,
    ServeConfig,
    default_max_queue_bytes,
)
from ..control import client as control
from ..control.status import Status, unready
from ..logs import FORMATS, LEVELS, setup_logging
from ..ops import metrics
from ..pool import run as pool
from ..units import MS_PER_SECOND, format_size, parse_size
from ..weights import npy

if TYPE_CHECKING:
    from ..client.sync import Outputs

Handler: TypeAlias = Callable[[argparse.Namespace], int]
Subcommands: TypeAlias = "argparse._SubParsersAction[_Parser]"
Config = TypeVar("Config", bound=PoolConfig)


class CommandError(Exception):
    """A failure the user can act on; printed as ``workerpool: error: <message>``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def cmd_inspect(args: argparse.Namespace) -> int:
    pack = _read(args.file)
    model = pack.metadata.get(models.MODEL_KEY) or models.recognise(pack.tensors)
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
    _print_pairs("metadata", pack.metadata, _shortened)
    _print_pairs("scalars", pack.scalars, repr)
    named = f" (named by metadata {models.MODEL_KEY})" if models.MODEL_KEY in pack.metadata else ""
    print(f"model: {model + named if model else '(not recognised as a built-in model)'}")


_SHOWN_TEXT = 100  # characters of a metadata value the table shows; --json has them all


def _shortened(value: object) -> str:
    """A long value (a config.json, a tokenizer.json) on one line: its start and its size."""
    text = " ".join(str(value).split())
    if len(text) <= _SHOWN_TEXT:
        return text
    return f"{text[:_SHOWN_TEXT]}... ({format_size(len(str(value).encode()))})"


def _print_pairs(title: str, pairs: Mapping[str, object], show: Callable[[object], str]) -> None:
    """One ``key = value`` line per entry, or ``(none)``, so an empty section is visibly empty."""
    print(f"{title}:" + ("" if pairs else " (none)"))
    for key, value in pairs.items():
        print(f"  {key} = {show(value)}")


def cmd_new_model(args: argparse.Namespace) -> int:
    def progress(done: int, total: int) -> None:  # on a terminal only: logs stay clean
        print(f"\rwriting {args.out}: layer {done} of {total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    try:
        summary = models.generate_mlp(args.out, args.size, width=args.width, seed=args.seed,
                                      progress=progress if sys.stderr.isatty() else None)
    except burnpack.BurnpackError as exc:
        raise CommandError(str(exc)) from exc
    except ValueError as exc:
        raise CommandError(f"{args.out}: {exc}") from exc
    dims = summary.dims
    widths = " -> ".join(map(str, dims)) if len(dims) <= 6 else \
        f"{dims[0]} -> {len(dims) - 3} x {dims[1]} -> {dims[-2]} -> {dims[-1]}"
    print(f"workerpool: wrote {args.out}: mlp {widths} ({summary.layers} layers, {summary.activation}), "
          f"{format_size(summary.size_bytes)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.workers == 0 and not args.backend:
        raise CommandError("--workers 0 serves nothing unless worker hosts can join: give --backend",
                           exit_code=2)
    return _run_pool(pool.serve, _pool_config(ServeConfig, args, server_keys=_server_keys(args)))


def cmd_workers(args: argparse.Namespace) -> int:
    if not args.connect:
        raise CommandError("workers needs --connect ENDPOINT (or connect in --config, or "
                           "WORKERPOOL_CONNECT)", exit_code=2)
    return _run_pool(pool.run_host, _pool_config(HostConfig, args, keys=_client_keys(args)))


def _pool_config(kind: type[Config], args: argparse.Namespace, **derived: Any) -> Config:
    """A config from the options named like its fields, so each setting is named once (by its
    option), plus the settings ``derived`` from several options."""
    options = {f.name: getattr(args, f.name) for f in fields(kind) if hasattr(args, f.name)}
    options["watch_interval"] = None if args.no_watch else args.watch_interval
    return kind(**options | derived)


def _with_sources(parser: argparse.ArgumentParser, argv: list[str],
                  args: argparse.Namespace) -> argparse.Namespace:
    """``args`` again with the settings of ``--config`` and ``WORKERPOOL_*`` placed before the
    command line's, which therefore wins."""
    try:
        extra = config_sources.arguments(args.command_parser, args.config, os.environ)
    except config_sources.SourceError as exc:
        raise CommandError(str(exc), exit_code=2) from exc
    return parser.parse_args(config_sources.command_line(argv, extra)) if extra else args


def _run_pool(run: Callable[[Config], int], config: Config) -> int:
    """Run a pool until it stops; one that cannot start exits 2, like a usage error."""
    setup_logging(config.log_level, config.log_format)
    try:
        return run(config)
    except pool.StartupError as exc:
        raise CommandError(str(exc), exit_code=2) from exc


def _server_keys(args: argparse.Namespace) -> security.ServerKeys | None:
    if bool(args.curve_secret_key) != bool(args.curve_client_keys):
        raise CommandError("--curve-server-key and --curve-client-keys go together",
                           exit_code=2)
    if args.curve_worker_keys and not args.curve_secret_key:
        raise CommandError("--curve-worker-keys needs --curve-secret-key and --curve-client-keys",
                           exit_code=2)
    if not args.curve_secret_key:
        return None
    return security.ServerKeys(args.curve_secret_key, args.curve_client_keys, args.curve_worker_keys)


def _client_keys(args: argparse.Namespace) -> security.ClientKeys | None:
    if bool(args.curve_key) != bool(args.curve_server_key):
        raise CommandError("--curve-key and --curve-server-key go together", exit_code=2)
    if not args.curve_key:
        return None
    return security.ClientKeys(args.curve_key, args.curve_server_key)


def cmd_keys(args: argparse.Namespace) -> int:
    try:
        public, secret = security.generate(args.directory, args.name)
    except OSError as exc:
        raise CommandError(f"{args.directory}: cannot write keys: {exc.strerror or exc}") from exc
    print(f"workerpool: wrote {public} (public: give it to the other side) and {secret} "
          "(secret: keep it here, mode 0600)")
    return 0


def _control_endpoint(args: argparse.Namespace) -> str:
    try:
        if args.control:
            return str(args.control)
        if os.environ.get("WORKERPOOL_CONTROL"):
            return _control(os.environ["WORKERPOOL_CONTROL"])
        return runtime.default_control_endpoint()
    except argparse.ArgumentTypeError as exc:
        raise CommandError(f"WORKERPOOL_CONTROL={exc}", exit_code=2) from None
    except OSError as exc:
        raise CommandError(f"cannot use the runtime directory: {exc}") from exc


def cmd_status(args: argparse.Namespace) -> int:
    endpoint = _control_endpoint(args)
    try:
        status = control.call(endpoint, "status", timeout=args.timeout, memory=not args.ready)
    except control.ControlError as exc:
        raise CommandError(str(exc)) from exc
    if args.ready:
        reason = unready(cast(Status, status))
        print(f"workerpool: not ready: {reason}" if reason else "workerpool: ready",
              file=sys.stderr if reason else sys.stdout)
        return 1 if reason else 0
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    _print_status(status, _output_width(), explain=args.explain)
    return 0


def _output_width() -> int:
    """The terminal's width (or ``COLUMNS``); no limit when stdout is a file or a pipe, whose
    reader gets every column."""
    import shutil

    return shutil.get_terminal_size((sys.maxsize, 0)).columns


def _print_status(status: dict[str, Any], width: int, *, explain: bool = False) -> None:
    """The status in ``width`` columns: its lines wrapped, the table's least important columns
    left out (``--json`` has them all)."""
    model, queue = status["model"], status["queue"]
    say = functools.partial(_print_wrapped, width=width)
    say(f"supervisor {status['supervisor_pid']} serving on {status['endpoint']}")
    say(f"model {model['name']}: {model['path']} ({format_size(model['size'])}, inode {model['inode']}, "
        f"generation {model['generation']}, {model['load']})")
    threads = status["threads_per_worker"]
    say(f"queue: {queue['depth']} waiting (max {queue['max']}), {queue['in_flight']} in flight; "
        f"{threads} BLAS thread{'' if threads == 1 else 's'} per worker")
    _print_batches(status["workers"], say)
    host = os.uname().nodename
    helpers = [("supervisor", status["supervisor_pid"], status.get("supervisor_memory"))]
    template = status.get("template")
    if template is not None:
        helpers.append(("template", template["pid"], template["memory"]))
    rows = [_process_row(pid, role, host, "restarting" if pid is None else "-", ("-",) * 5, memory)
            for role, pid, memory in helpers]
    for worker in status["workers"]:
        counts = (worker["generation"], worker["served"], worker["errors"], worker["batches"], worker["rows"])
        rows.append(_process_row(worker["pid"], "worker", worker["host"], worker["state"], counts,
                                 worker.get("memory")))
    shown = _print_table(rows, width)
    totals = status["totals"]
    model_size = "-" if totals["model_size"] is None else format_size(totals["model_size"])
    processes = "supervisor, template and" if template and template["pid"] else "supervisor and"
    say(f"total PSS of the {processes} {totals['workers']} workers: {format_size(totals['pss'])} "
        f"(workers alone {format_size(totals['workers_pss'])}; model file {model_size})")
    if explain:
        for key, column in _MEMORY_COLUMNS.items():
            if column in shown:
                say(f"  {column:<8} {metrics.MEMORY_FIELDS[key]}", indent=11)
        say(f"  {'total':<8} {metrics.TOTAL_FIELDS['pss']}", indent=11)


def _print_wrapped(text: str, width: int, indent: int = 2) -> None:
    """``text`` in lines of at most ``width`` characters where it has spaces to break at."""
    import textwrap

    print(textwrap.fill(text, width, subsequent_indent=" " * indent, break_long_words=False,
                        break_on_hyphens=False))


def _print_batches(workers: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    """The pool's batch sizes, e.g. ``batches: 310 carrying 4,960 rows; by rows 1: 10, 3-4: 20``."""
    sizes: dict[int, int] = {}
    for worker in workers:
        for size, count in worker["batch_sizes"].items():
            sizes[int(size)] = sizes.get(int(size), 0) + count
    batches, rows = sum(sizes.values()), sum(w["rows"] for w in workers)
    if not batches:
        return
    buckets = ", ".join(f"{size // 2 + 1 if size > 2 else size}"
                        f"{f'-{size}' if size > 2 else ''}: {count:,}" for size, count in sorted(sizes.items()))
    say(f"batches: {batches:,} carrying {rows:,} rows; batches by rows {buckets}")


def _process_row(pid: int | None, role: str, host: str, state: str, counts: tuple[Any, ...],
                 memory: dict[str, int] | None) -> dict[str, str]:
    """One process's cells of the status table, by column title."""
    generation, served, errors, batches, rows = counts
    cells = {"pid": str(pid or "-"), "role": role, "host": host[:16], "state": state,
             "gen": str(generation), "served": str(served), "errors": str(errors),
             "batches": str(batches), "rows": str(rows)}
    for key, column in _MEMORY_COLUMNS.items():
        cells[column] = format_size(memory[key]) if memory and key in memory else "-"
    return cells


def _print_table(rows: list[dict[str, str]], width: int) -> list[str]:
    """The rows under their titles in the columns that fit in ``width``, the least important left
    out first (never the essential ones); the titles of the columns shown."""
    widths = {title: max([least, *(len(row[title]) for row in rows)])
              for title, least in _STATUS_COLUMNS.items()}
    kept = list(_STATUS_IMPORTANCE)
    while len(kept) > _ESSENTIAL_COLUMNS and sum(widths[title] + 1 for title in kept) - 1 > width:
        kept.pop()
    shown = [title for title in _STATUS_COLUMNS if title in kept]
    for row in [{title: title for title in shown}, *rows]:
        cells = (row[t].ljust(widths[t]) if t in _LEFT_ALIGNED else row[t].rjust(widths[t]) for t in shown)
        print(" ".join(cells).rstrip())
    return shown


_MEMORY_COLUMNS = {"rss": "rss", "uss": "uss", "pss": "pss", "shared": "shared", "anon": "anon",
                   "pte": "pte", "weights_resident": "weights"}
"""The memory figures ``status`` shows, by key, with their column titles; ``--json`` has all."""
_STATUS_COLUMNS = {"pid": 8, "role": 10, "host": 16, "state": 10, "gen": 4, "served": 8, "errors": 6,
                   "batches": 8, "rows": 8, **dict.fromkeys(_MEMORY_COLUMNS.values(), 10)}
"""The status table's columns, in order, with their least widths."""
_LEFT_ALIGNED = {"role", "host", "state"}
_STATUS_IMPORTANCE = ("pid", "role", "state", "served", "pss", "errors", "rss", "gen", "host", "uss",
                      "shared", "batches", "rows", "anon", "weights", "pte")
"""The columns, most important first: a narrow terminal loses them from the end."""
_ESSENTIAL_COLUMNS = 5  # pid, role, state, served and pss: shown however narrow the terminal


def cmd_reload(args: argparse.Namespace) -> int:
    endpoint = _control_endpoint(args)
    try:
        answer = control.call(endpoint, "reload", timeout=args.timeout)
    except control.ControlError as exc:
        raise CommandError(f"reload failed: {exc}") from exc
    if answer["result"] == "unchanged":
        print(f"workerpool: weights unchanged; generation {answer['generation']} keeps serving")
    else:
        print(f"workerpool: every worker now serves generation {answer['generation']}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from ..weights.publish import PublishError, publish

    try:
        identity = publish(args.source, args.destination, control_endpoint=args.control, model=args.model)
    except PublishError as exc:
        raise CommandError(str(exc)) from exc
    print(f"workerpool: published {args.source} as {args.destination} (inode {identity.inode}, "
          f"{format_size(identity.size)})")
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    if args.output:
        _check_writable(args.output)
    result = _request(args, _load_input(args.input))
    if args.output:
        _save(args.output, result.outputs)
        print(f"workerpool: wrote {args.output} (worker {result.worker_pid}, generation {result.generation})")
    else:
        print(result.outputs)
    return 0


READ_CHUNK = 1 << 20  # bytes read at a time from an .npy input


def _load_input(path: str) -> Any:
    """An .npy file's array, or an .npz archive's arrays by name (named inputs); never a pickle.
    The file is opened once and read front to back, so a pipe works too."""
    import zipfile

    import numpy as np

    try:
        with open(path, "rb") as f:
            start = f.peek(len(np.lib.format.MAGIC_PREFIX))[:len(np.lib.format.MAGIC_PREFIX)]
            if start == np.lib.format.MAGIC_PREFIX:
                return _read_npy(f, path)
            if start.startswith(b"PK\x03\x04"):  # a zip archive's first local file header
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise CommandError(f"{path}: an .npz archive is read from a file, not a pipe")
                with np.load(f, allow_pickle=False) as archive:
                    inputs = {name: archive[name] for name in archive.files}
                if not all(isinstance(x, np.ndarray) for x in inputs.values()):
                    raise CommandError(f"{path}: a zip archive but not an .npz of arrays")
                return inputs
    except OSError as exc:
        raise CommandError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    except (ValueError, EOFError, MemoryError, zipfile.BadZipFile) as exc:
        raise CommandError(f"{path}: cannot load it: {exc or type(exc).__name__}") from exc
    raise CommandError(f"{path}: not a .npy file (np.save writes one) nor an .npz archive")


def _read_npy(f: BinaryIO, path: str) -> Any:
    """The array, its data taken as it comes and never more than the header declares, so a
    header that claims more than the file holds allocates nothing (a pipe works too)."""
    import numpy as np

    header = npy.read_header(f)
    if header.dtype.hasobject:
        raise CommandError(f"{path}: holds Python objects, which are never unpickled")
    data = bytearray()
    while len(data) < header.nbytes and (chunk := f.read(min(header.nbytes - len(data), READ_CHUNK))):
        data += chunk
    if len(data) < header.nbytes:
        raise CommandError(f"{path}: its header declares {header.nbytes} bytes of data, the file "
                           f"holds {len(data)}")
    return np.frombuffer(data, header.dtype).reshape(header.shape,
                                                     order="F" if header.fortran_order else "C")


def _check_writable(path: str) -> None:
    """Refuse an output path that cannot be written before a request is sent for it."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CommandError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CommandError(f"{path}: not writable")


def cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    if args.output:
        _check_writable(args.output)
    outputs = _request(args, list(args.texts)).outputs
    embedding = outputs.get("embedding") if isinstance(outputs, dict) else None
    if not isinstance(embedding, np.ndarray):
        raise CommandError(f"{args.endpoint}: the server's model returned no 'embedding' for texts")
    if args.output:
        _save(args.output, embedding)
        print(f"workerpool: wrote {args.output} ({embedding.shape[0]} embeddings of {embedding.shape[1]})")
    else:
        for row in embedding:
            print(json.dumps([round(float(v), 7) for v in row]))
    return 0


def _request(args: argparse.Namespace, payload: Any) -> Any:
    """One request to ``args.endpoint`` with the client options; its result, or one line."""
    from ..client.sync import Client
    from ..errors import Timeout, WorkerpoolError

    keys = _client_keys(args)
    try:
        reach.check(args.endpoint, keys)
        with Client(args.endpoint, timeout=args.timeout, retries=args.retries,
                    keys=keys) as client:
            return client.request(payload)
    except reach.Unreachable as exc:
        raise CommandError(str(exc)) from None
    except Timeout as exc:
        raise CommandError(f"{exc}; the server is there (it completed a handshake) but did not "
                           "answer: it is overloaded or stuck ('workerpool status' shows its queue "
                           "and workers)") from exc
    except WorkerpoolError as exc:
        raise CommandError(f"{args.endpoint}: {type(exc).__name__}: {exc}") from exc
    except (security.KeysError, zmq.ZMQError, ValueError) as exc:
        raise CommandError(f"{args.endpoint}: {exc}") from exc


def cmd_convert(args: argparse.Namespace) -> int:
    from ..weights.convert import ConvertError, convert

    metadata = {}
    for pair in args.metadata:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise CommandError(f"--metadata {pair!r}: expected KEY=VALUE", exit_code=2)
        metadata[key] = value
    try:
        done = convert(args.source, args.destination, model=args.model, metadata=metadata,
                       include=args.include, exclude=args.exclude)
    except ConvertError as exc:
        raise CommandError(str(exc)) from exc
    model = f", model {done.model}" if done.model else ""
    print(f"workerpool: wrote {args.destination}: {done.tensors} tensors, "
          f"{format_size(done.nbytes)}{model}")
    if done.model:
        from ..weights.reload import WeightsRefused, validate

        try:
            validate(args.destination, None)
        except WeightsRefused as exc:
            print(f"workerpool: warning: serve would refuse it: {exc}", file=sys.stderr)
    return 0


def _save(path: str, outputs: Outputs) -> None:
    """Named outputs as an .npz, one unnamed output (or none) as an .npy, at exactly ``path``:
    given a name, numpy would add its own extension to one without it."""
    import numpy as np

    try:
        with open(path, "wb") as f:
            if isinstance(outputs, dict):  # Any: numpy's stub types **kwds as allow_pickle
                np.savez(f, **cast(dict[str, Any], outputs))
            else:
                np.save(f, np.asanyarray(outputs))
    except OSError as exc:
        raise CommandError(f"{path}: cannot write it: {exc.strerror or exc}") from exc


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, as every other error, with where to read more."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="workerpool",
        description="Serve a numpy model from many worker processes that share one "
        "memory-mapped copy of its Burnpack (.bpk) weights.",
    )
    parser.add_argument("--version", action=_ShowVersion)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_command in (_add_inspect, _add_new_model, _add_convert, _add_serve, _add_reload, _add_publish,
                        _add_status, _add_infer, _add_embed, _add_workers, _add_keys):
        add_command(sub)
    return parser


class _Help(NamedTuple):
    """A subcommand's help texts."""

    summary: str  # in the list of ``workerpool --help``
    description: str | None = None  # atop the command's own ``--help``


def _command(sub: Subcommands, name: str, handler: Handler | None = None) -> _Parser:
    """A subcommand's parser with its help texts, wired to the function that runs it (a command
    that only groups others has none)."""
    summary, description = _COMMAND_HELP[name]
    parser = sub.add_parser(name, help=summary, description=description)
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


_COMMAND_HELP = {
    "inspect": _Help(
        summary="validate a Burnpack file and list its tensors",
        description="Validate a Burnpack file and print its tensors (name, dtype, shape, bytes, "
        "absolute offset, 256-byte alignment), metadata, scalars, layout and recognised model. "
        "Exit 0 when the file is valid, 1 with a one-line reason when it is not.",
    ),
    "new-model": _Help(
        summary="write a deterministic mlp model of a given size",
        description="Write an 'mlp' Burnpack model of about --size bytes with deterministic "
        "weights, one layer at a time and atomically (the file appears only when complete).",
    ),
    "serve": _Help(
        summary="serve a model from N worker processes",
        description="Serve MODEL.bpk from --workers processes that each map the file read-only, "
        "so the weights sit in memory once. Prints one 'workerpool: serving ...' line on stdout "
        "when every worker is ready; logs go to stderr. SIGTERM/SIGINT finish in-flight requests "
        "and exit 0; SIGTTIN/SIGTTOU add/remove a worker. Exit 2 when the file or model is invalid.",
    ),
    "reload": _Help(
        summary="load new weights now and wait until every worker serves them",
        description="Ask a running server to check its weight file now (as SIGHUP does) and wait "
        "until every worker serves the new generation. Exit 0 when they do or when the file is "
        "unchanged; exit 1 with the reason when the new file is refused or the switch does not "
        "complete.",
    ),
    "publish": _Help(
        summary="deploy new weights: validate, copy beside DEST, rename over it",
        description="Validate SRC (and, with --control, that the running server's model accepts "
        "it), copy it to a temporary file in DEST's directory, fsync it, rename it over DEST and "
        "fsync the directory. A server watching DEST then reloads. An invalid SRC leaves DEST "
        "untouched (exit 1).",
    ),
    "status": _Help(
        summary="show a running server's workers, queue and memory",
        description="Ask a running server for its state. Exit 1 when no server answers.",
    ),
    "infer": _Help(
        summary="send one request from a .npy file",
        description="Send the array in a .npy file to a server and print or save the output.",
    ),
    "convert": _Help(
        summary="convert .safetensors, .npz or a Hugging Face model folder to a .bpk",
        description="Write the tensors of SRC (a .safetensors file, an .npz archive read without "
        "pickle, or a model folder with config.json, whose config.json and tokenizer.json travel "
        "in the metadata) to DEST.bpk, names, dtypes and shapes unchanged, one tensor at a time.",
    ),
    "embed": _Help(
        summary="embed texts with a server's sentence-embedding model",
        description="Send the texts to a server whose model takes texts (such as 'bert' converted "
        "from a model folder with its tokenizer) and print one JSON list per text, or save them "
        "as one .npy array.",
    ),
    "workers": _Help(
        summary="run N workers on this host for a router on another host",
        description="Start N worker processes on this host that map MODEL.bpk (this host's own "
        "copy) and serve through the router of 'workerpool serve --backend tcp://...' on another "
        "host. Workers are replaced when they die, reconnect when the router restarts, and roll "
        "to new weights one at a time when MODEL.bpk is replaced by rename.",
    ),
    "keys": _Help(
        summary="generate CURVE key pairs",
        description="'workerpool keys generate DIR [--name NAME]' writes DIR/NAME.key (public) and "
        "DIR/NAME.key_secret (secret, mode 0600).",
    ),
    "generate": _Help(
        summary="write a new key pair",
        description="Write DIR/NAME.key (the public key, to hand to the other side) and "
        "DIR/NAME.key_secret (mode 0600, to keep). DIR is created if needed.",
    ),
}
"""The subcommands' help texts by name, together so that they read as one manual."""


def _add_inspect(sub: Subcommands) -> None:
    parser = _command(sub, "inspect", cmd_inspect)
    parser.add_argument("file", help="the .bpk file")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


_NEW_MODEL_SIZE = "256MiB"
_SMALLEST_MODEL = "16KiB"  # below it new-model could not come near the size asked for


def _model_size(text: str) -> int:
    size = _size(text)
    if size < parse_size(_SMALLEST_MODEL):
        raise argparse.ArgumentTypeError(f"{text} is too small: give {_SMALLEST_MODEL} or more")
    return size


def _add_new_model(sub: Subcommands) -> None:
    parser = _command(sub, "new-model", cmd_new_model)
    parser.add_argument("out", help="the .bpk file to write (replaced if it exists)")
    parser.add_argument("--size", type=_model_size, default=parse_size(_NEW_MODEL_SIZE),
                        help=f"approximate file size, e.g. 1MiB, 512MiB, 2GiB (default: {_NEW_MODEL_SIZE})")
    parser.add_argument("--width", type=int, help="hidden width (default: chosen from the size)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")


def _add_serve(sub: Subcommands) -> None:
    parser = _command(sub, "serve", cmd_serve)
    _add_pool_options(parser, "the Burnpack weight file",
                      "on SIGTERM, seconds to finish in-flight requests")
    parser.add_argument("--bind", type=_bind_endpoint, default=DEFAULT_BIND, metavar="ENDPOINT",
                        help="client endpoint (default: %(default)s, loopback only)")
    _add_control(parser, "control endpoint for status (default: an ipc socket in a private runtime "
                 "directory)")
    parser.add_argument("--max-queue", type=_positive_or_zero, default=MAX_QUEUE, metavar="N",
                        help="requests that may wait for a free worker; more are refused with "
                        "'overloaded' (default: %(default)s)")
    parser.add_argument("--max-message-size", type=_positive_size, metavar="SIZE",
                        help="largest request accepted (default: room for a batch of 4096 of the "
                        "model's inputs, at least 1MiB; 64MiB when the model declares no input shape)")
    queue_bytes = default_max_queue_bytes()
    parser.add_argument("--max-queue-bytes", type=_positive_size, default=queue_bytes, metavar="SIZE",
                        help="bytes that waiting requests may hold together; past it new ones are "
                        f"refused with 'overloaded' (default: 1GiB or 1/8 of memory, here "
                        f"{format_size(queue_bytes)})")
    parser.add_argument("--request-timeout", type=_positive_seconds, default=REQUEST_TIMEOUT_SECONDS, metavar="S",
                        help="seconds a request may run on a worker; past it the client gets "
                        "'request_timeout' and the worker is replaced. Keep it below your clients' "
                        "timeout (default: %(default)s)")
    parser.add_argument("--max-batch", type=_positive_count, default=MAX_BATCH, metavar="ROWS",
                        help="rows of the model's batch axis that queued requests may share in one "
                        "forward pass; 1 turns batching off (default: %(default)s)")
    parser.add_argument("--batch-wait", type=_milliseconds, default=0.0, metavar="MS",
                        help="milliseconds a request may wait for others to share its forward pass "
                        "when fewer than --max-batch rows are queued (default: 0, never wait)")
    parser.add_argument("--max-connections", type=_positive_count, default=MAX_CONNECTIONS, metavar="N",
                        help="client connections served at once; more are closed at once "
                        "(default: %(default)s)")
    parser.add_argument("--http", metavar="HOST:PORT",
                        help="serve /metrics (Prometheus), /healthz and /readyz over HTTP here; a "
                        "bare :PORT is loopback (default: off)")
    parser.add_argument("--backend", type=_bind_endpoint, metavar="ENDPOINT",
                        help="a TCP endpoint such as tcp://0.0.0.0:5556 where 'workerpool workers' on "
                        "other hosts join (default: none; local workers always use a private ipc socket)")
    _add_server_key_options(parser)


_RELOAD_WAIT_SECONDS = RELOAD_TIMEOUT_SECONDS + 30.0
"""``reload`` outwaits the server's own reload deadline, so a failure arrives with its reason."""


def _add_reload(sub: Subcommands) -> None:
    parser = _command(sub, "reload", cmd_reload)
    _add_control(parser)
    _add_timeout(parser, _RELOAD_WAIT_SECONDS)


def _add_publish(sub: Subcommands) -> None:
    parser = _command(sub, "publish", cmd_publish)
    parser.add_argument("source", metavar="SRC.bpk", help="the new weights, checked before anything is replaced")
    parser.add_argument("destination", metavar="DEST.bpk", help="the path the server serves")
    _add_control(parser, "also ask the server at this control endpoint to check SRC")
    _add_model(parser, "without --control, the model to check SRC against (default: as serve)")


def _add_status(sub: Subcommands) -> None:
    parser = _command(sub, "status", cmd_status)
    _add_control(parser)
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    parser.add_argument("--explain", action="store_true",
                        help="say under the table what each memory column means")
    parser.add_argument("--ready", action="store_true",
                        help="exit 0 only if a worker serves the current weights and the server is "
                        "not shutting down (an exec probe; /readyz over --http says the same)")
    _add_timeout(parser, 5.0)


def _add_infer(sub: Subcommands) -> None:
    parser = _command(sub, "infer", cmd_infer)
    parser.add_argument("--input", required=True, metavar="X.npy",
                        help="the input array (.npy, float32 for the built-in models), or named "
                        "input arrays (.npz)")
    parser.add_argument("--output", metavar="Y.npy",
                        help="write the output here (.npy; .npz for named outputs) instead of printing it")
    _add_client_options(parser)


def _add_convert(sub: Subcommands) -> None:
    parser = _command(sub, "convert", cmd_convert)
    parser.add_argument("source", metavar="SRC", help="a .safetensors file, an .npz archive or a model folder")
    parser.add_argument("destination", metavar="DEST.bpk", help="the Burnpack file to write (replaced atomically)")
    _add_model(parser, "record this model in the metadata (default: 'bert' for a BERT model folder, "
               "else none)")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE",
                        help="add a metadata pair (repeatable)")
    parser.add_argument("--include", action="append", default=[], metavar="GLOB",
                        help="only tensors whose name matches (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="leave out tensors whose name matches (repeatable)")


def _add_embed(sub: Subcommands) -> None:
    parser = _command(sub, "embed", cmd_embed)
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="the texts to embed")
    parser.add_argument("--output", metavar="E.npy", help="save the embeddings here instead of printing them")
    _add_client_options(parser)


def _add_client_options(parser: argparse.ArgumentParser) -> None:
    """Where a one-request command sends its request, how long it waits, and its keys."""
    parser.add_argument("--endpoint", type=_endpoint, default=DEFAULT_BIND, help="default: %(default)s")
    _add_timeout(parser, 30.0, "seconds per attempt")
    parser.add_argument("--retries", type=int, default=2, help="retries after a timeout (default: %(default)s)")
    _add_client_key_options(parser)


def _add_workers(sub: Subcommands) -> None:
    parser = _command(sub, "workers", cmd_workers)
    _add_pool_options(parser, "this host's copy of the weights",
                      "on SIGTERM, seconds for workers to leave the router")
    parser.add_argument("--connect", type=_endpoint, metavar="ENDPOINT",
                        help="the router's backend endpoint, e.g. tcp://router-host:5556 (required)")
    _add_client_key_options(parser)


def _add_keys(sub: Subcommands) -> None:
    keys = _command(sub, "keys")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    generate = _command(actions, "generate", cmd_keys)
    generate.add_argument("directory", metavar="DIR", help="where to write the key files")
    generate.add_argument("--name", default="workerpool", help="file name stem (default: %(default)s)")


def _add_pool_options(parser: argparse.ArgumentParser, file_help: str, graceful_help: str) -> None:
    """The options of ``serve`` and ``workers`` alike: the weights, the workers, watching, logs.

    Their destinations are the :class:`~workerpool.config.PoolConfig` field names, which is how
    :func:`_pool_config` finds them.
    """
    parser.set_defaults(command_parser=parser)
    parser.add_argument("path", metavar="MODEL.bpk", help=file_help)
    parser.add_argument("--config", metavar="FILE",
                        help="read options from this TOML file (keys are the long option names: "
                        "workers = 8, max-batch = 16); the environment's WORKERPOOL_<OPTION> "
                        "variables come next, the command line wins over both")
    parser.add_argument("--print-config", action="store_true",
                        help="print the options in effect, as a --config file, and exit")
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="text, or json: one JSON object per line (default: %(default)s)")
    parser.add_argument("--workers", type=_positive_or_zero, default=os.cpu_count() or 1,
                        help="worker processes (default: the number of CPUs, %(default)s here)")
    _add_model(parser, "model to build (default: metadata workerpool.model, else recognised "
               f"from the tensors; built-ins: {', '.join(models.BUILTIN_MODELS)})")
    parser.add_argument("--load", choices=LOAD_MODES, default=DEFAULT_LOAD, help=_load_help())
    parser.add_argument("--graceful-timeout", type=_seconds, default=GRACEFUL_TIMEOUT_SECONDS, metavar="S",
                        help=f"{graceful_help} (default: %(default)s)")
    parser.add_argument("--watch-interval", type=_positive_seconds, default=WATCH_INTERVAL_SECONDS, metavar="S",
                        help="seconds between checks of MODEL.bpk for new weights published by rename "
                        "(default: %(default)s)")
    parser.add_argument("--start", choices=START_METHODS, default=DEFAULT_START,
                        help="fork: fork each worker from a warm template process that has imported "
                        "everything (a worker costs a few MiB); spawn: start each worker as a fresh "
                        "interpreter, for models or libraries that are not safe to fork "
                        "(default: %(default)s)")
    parser.add_argument("--threads-per-worker", type=_positive_count, metavar="N",
                        help="threads for each worker's numpy BLAS and OpenMP pools (default: the "
                        "CPUs this process may use divided by --workers, at least 1)")
    parser.add_argument("--max-worker-memory", type=_positive_size, metavar="SIZE",
                        help="recycle a worker whose private memory passes SIZE, after it answers; "
                        "an allocation past it fails that request with 'internal' (default: no limit)")
    parser.add_argument("--no-watch", action="store_true",
                        help="do not watch MODEL.bpk; reload only on SIGHUP (or 'workerpool reload')")
    parser.add_argument("--log-level", choices=LEVELS, default=DEFAULT_LOG_LEVEL,
                        help="default: %(default)s")


_LOAD_MODE_HELP = {
    "mmap": "share one mapped copy of the weights",
    "copy": "a private copy per worker, the naive baseline",
}


def _load_help() -> str:
    """``--load``'s help, marking whichever mode config.py makes the default."""
    return "; ".join(f"{mode}: {_LOAD_MODE_HELP[mode]}" + (" (default)" if mode == DEFAULT_LOAD else "")
                     for mode in LOAD_MODES)


_CONTROL_HELP = "the server's control endpoint (default: as serve's default)"


def _add_control(parser: argparse.ArgumentParser, text: str = _CONTROL_HELP) -> None:
    parser.add_argument("--control", metavar="ENDPOINT", type=_control, help=text)


def _control(text: str) -> str:
    """A control endpoint: always an ipc:// path to a socket file (clients' endpoints are
    elsewhere; an abstract ipc://@name has no permissions to keep others out)."""
    if runtime.ipc_path(text) is not None:
        return text
    if text.startswith("ipc://@"):
        raise argparse.ArgumentTypeError(f"{text!r}: the control socket must be a file, which only "
                                         "you can open (an abstract @name is open to every user)")
    if text.startswith(endpoints.TRANSPORTS) or ":" in text or not text:
        raise argparse.ArgumentTypeError(f"{text!r}: the control socket is an ipc://PATH (the "
                                         "client endpoint, tcp://..., is another socket)")
    raise argparse.ArgumentTypeError(f"{text!r} names no transport: write ipc://{text}")


def _add_model(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--model", metavar="NAME|module:factory", help=text)


def _add_timeout(parser: argparse.ArgumentParser, seconds: float, what: str = "seconds to wait") -> None:
    parser.add_argument("--timeout", type=_positive_seconds, default=seconds, help=f"{what} (default: {seconds:g})")


def _add_server_key_options(parser: argparse.ArgumentParser) -> None:
    """``serve``'s CURVE keys. Its own key is a secret one, hence ``--curve-secret-key``;
    ``--curve-server-key``, which means the server's public key elsewhere, still works here."""
    parser.add_argument("--curve-secret-key", "--curve-server-key", dest="curve_secret_key", metavar="FILE",
                        help="this server's secret key file (from 'workerpool keys generate'): "
                        "authenticate and encrypt the client and TCP worker endpoints with CURVE")
    parser.add_argument("--curve-client-keys", metavar="DIR",
                        help="directory of the public key files of allowed clients")
    parser.add_argument("--curve-worker-keys", metavar="DIR",
                        help="directory of the public key files of allowed worker hosts (needed for a "
                        "--backend on TCP; a client key never admits a worker host)")


def _add_client_key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--curve-key", metavar="FILE",
                        help="this side's secret key file, for a server using CURVE")
    parser.add_argument("--curve-server-key", metavar="FILE", help="the server's public key file (NAME.key)")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_or_zero(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _seconds(text: str) -> float:
    return _amount(text, "seconds")


def _milliseconds(text: str) -> float:
    """Milliseconds on the command line, seconds in the config."""
    return _amount(text, "milliseconds") / MS_PER_SECOND


def _endpoint(text: str, *, bind: bool = False) -> str:
    """A ZeroMQ endpoint, which names its transport (a bare address gets a hint); one to
    ``bind`` may pick a free port (``tcp://HOST:*``)."""
    try:
        return endpoints.check(text, bind=bind)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_bind_endpoint = functools.partial(_endpoint, bind=True)


def _amount(text: str, unit: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of {unit} {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of {unit} from 0 up")
    return value


Number = TypeVar("Number", int, float)


def _above_zero(parse: Callable[[str], Number], message: str) -> Callable[[str], Number]:
    """``parse``, refusing 0 with ``message``: a limit of nothing is a typo, not a setting."""

    def parse_above_zero(text: str) -> Number:
        value = parse(text)
        if value == 0:
            raise argparse.ArgumentTypeError(message)
        return value

    return parse_above_zero


_positive_count = _above_zero(_positive_or_zero, "must be at least 1")
_positive_size = _above_zero(_size, "must be more than 0 bytes")
_positive_seconds = _above_zero(_seconds, "must be more than 0 seconds")


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
            args = _with_sources(parser, argv, args)
            if args.print_config:
                shown = {"batch_wait": args.batch_wait * MS_PER_SECOND} if hasattr(args, "batch_wait") else {}
                print(config_sources.effective(args.command_parser, args, shown))
                return 0
        return handler(args)
    except CommandError as exc:
        print(f"workerpool: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. piped into head: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
