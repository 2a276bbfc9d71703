"""English sentences from the docstrings of standard-library modules: text an embedding
benchmark can send in any amount, the same on every machine with the same Python."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import random
import re
from collections.abc import Iterator
from types import ModuleType

MODULES = ("argparse", "asyncio", "calendar", "collections", "concurrent.futures", "configparser",
           "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum",
           "fractions", "functools", "gzip", "heapq", "http.client", "http.server", "imaplib", "inspect",
           "ipaddress", "json", "logging", "mailbox", "multiprocessing", "pathlib", "pickle", "pydoc",
           "queue", "random", "sched", "selectors", "shutil", "smtplib", "socket", "socketserver",
           "sqlite3", "ssl", "statistics", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
           "timeit", "typing", "unittest", "urllib.request", "uuid", "warnings", "weakref",
           "xml.dom.minidom", "zipfile")
CODE = re.compile(r"[_()\[\]{}<>=*`|#@\\$~^/+%&]|\w\.\w|\.\.\.|--|\s-\w")  # not English prose


def sentences(count: int, seed: int) -> list[str]:
    """``count`` different sentences of 6 to 54 words from the docstrings of ``MODULES`` that
    look like prose (no code), in an order shuffled with ``seed``."""
    found: set[str] = set()
    for name in MODULES:
        with contextlib.suppress(ImportError):
            for doc in docstrings(importlib.import_module(name)):
                found.update(prose(doc))
    chosen = sorted(found)
    random.Random(seed).shuffle(chosen)
    if len(chosen) < count:
        raise SystemExit(f"only {len(chosen)} sentences in the docstrings, {count} asked for")
    return chosen[:count]


def docstrings(module: ModuleType) -> Iterator[str]:
    """The module's docstring, its public classes' and functions', and their methods'."""
    yield inspect.getdoc(module) or ""
    for name, member in sorted(vars(module).items()):
        if name.startswith("_") or getattr(member, "__module__", None) != module.__name__:
            continue
        yield inspect.getdoc(member) or ""
        if inspect.isclass(member):
            yield from (inspect.getdoc(m) or "" for a, m in sorted(vars(member).items())
                        if not a.startswith("_") and callable(m))


def prose(doc: str) -> Iterator[str]:
    """The sentences of ``doc`` a model would be sent: whole ones, of 6 to 54 words, without code."""
    for paragraph in re.split(r"\n\s*\n", doc):
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(paragraph.split())):
            if (6 <= len(sentence.split()) <= 54 and sentence[0].isupper() and sentence[-1] in ".!?"
                    and not CODE.search(sentence)):
                yield sentence


def digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
