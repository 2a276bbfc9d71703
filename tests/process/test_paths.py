"""A model named without its extension is served as the file Burn's reader finds (``model`` for
``model.bpk``), and every later check reads that same file: validation, the watcher, reloads."""

from __future__ import annotations

import pytest
from support.commands import cli
from support.server import Server

pytestmark = pytest.mark.process


def test_a_path_without_its_extension_serves_and_reloads_the_bpk(tmp_path):
    assert cli("new-model", tmp_path / "model.bpk", "--size", "64KiB").returncode == 0
    assert cli("new-model", tmp_path / "new.bpk", "--size", "64KiB", "--seed", "7").returncode == 0
    with Server(tmp_path / "model", "--watch-interval", "0.1", workers=1) as server:
        assert "serving " + str(tmp_path / "model.bpk") in server.ready_line
        published = cli("publish", tmp_path / "new.bpk", tmp_path / "model.bpk", "--control", server.control)
        assert published.returncode == 0, published.stderr
        server.wait_for(lambda s: s["model"]["generation"] == 2)
        assert "replaced while being validated" not in server.log()
