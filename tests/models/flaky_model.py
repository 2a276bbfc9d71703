"""A test model whose factory fails while a flag file exists.

It stands for a worker that cannot start although the weight file is fine (a broken
dependency, no memory): the supervisor validated the file once and has no reason to look at it
again, so only the worker's own start fails. ``WORKERPOOL_TEST_FAIL_FLAG`` names the flag file.
"""

from __future__ import annotations

import os

from slow_model import SlowDouble

from workerpool.models import ModelError

FLAG = "WORKERPOOL_TEST_FAIL_FLAG"


def factory(weights, metadata) -> SlowDouble:
    flag = os.environ.get(FLAG)
    if flag and os.path.exists(flag):
        raise ModelError(f"{flag} exists: this worker refuses to start")
    return SlowDouble()
