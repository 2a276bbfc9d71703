"""A test model whose module, when imported, does what some libraries do: ignores SIGCHLD (so
that children are reaped by the kernel), starts a thread, and opens a log file (named by
``$CARELESS_LOG``) that every request writes its worker's pid to."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
threading.Thread(target=threading.Event().wait, daemon=True).start()
LOG = open(os.environ["CARELESS_LOG"], "a", buffering=1)  # noqa: SIM115 - open for the module's life


class Doubler:
    def __call__(self, x: np.ndarray) -> np.ndarray:
        LOG.write(f"{os.getpid()}\n")
        return 2 * x


def factory(weights, metadata) -> Doubler:
    return Doubler()
