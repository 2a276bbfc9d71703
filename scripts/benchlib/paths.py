"""Where the scripts, the peer apps they start and the tests' models live: what a server they
start is given on its path."""

from __future__ import annotations

import os

SCRIPTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_DIR = os.path.join(os.path.dirname(SCRIPTS_DIR), "tests")
TEST_MODELS_DIR = os.path.join(TESTS_DIR, "models")  # slow_model and the others, for --model
