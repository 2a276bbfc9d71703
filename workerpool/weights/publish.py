"""Deploy new weights safely: validate, copy beside the served file, rename over it.

A server watching the destination sees a new inode and reloads; processes that still map the
old file keep its pages until they let go, so nobody reads a half-written file.
"""

from __future__ import annotations

import filecmp
import os
import shutil

from .. import burnpack, models
from ..atomic import replace_atomically
from ..control import client as control
from ..units import MiB
from . import reload

COPY_CHUNK = 16 * MiB
CHECK_TIMEOUT = 60.0  # seconds for the server to build its model on the copy


class PublishError(Exception):
    """SRC was refused or could not be copied; DEST is untouched."""


def publish(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    control_endpoint: str | None = None,
    model: str | None = None,
    fit: bool = False,
    served: str | None = None,
) -> burnpack.FileIdentity:
    """Validate ``source``, then atomically make ``destination`` a copy of it.

    The model check is the running server's when ``control_endpoint`` is given (it builds its
    own model on the copy beside ``destination``, the only place it looks, before the rename);
    otherwise ``model`` (or the file's own choice) is built here and, with ``fit``, must take the
    input and give the output of the model built on the file now at ``destination``, as a
    server serving it would require. ``served``: the name the server serves ``destination``
    under (None: its only model). A symbolic link at ``destination`` is followed: the file
    it names is replaced.
    """
    source, destination = os.fspath(source), os.path.realpath(destination)
    same = _published_as(source, destination)
    if same:  # a rename would only make a server start a generation of the weights it serves
        raise PublishError(f"{source} is already published as {destination} ({same}): "
                           "nothing renamed")
    if control_endpoint is None:
        _check_here(source, destination, model, fit)
    else:
        try:
            burnpack.read(source)
        except burnpack.BurnpackError as exc:
            raise PublishError(str(exc)) from exc
    try:
        with open(source, "rb") as src, replace_atomically(destination) as dst:
            shutil.copyfileobj(src, dst, COPY_CHUNK)
            if control_endpoint is not None:
                dst.flush()
                _server_check(control_endpoint, source, dst.name, served)
    except OSError as exc:
        raise PublishError(f"cannot publish {source} to {destination}: {exc.strerror or exc}") from exc
    return burnpack.FileIdentity.of(os.stat(destination))


def _check_here(source: str, destination: str, model: str | None, fit: bool) -> None:
    """Build ``source``'s model here; with ``fit``, it must fit the one built on
    ``destination`` (a destination that cannot be built, or is not there, is no constraint)."""
    try:
        name, _, signature = reload.validate(source, model)
    except reload.WeightsRefused as exc:
        raise PublishError(str(exc)) from exc
    if not fit or not os.path.exists(destination):
        return
    try:
        _, _, served = reload.validate(destination, model)
    except reload.WeightsRefused:
        return
    mismatch = models.signature_mismatch(served, signature)
    if mismatch:
        raise PublishError(f"{source}: model {name} does not fit the one now at {destination}: "
                           f"{mismatch} (--no-check publishes it anyway)")


def _published_as(source: str, destination: str) -> str | None:
    """How ``destination`` already is ``source`` (the same file, or the same bytes), or None."""
    try:
        if os.path.samefile(source, destination):
            return "the same file"
        return "the same content" if filecmp.cmp(source, destination, shallow=False) else None
    except OSError:  # no destination yet, say; a source that cannot be read is refused later
        return None


def _server_check(control_endpoint: str, source: str, copy: str, served: str | None) -> None:
    try:
        control.call(control_endpoint, "check", path=os.path.abspath(copy), model=served, timeout=CHECK_TIMEOUT)
    except control.Unanswered as exc:
        raise PublishError(f"{source}: cannot ask the running server to check it: {exc}") from exc
    except control.ControlError as exc:
        raise PublishError(f"{source}: the running server refuses it: {exc}") from exc
