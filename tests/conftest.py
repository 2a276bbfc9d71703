"""Shared test fixtures, and the ``process`` marker.

``unit/`` holds the in-process tests, by the package they test; ``process/`` the tests that start
servers, workers or the command line, which are all marked ``process`` here (a unit test that
starts one is marked where it stands), so that ``pytest -m "not process"`` runs the fast ones
alone. The Burn-written reference file lives outside the repository (``../shared/fixtures``
beside the checkout, as in CI); tests that need it skip when it is absent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from support import server
from support.models import build_local
from support.paths import BURN_MNIST, TESTS

from workerpool import models
from workerpool.config.pool import START_METHODS

PROCESS_TESTS = TESTS / "process"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: the process tests wait on servers more than they compute, so two test
    processes a CPU; the in-process tests alone only compute, and each test process collects the
    whole suite again, so one a CPU."""
    cpus = os.cpu_count() or 1
    return cpus if "not process" in (config.option.markexpr or "") else 2 * cpus


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_TESTS in item.path.parents:
            item.add_marker(pytest.mark.process)


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Servers the tests start keep what their models prepare (``--cache-dir``'s default, under
    ``$XDG_CACHE_HOME``) in a folder of this session's, not the user's cache."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(folder))
        yield folder / "workerpool"


@pytest.fixture(scope="session")
def burn_mnist_path() -> Path:
    """Path of the Burn-written MNIST weights (``burn-mnist.bpk``); skips the test if absent."""
    if not BURN_MNIST.is_file():
        pytest.skip(
            f"Burn-written fixture not found at {BURN_MNIST}: the weights of Burn's "
            "examples/mnist-inference-web model as Burn 0.22 saves a module record; where it comes "
            "from and why no file of ours stands in: docs/architecture.md#development"
        )
    return BURN_MNIST


@pytest.fixture(scope="session")
def burn_mnist_bytes(burn_mnist_path: Path) -> bytes:
    """The fixture's raw bytes, read once per session."""
    return burn_mnist_path.read_bytes()


@pytest.fixture(scope="session")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 1 MiB generated mlp, written once per session: quick to serve from several workers."""
    path = tmp_path_factory.mktemp("model") / "small.bpk"
    models.generate_mlp(path, 1024 * 1024)
    return str(path)


@pytest.fixture(scope="session")
def local_model(small_model: str) -> Callable[..., Any]:
    """``small_model`` built in the test process: the answers a server must give."""
    return build_local(small_model)


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a serving test twice: workers forked from the template, and spawned fresh."""
    monkeypatch.setattr(server, "START", request.param)
    return request.param


class ClosingContext(zmq.Context):
    """A context that keeps every socket made from it until ``destroy`` closes them: a socket a
    test drops is not left to the garbage collector, which warns of it as unclosed."""

    made: list[zmq.Socket] | None = None  # declared on the class: pyzmq takes an unknown attribute for an option

    def __init__(self) -> None:
        super().__init__()
        self.made = []

    def socket(self, *args: Any, **kwargs: Any) -> zmq.Socket:
        sock = super().socket(*args, **kwargs)
        assert self.made is not None
        self.made.append(sock)
        return sock

    def destroy(self, linger: int | None = None) -> None:
        for sock in self.made or ():
            sock.close(linger)
        super().destroy(linger=linger)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = ClosingContext()
    yield ctx
    ctx.destroy(linger=0)
