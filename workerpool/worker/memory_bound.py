"""``--max-worker-memory`` inside a worker: the hard bound on what a request may allocate, the
soft bound on what a worker may keep."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
from collections.abc import Iterator

import numpy as np

from ..linux import procfs
from ..units import format_size

log = logging.getLogger(__name__)

BLAS_WARM_UP = 512  # side of a matrix product big enough to run on every BLAS thread


class MemoryLimitTooLow(Exception):
    """The worker would be over --max-worker-memory before serving anything."""


class MemoryBound:
    """``--max-worker-memory`` inside the worker: a hard bound per request, a soft one per worker.

    The hard bound is RLIMIT_DATA, which counts private writable mappings (heap, anonymous
    memory, thread stacks) and not the read-only shared mapping of the weights. Set to what the
    worker has mapped once ready plus the limit, it makes an allocation past the limit fail
    with MemoryError, which fails that request alone instead of growing the worker. The soft
    bound is checked after each answer: a worker whose resident private memory (RssAnon) is
    over the limit, kept by a leak or a fragmented heap, leaves the pool to be replaced.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._inherited = resource.getrlimit(resource.RLIMIT_DATA)
        _warm_up_blas()
        self.arm()
        private = self.private()
        if private > limit:
            raise MemoryLimitTooLow(f"--max-worker-memory {format_size(limit)} is below this worker's own "
                                    f"private memory once ready ({format_size(private)}); raise it")

    def _warn_if_over(self) -> None:
        private = self.private()
        if private > self.limit:
            log.warning("worker %d: private memory is %s with the new generation, over "
                        "--max-worker-memory %s: it will be recycled after every request",
                        os.getpid(), format_size(private), format_size(self.limit))

    def arm(self) -> None:
        """Allow the limit beyond what is mapped now (never more than the inherited limits)."""
        soft, hard = self._inherited
        inherited = [limit for limit in (soft, hard) if limit != resource.RLIM_INFINITY]
        mapped = procfs.status_figures()["VmData"]  # private writable mappings: what RLIMIT_DATA counts
        bound = min([mapped + self.limit, *inherited])
        resource.setrlimit(resource.RLIMIT_DATA, (bound, hard))

    @contextlib.contextmanager
    def lifted(self) -> Iterator[None]:
        """No hard bound while a new generation is built (``--load copy`` copies its weights),
        then one measured afresh, once the replaced generation is gone."""
        resource.setrlimit(resource.RLIMIT_DATA, self._inherited)
        try:
            yield
        finally:
            self.arm()
            self._warn_if_over()

    @contextlib.contextmanager
    def unbounded(self) -> Iterator[None]:
        """No hard bound while a message from the router is read: the router bounds its size
        (--max-message-size), and one that cannot be read would lose the worker, not fail the
        request (an arena's memory not yet given back can leave too little room for it)."""
        bound = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, self._inherited)
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, bound)

    def private(self) -> int:
        """Resident private memory (RssAnon) in bytes."""
        return procfs.private_resident()


def _warm_up_blas() -> None:
    """One matrix product per float type: BLAS threads allocate their work buffers on first use
    and keep them, which must happen before the bound is set, not out of a request's share."""
    for dtype in (np.float32, np.float64):
        square = np.ones((BLAS_WARM_UP, BLAS_WARM_UP), dtype)
        square @ square
