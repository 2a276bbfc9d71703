"""The systemd files in deploy/, run by the tools that use them: ``workerpool serve`` reads the
example config with the unit's own arguments and environment, systemd-sysusers and
systemd-tmpfiles make the user and the directories the unit needs (in a scratch root)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib

import pytest
from support.commands import cli
from support.paths import ROOT

DEPLOY = ROOT / "deploy"
UNIT = (DEPLOY / "workerpool.service").read_text()


def setting(key: str) -> list[str]:
    """Every value of ``key`` in the unit."""
    return re.findall(rf"^{key}=(.*)$", UNIT, re.MULTILINE)


def test_serve_takes_the_example_config_with_the_units_arguments():
    """An unknown key or a bad value in serve.toml would stop the service at its start: serve
    reads it as the unit runs it, and its values are the ones in effect but for what the unit's
    command line and environment set."""
    _, *arguments = shlex.split(setting("ExecStart")[0])  # the program: a venv's, not here
    arguments[arguments.index("--config") + 1] = str(DEPLOY / "serve.toml")
    environment = dict(word.split("=", 1)
                       for value in setting("Environment") for word in shlex.split(value))
    done = cli(*arguments, "--print-config", env=environment)
    assert done.returncode == 0, done.stderr
    printed = tomllib.loads(done.stdout)  # keys spelt with dashes or underscores: the same
    effective = {key.replace("_", "-"): value for key, value in printed.items()}
    example = tomllib.loads((DEPLOY / "serve.toml").read_text())
    assert {"workers", "control", "graceful-timeout"} <= example.keys()
    assert {key: effective[key.replace("_", "-")] for key in example} == example
    assert (effective["http"], effective["log-format"]) == ("127.0.0.1:8002", "json")
    assert example["graceful-timeout"] < int(setting("TimeoutStopSec")[0])  # queued requests finish


@pytest.mark.skipif(not (shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles")),
                    reason="systemd-sysusers or systemd-tmpfiles is not installed here")
def test_systemd_makes_the_user_and_the_weights_directory_from_the_shipped_files(tmp_path):
    (tmp_path / "etc").mkdir()
    users = subprocess.run(
        ["systemd-sysusers", f"--root={tmp_path}", str(DEPLOY / "workerpool.sysusers")],
        check=False, capture_output=True, text=True)
    assert users.returncode == 0, users.stderr
    passwd = [line.split(":") for line in (tmp_path / "etc" / "passwd").read_text().splitlines()]
    groups = [line.split(":")[0] for line in (tmp_path / "etc" / "group").read_text().splitlines()]
    assert setting("User")[0] in [fields[0] for fields in passwd] and setting("Group")[0] in groups
    directories = subprocess.run(
        ["systemd-tmpfiles", "--create", f"--root={tmp_path}", str(DEPLOY / "workerpool.tmpfiles")],
        check=False, capture_output=True, text=True)
    # Only root may give what it makes to root; other users get the directory all the same.
    refused_chown = os.geteuid() != 0 and "fchownat" in directories.stderr
    assert directories.returncode == 0 or refused_chown, directories.stderr
    paths = [path for value in setting("ReadOnlyPaths") for path in value.split()]
    assert paths and all((tmp_path / path.lstrip("/")).is_dir() for path in paths)
