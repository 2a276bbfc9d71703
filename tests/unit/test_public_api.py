"""The public surface of ``workerpool`` is what this file lists, no more and no less.

Pinned as httpx pins its exported members: a name added to, or dropped from, ``__all__`` fails
here until this list says so too, and so does a public class that moves to another module
(its ``__module__`` is what tracebacks, pickles and the docs show).
"""

from __future__ import annotations

import tomllib

from support.paths import ROOT

import workerpool

ERRORS = "workerpool.errors"
EXPECTED_MODULES = {
    "AsyncClient": "workerpool.client.aio",
    "BadRequest": ERRORS,
    "Client": "workerpool.client.sync",
    "ClientKeys": "workerpool.security",
    "ConnectionLost": ERRORS,
    "DeadlineExceeded": ERRORS,
    "ErrorCode": ERRORS,
    "InternalError": ERRORS,
    "ModelNotFound": ERRORS,
    "Overloaded": ERRORS,
    "RemoteError": ERRORS,
    "RequestTimeout": ERRORS,
    "RequestTooLarge": ERRORS,
    "Result": "workerpool.client.calls",
    "ShuttingDown": ERRORS,
    "Timeout": ERRORS,
    "Unreachable": ERRORS,
    "WorkerFailed": ERRORS,
    "WorkerpoolError": ERRORS,
}


def test_all_lists_exactly_the_public_names_sorted() -> None:
    assert workerpool.__all__ == sorted(EXPECTED_MODULES)


def test_dir_shows_the_public_names_and_the_version() -> None:
    assert dir(workerpool) == sorted([*EXPECTED_MODULES, "__version__"])


def test_every_public_name_resolves_to_its_defining_module() -> None:
    found = {name: getattr(workerpool, name).__module__ for name in workerpool.__all__}
    assert found == EXPECTED_MODULES


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        workerpool.NoSuchName  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("workerpool.NoSuchName resolved")


def test_the_errors_are_one_family() -> None:
    """``except workerpool.WorkerpoolError`` catches every error the package raises at a caller."""
    errors = [name for name, module in EXPECTED_MODULES.items()
              if module == ERRORS and name != "ErrorCode"]
    assert all(issubclass(getattr(workerpool, name), workerpool.WorkerpoolError) for name in errors)


def test_the_version_is_the_one_pyproject_declares() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert workerpool.__version__ == declared
