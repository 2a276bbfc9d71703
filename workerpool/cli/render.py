"""What the commands print as tables: ``inspect``'s tensors and ``status``'s processes."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .. import burnpack, models
from ..ops import metrics
from ..supervisor.ready_line import worker_count
from ..units import format_size


def inspect_document(pack: burnpack.Burnpack, model: str | None) -> dict:
    """``inspect --json``: what the table shows, with nothing shortened."""
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


def print_inspect_table(pack: burnpack.Burnpack, model: str | None) -> None:
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


def output_width() -> int:
    """The terminal's width (or ``COLUMNS``); no limit when stdout is a file or a pipe, whose
    reader gets every column."""
    import shutil

    return shutil.get_terminal_size((sys.maxsize, 0)).columns


def print_status(status: dict[str, Any], width: int, *, explain: bool = False) -> None:
    """The status in ``width`` columns: its lines wrapped, the table's least important columns
    left out (``--json`` has them all)."""
    queue = status["queue"]
    say = functools.partial(_print_wrapped, width=width)
    say(f"supervisor {status['supervisor_pid']} serving on {status['endpoint']}")
    if status["degraded"]:
        say(f"DEGRADED: {status['degraded']}")
    several = len(status["models"]) > 1
    for name, model in status["models"].items():
        workers = f", {worker_count(model['workers'])}, {model['queue']} waiting" if several else ""
        say(f"{'model ' + name if several else 'model ' + model['name']}: {model['path']} "
            f"({'model ' + model['name'] + ', ' if several else ''}{format_size(model['size'])}, inode "
            f"{model['inode']}, generation {model['generation']}, {model['load']}{workers})")
    threads = status["threads_per_worker"]
    say(f"queue: {queue['depth']} waiting (max {queue['max']}), {queue['in_flight']} in flight; "
        f"{threads} BLAS thread{'' if threads == 1 else 's'} per worker")
    connections = status["connections"]
    say(f"client connections: {connections['served']} served (max {connections['max']}), "
        f"{connections['open']} open")
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
    served = [worker["served"] for worker in status["workers"]]
    if any(served) and not all(served):
        say(f"{served.count(0)} of {len(served)} workers have served nothing yet: the worker freed "
            "last takes the next request (its caches are warm), so requests sent one at a time all go "
            "to one worker, and only workers that ran requests hold private memory (what a run "
            "allocates; the weights stay shared)")
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
