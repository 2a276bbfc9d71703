"""Where the tests find the repository, their models and their fixtures."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
TESTS = ROOT / "tests"
MODELS = TESTS / "models"  # the test models (slow_model, batch_model...), on every server's PYTHONPATH
FIXTURES = TESTS / "fixtures"
# The Burn-written reference file lives outside the repository (``../shared/fixtures`` beside the
# checkout, as in CI) and is never copied in; tests that need it skip when it is absent.
BURN_MNIST = ROOT.parent / "shared" / "fixtures" / "burn-mnist.bpk"
