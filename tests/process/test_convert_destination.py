"""``convert`` replaces a file only when asked, and never one a running server maps (a README
that converted into the demo's file took its server down to DEGRADED)."""

from __future__ import annotations

import numpy as np
import pytest
from support.commands import cli
from support.server import Server

pytestmark = pytest.mark.process


def test_convert_replaces_a_file_only_when_asked_and_never_one_a_server_serves(tmp_path):
    source = tmp_path / "weights.npz"
    np.savez(source, w=np.ones((4, 4), np.float32))
    destination = tmp_path / "model.bpk"
    assert cli("new-model", destination, "--size", "64KiB").returncode == 0
    before = destination.read_bytes()

    refused = cli("convert", source, destination)
    assert refused.returncode == 2, refused.stderr
    assert "exists: give --force" in refused.stderr and "workerpool publish" in refused.stderr
    assert destination.read_bytes() == before

    with Server(destination, workers=1) as server:
        served = cli("convert", source, destination, "--force")
        assert served.returncode == 2, served.stderr
        assert "a server serves it" in served.stderr and "workerpool publish" in served.stderr
        assert destination.read_bytes() == before
        assert [w["state"] for w in server.status()["workers"]] == ["ready"]

    replaced = cli("convert", source, destination, "--force")
    assert replaced.returncode == 0, replaced.stderr
    assert destination.read_bytes() != before
