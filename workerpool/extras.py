"""The optional dependencies: which extra installs each, and the one line a user reads when one
is missing (instead of a traceback ending in ``ModuleNotFoundError``)."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRA_OF = {"httptools": "http", "onnxruntime": "onnx", "onnx": "onnx", "tokenizers": "hf",
            "safetensors": "hf"}


def installed(module: str) -> bool:
    """Whether ``module`` imports: each caller imports it next anyway, so trying costs nothing."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing(module: str, purpose: str) -> str:
    """Why ``purpose`` cannot run, and the install line that mends it."""
    extra = EXTRA_OF[module]
    return (f"{purpose} needs the {module} package, which is not installed: python3 -m pip install "
            f"{module} (or install workerpool with its {extra} extra: python3 -m pip install '.[{extra}]')")


def imported(module: str, purpose: str, error: type[Exception]) -> ModuleType:
    """``module``, or ``error`` saying what ``purpose`` lacks and how to install it."""
    if not installed(module):
        raise error(missing(module, purpose))
    return importlib.import_module(module)  # imported already: a look-up
