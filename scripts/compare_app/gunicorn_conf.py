"""gunicorn settings for ``scripts/compare.py``: each forked worker limits its BLAS and OpenMP
thread pools to ``$COMPARE_THREADS``, as a workerpool worker does with ``--threads-per-worker``."""

from __future__ import annotations

import os
from typing import Any

from threadpoolctl import threadpool_limits


def post_fork(server: Any, worker: Any) -> None:
    threadpool_limits(limits=int(os.environ["COMPARE_THREADS"]))
