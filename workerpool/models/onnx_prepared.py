"""This machine's prepacked copy of an ONNX model, made once per weight file and mapped by every
worker's session.

A session built on views of the mapping must run without prepacking (it would copy the MatMul
weights into each worker), so each pass packs those weights again: for all-MiniLM-L6-v2 about
12 ms on one thread, more than a short sentence's own work. onnxruntime can save an optimised
model whose external data holds the prepacked weights beside the others
(``session.save_external_prepacked_constant_initializers``); a session loaded from that file
maps its data instead of reading it, and takes the packed weights from the mapping, so every
worker shares those pages as it shares the Burnpack file's. The packed layout follows this CPU
and this onnxruntime, so the copy is made where it is served, never by ``convert``.

The copy lives in ``CACHE/onnx/NAME-KEY/`` (``model.onnx`` and ``model.data``), KEY a digest of
the weight file's identity (device, inode, size, modification time), onnxruntime's version,
this CPU's flags and :data:`FORMAT`. A child process makes it (``python -m
workerpool.models.onnx_copier``), so that the weights it reads in full and the session it
builds leave nothing behind in the supervisor or a worker; under an exclusive lock, so that
workers starting together make it once; in a temporary folder renamed into place, so that a
copy is complete or absent (the child is :mod:`.onnx_copier`).
Making a copy removes the older copies of the same file name beyond the newest :data:`KEEP`.
Whatever fails leaves the model on views of the mapping: the same answers, slower passes.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile

from .. import burnpack
from . import onnx_copier
from .onnx_copier import MODEL_FILE, NotPrepared

log = logging.getLogger(__name__)

FORMAT = 1  # how the copy is made; a change makes every older copy stale
KEEP = 2  # copies kept per weight file name: the served one and the one being rolled out
MAKE_TIMEOUT = 1800.0  # seconds a child may take to read, pack and write a large model


def prepared_model(cache_dir: str, path: str, identity: burnpack.FileIdentity) -> str | None:
    """The ``model.onnx`` of this machine's copy of the weight file ``path`` (identity
    ``identity``), made now if there is none; None, logged, when it cannot be made."""
    try:
        return _prepared(cache_dir, path, identity)
    except (OSError, NotPrepared, subprocess.SubprocessError) as exc:
        log.warning("onnx: no prepacked copy of %s in %s (%s); serving it without prepacking, "
                    "which is slower", path, cache_dir, " ".join(str(exc).split()))
        return None


def forget(model_file: str) -> None:
    """Remove a copy that would not load, so that the next build makes it again."""
    shutil.rmtree(os.path.dirname(model_file), ignore_errors=True)


def _prepared(cache_dir: str, path: str, identity: burnpack.FileIdentity) -> str:
    folder = os.path.join(cache_dir, "onnx")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    found = os.lstat(folder)  # a copy is code onnxruntime runs: nobody else may plant one
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        raise NotPrepared(f"{folder} must be a directory of uid {os.getuid()} that no one else can write to")
    name = os.path.basename(path)
    entry = os.path.join(folder, f"{name}-{_key(identity)}")
    model = os.path.join(entry, MODEL_FILE)
    if os.path.exists(model):
        return model
    with open(os.path.join(folder, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(model):  # another process made it while this one waited
            return model
        making = tempfile.mkdtemp(prefix=".making-", dir=folder)
        try:
            _make(path, identity, making)
            os.rename(making, entry)
        finally:
            shutil.rmtree(making, ignore_errors=True)
        _remove_older(folder, name, keep=entry)
    log.info("onnx: made a prepacked copy of %s in %s", path, entry)
    return model


def _make(path: str, identity: burnpack.FileIdentity, folder: str) -> None:
    command = [sys.executable, "-m", onnx_copier.__name__, path, folder, json.dumps(identity.as_list())]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=MAKE_TIMEOUT, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise NotPrepared(lines[-1])


def _key(identity: burnpack.FileIdentity) -> str:
    import onnxruntime

    parts = [FORMAT, identity.as_list(), onnxruntime.__version__, _cpu_flags()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _cpu_flags() -> str:
    """What the packed layout depends on: the instruction sets this CPU has."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


def _remove_older(folder: str, name: str, keep: str) -> None:
    """Copies of ``name`` beyond the newest :data:`KEEP`; a worker still mapping one keeps
    its pages until it unmaps them."""
    copies = sorted((entry for entry in os.scandir(folder)
                     if entry.name.startswith(f"{name}-") and entry.is_dir(follow_symlinks=False)
                     and entry.path != keep),
                    key=lambda entry: entry.stat().st_mtime, reverse=True)
    for entry in copies[KEEP - 1:]:
        shutil.rmtree(entry.path, ignore_errors=True)
