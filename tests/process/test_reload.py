"""Hot reload with real files, renames and processes: no failed request, no mixed generations."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections import defaultdict
from pathlib import Path
from typing import Self

import numpy as np
import pytest
from support.commands import cli
from support.models import build_local
from support.server import Server
from support.status import pool_ready

import workerpool
from workerpool import burnpack, models
from workerpool.weights.publish import publish

WIDTH = 64
SIZE = 256 * 1024


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> list[Path]:
    """Six versions of one architecture: same shapes, different weights."""
    folder = tmp_path_factory.mktemp("versions")
    paths = []
    for seed in range(6):
        path = folder / f"v{seed}.bpk"
        models.generate_mlp(path, SIZE, width=WIDTH, seed=seed)
        paths.append(path)
    return paths


class Load:
    """Client threads sending continuously; every outcome is recorded, nothing is retried by hand."""

    def __init__(self, endpoint: str, clients: int = 2) -> None:
        self.stop = threading.Event()
        self.inputs = [np.random.default_rng(i).standard_normal((1, WIDTH), dtype=np.float32)
                       for i in range(clients)]
        self.replies: dict[int, list[tuple[int, np.ndarray]]] = defaultdict(list)
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(endpoint, i)) for i in range(clients)]

    def _run(self, endpoint: str, index: int) -> None:
        with workerpool.Client(endpoint, timeout=20, retries=1) as client:
            while not self.stop.is_set():
                try:
                    result = client.request(self.inputs[index])
                except workerpool.WorkerpoolError as exc:
                    self.failures.append(f"client {index}: {type(exc).__name__}: {exc}")
                    continue
                self.replies[index].append((result.generation, result.outputs))

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def all_on(generation: int, workers: int):
    def check(status: dict) -> bool:
        ws = status["workers"]
        return len(ws) == workers and all(w["generation"] == generation and w["state"] in ("ready", "busy")
                                          for w in ws)
    return check


def test_five_publishes_under_load_fail_no_request(tmp_path, versions):
    served = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], served)
    with Server(served, workers=3) as server, Load(server.endpoint) as load:
        for generation, version in enumerate(versions[1:], start=2):
            seen = sum(len(r) for r in load.replies.values())
            publish(version, served)
            server.wait_for(all_on(generation, 3))
            server.wait_for(lambda s, seen=seen: sum(len(r) for r in load.replies.values()) > seen + 5)
    assert load.failures == []
    expected = {g: [build_local(v)(x) for x in load.inputs] for g, v in enumerate(versions, start=1)}
    for index, replies in load.replies.items():
        generations = [g for g, _ in replies]
        assert generations == sorted(generations), "a client saw generations go backwards"
        assert set(generations) >= {1, 6}
        for generation, outputs in replies:
            np.testing.assert_allclose(outputs, expected[generation][index], rtol=1e-5, atol=1e-6)


def test_invalid_and_misfit_files_are_refused_and_old_weights_keep_serving(tmp_path, versions):
    served = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], served)
    misfit = tmp_path / "misfit.bpk"
    models.generate_mlp(misfit, SIZE, width=WIDTH * 2, seed=9)
    garbage = tmp_path / "garbage.bpk"
    garbage.write_bytes(b"NRUB\x01\x00\xff\xff\x00\x00" + b"\x00" * 100)
    with Server(served, workers=2) as server, Load(server.endpoint) as load:
        for bad, reason in ((garbage, "metadata"), (misfit, "does not fit generation 1")):
            temp = tmp_path / "incoming.bpk"
            shutil.copyfile(bad, temp)
            os.rename(temp, served)
            status = server.wait_for(lambda s, reason=reason: (s["model"]["last_reload"] or {}).get("result")
                                     == "refused" and reason in s["model"]["last_reload"]["reason"])
            assert status["model"]["generation"] == 1
            assert all(w["generation"] == 1 for w in status["workers"])
            seen = sum(len(r) for r in load.replies.values())
            server.wait_for(lambda s, seen=seen: sum(len(r) for r in load.replies.values()) > seen + 5)
        publish(versions[1], served)  # fixing the file is picked up as usual
        server.wait_for(all_on(2, 2))
    assert load.failures == []
    assert {g for r in load.replies.values() for g, _ in r} == {1, 2}
    log = server.log()
    assert "refused new weights" in log and "generation 1 keeps serving" in log


def test_old_file_is_unmapped_after_reload(tmp_path, versions):
    served = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], served)
    with Server(served, workers=2) as server:
        old_inode = os.stat(served).st_ino
        pids = server.worker_pids()
        assert all(maps_inode(pid, old_inode) for pid in pids)
        publish(versions[1], served)
        server.wait_for(all_on(2, 2))
        new_inode = os.stat(served).st_ino
        for pid in server.worker_pids():
            assert not maps_inode(pid, old_inode), f"worker {pid} still maps the replaced file"
            assert maps_inode(pid, new_inode)
        assert not maps_inode(server.proc.pid, old_inode)
        # Nor does the supervisor keep the replaced file open (on disk) until the next reload.
        server.wait_for(lambda _: not holds_inode(server.proc.pid, old_inode), timeout=10)
        assert holds_inode(server.proc.pid, new_inode)


def holds_inode(pid: int, inode: int) -> bool:
    """Whether ``pid`` has a descriptor open on the file of ``inode``."""
    found = False
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found = found or os.stat(f"/proc/{pid}/fd/{fd}").st_ino == inode
        except OSError:  # closed meanwhile
            continue
    return found


def test_the_template_lets_go_of_a_file_the_supervisor_has_let_go_of(tmp_path, versions):
    """The template maps the model it builds for the workers it forks; once two newer
    generations have come, the supervisor closes the first file, and so must the template."""
    served = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], served)
    with Server(served, workers=1) as server:
        first = os.stat(served).st_ino
        template = server.status()["template"]["pid"]
        assert maps_inode(template, first)  # built there, shared by the worker forked from it
        for generation, version in ((2, versions[1]), (3, versions[2])):
            publish(version, served)
            server.wait_for(all_on(generation, 1))
        server.wait_for(lambda _: not maps_inode(template, first), timeout=10)
        assert not maps_inode(server.proc.pid, first)


def maps_inode(pid: int, inode: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any(len(fields) >= 6 and fields[4] == str(inode) for fields in map(str.split, f))


def test_truncated_in_place_recovers_once_a_valid_file_is_back(tmp_path, versions):
    served = tmp_path / "served.bpk"
    models.generate_mlp(served, 8 * 1024 * 1024, seed=1)
    good = tmp_path / "good.bpk"
    shutil.copyfile(served, good)
    width = burnpack.read(served).tensors["layers.0.weight"].shape[0]
    with Server(served, workers=2) as server:
        stop = threading.Event()

        def load() -> None:
            with workerpool.Client(server.endpoint, timeout=2, retries=0) as client:
                while not stop.is_set():
                    try:
                        client.infer(np.ones((1, width), np.float32))
                    except workerpool.WorkerpoolError:
                        pass

        thread = threading.Thread(target=load)
        thread.start()
        try:
            with open(served, "r+b") as f:  # the unsafe way: same inode, cut short
                f.truncate(os.path.getsize(served) // 2)
            server.wait_for(lambda s: (s["model"]["last_reload"] or {}).get("result") == "refused")
            server.wait_for(lambda s: "SIGBUS" in server.log(), timeout=30)
            publish(good, served)
            server.wait_for(lambda s: len(s["workers"]) == 2
                            and all(w["state"] in ("ready", "busy") and w["generation"] == 2
                                    for w in s["workers"]))
        finally:
            stop.set()
            thread.join(30)
        with workerpool.Client(server.endpoint, timeout=20) as client:
            assert client.request(np.ones((1, width), np.float32)).generation == 2
    log = server.log()
    assert "modified in place" in log and "publish new weights by rename" in log
    assert "was killed by SIGBUS" in log


def test_sighup_and_reload_command(tmp_path, versions):
    served = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], served)
    with Server(served, "--no-watch", workers=2) as server:
        def reload_command() -> subprocess.CompletedProcess[str]:
            return cli("reload", "--control", server.control, timeout=60)

        unchanged = reload_command()
        assert unchanged.returncode == 0
        assert "unchanged; generation 1 keeps serving" in unchanged.stdout

        publish(versions[1], served)
        assert server.status()["model"]["generation"] == 1  # not watching: nothing happens by itself
        server.signal(signal.SIGHUP)
        server.wait_for(all_on(2, 2))

        publish(versions[2], served)
        done = reload_command()
        assert done.returncode == 0, done.stderr
        assert "every worker now serves generation 3" in done.stdout
        assert all(w["generation"] == 3 for w in server.status()["workers"])

        shutil.copyfile(versions[3], tmp_path / "next.bpk")
        (tmp_path / "next.bpk").write_bytes(b"broken")
        os.rename(tmp_path / "next.bpk", served)
        refused = reload_command()
        assert refused.returncode == 1
        assert refused.stderr.startswith("workerpool: error: reload failed: ")
        assert server.status()["model"]["generation"] == 3


def test_publish_refuses_invalid_source_and_leaves_destination(tmp_path, versions):
    dest = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], dest)
    before = dest.read_bytes(), os.stat(dest).st_ino
    bad = tmp_path / "bad.bpk"
    bad.write_bytes(b"NRUB\x01\x00\x00\x00")
    done = cli("publish", bad, dest, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("workerpool: error: ")
    assert (dest.read_bytes(), os.stat(dest).st_ino) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.bpk", "served.bpk"]
    good = cli("publish", versions[1], dest, timeout=60)
    assert good.returncode == 0, good.stderr
    assert dest.read_bytes() == versions[1].read_bytes() and os.stat(dest).st_ino != before[1]


def test_publish_with_control_asks_the_running_model(tmp_path, versions):
    served = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], served)
    misfit = tmp_path / "misfit.bpk"
    models.generate_mlp(misfit, SIZE, width=WIDTH * 2, seed=9)
    with Server(served, workers=1) as server:
        done = cli("publish", misfit, served, "--control", server.control, timeout=60)
        assert done.returncode == 1 and "the running server refuses it" in done.stderr
        assert served.read_bytes() == versions[0].read_bytes()


def test_file_briefly_missing_does_not_stop_replacements(tmp_path, versions):
    served = tmp_path / "served.bpk"
    shutil.copyfile(versions[0], served)
    aside = tmp_path / "aside.bpk"
    with Server(served, workers=2) as server:
        os.rename(served, aside)
        server.wait_for(lambda s: "cannot stat" in server.log())
        os.rename(aside, served)  # the very same file comes back
        victim = server.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        server.wait_for(pool_ready(2, without=(victim,)))
