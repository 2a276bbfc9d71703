"""A worker's way to its router: a link inherited by descriptor, refused clearly when it is none."""

from __future__ import annotations

import os

import pytest

from workerpool.protocol import link
from workerpool.worker.channels import LinkChannel
from workerpool.worker.spec import InvalidSpec


def test_a_descriptor_that_is_no_link_is_a_clear_error():
    r, w = os.pipe()
    try:
        with pytest.raises(InvalidSpec, match=f"--link-fd {r}: "):
            LinkChannel(r)
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(InvalidSpec, match="--link-fd 999: Bad file descriptor"):
        LinkChannel(999)


def test_the_link_is_not_inherited_by_what_the_worker_starts():
    ours, theirs = link.pair()
    os.set_inheritable(theirs.fileno(), True)  # as it arrives through a fork or pass_fds
    channel = LinkChannel(theirs.detach())
    try:
        assert not os.get_inheritable(channel.source)
        assert channel.send([b"READY"])
        assert ours.recv(100).endswith(b"READY")
    finally:
        channel.close()
        ours.close()
