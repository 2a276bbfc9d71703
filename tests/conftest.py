"""Shared test fixtures.

The Burn-written reference file lives outside the repository (``../shared/fixtures`` beside
the repo root, as in CI) and is never copied in; tests that need it skip when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

BURN_MNIST = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "burn-mnist.bpk"


@pytest.fixture(scope="session")
def burn_mnist_path() -> Path:
    """Path of the Burn-written MNIST weights (``burn-mnist.bpk``); skips the test if absent."""
    if not BURN_MNIST.is_file():
        pytest.skip(
            f"Burn-written fixture not found at {BURN_MNIST} (expected ../shared beside the repo)"
        )
    return BURN_MNIST


@pytest.fixture(scope="session")
def burn_mnist_bytes(burn_mnist_path: Path) -> bytes:
    """The fixture's raw bytes, read once per session."""
    return burn_mnist_path.read_bytes()
