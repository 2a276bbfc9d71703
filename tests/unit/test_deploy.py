"""The files in deploy/ run as shipped: what the systemd unit needs is made by systemd, by a file
shipped beside it or by a documented install step, and what a manifest's comment tells an
operator to do, its mounts allow."""

from __future__ import annotations

import re
import shlex
import tomllib

import yaml
from support.paths import ROOT

DEPLOY = ROOT / "deploy"
SYSTEMD_DIRECTORIES = {"RuntimeDirectory": "/run", "StateDirectory": "/var/lib",
                       "CacheDirectory": "/var/cache", "LogsDirectory": "/var/log",
                       "ConfigurationDirectory": "/etc"}
"""The unit settings systemd makes a directory for, at each start, and where."""
BASE_SYSTEM = {"/bin/kill"}  # util-linux's: on every machine that runs systemd


def unit_settings() -> list[tuple[str, str]]:
    """The unit's ``Key=value`` lines, without comments and section headers."""
    lines = (DEPLOY / "workerpool.service").read_text().splitlines()
    return [(key, value) for key, _, value in (line.partition("=") for line in lines
                                               if "=" in line and not line.startswith("#"))]


def entries(name: str) -> list[list[str]]:
    """The lines of a sysusers.d or tmpfiles.d file, split into fields."""
    lines = (DEPLOY / name).read_text().splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.startswith("#")]


def install_steps() -> list[list[str]]:
    """Each command of the shell blocks under docs/operations.md's systemd heading."""
    text = (ROOT / "docs" / "operations.md").read_text()
    systemd = text.split("\n## systemd\n", 1)[1].split("\n## ", 1)[0]
    return [shlex.split(command) for block in re.findall(r"```sh\n(.*?)```", systemd, re.DOTALL)
            for line in block.splitlines() for command in line.split("&&") if command.strip()]


def test_the_unit_runs_as_the_user_the_sysusers_file_makes():
    """systemd refuses to start a unit whose ``User=`` or ``Group=`` does not exist."""
    settings = dict(unit_settings())
    lines = entries("workerpool.sysusers")
    users = {fields[1] for fields in lines if fields[0] == "u"}  # each with a group of its name
    groups = users | {fields[1] for fields in lines if fields[0] == "g"}
    assert settings["User"] in users and settings["Group"] in groups


def test_the_install_steps_apply_the_shipped_sysusers_and_tmpfiles_files():
    """A sysusers.d or tmpfiles.d file makes nothing until its tool reads it."""
    steps = install_steps()
    for name, tool in [("workerpool.sysusers", "systemd-sysusers"),
                       ("workerpool.tmpfiles", "systemd-tmpfiles")]:
        installed = next(step[-1] for step in steps
                         if step[0] == "install" and f"deploy/{name}" in step)
        assert any(step[0] == tool and installed in step for step in steps), name


def test_every_path_the_unit_names_is_made_by_systemd_a_shipped_file_or_an_install_step():
    """A path nothing makes stops the unit at its start (``ReadOnlyPaths=``, ``--config``, the
    program) or the server (the control socket's directory): systemd makes its own directories,
    workerpool.tmpfiles the weights directory, and the install steps in docs/operations.md the
    rest, each the last word of a command (a venv: everything under it)."""
    settings = unit_settings()
    words = [word.rpartition("=")[2] for _, value in settings for word in value.split()]
    steps = install_steps()
    config = words[words.index("--config") + 1]
    assert ["deploy/serve.toml", config] in [step[-2:] for step in steps if step[0] == "install"]
    values = tomllib.loads((DEPLOY / "serve.toml").read_text()).values()
    in_config = [value.removeprefix("ipc://") for value in values if isinstance(value, str)]
    needed = {path for path in words if path.startswith("/")}
    # serve makes its control socket, in a directory that must be there
    needed |= {path.rpartition("/")[0] for path in in_config if path.startswith("/")}
    made = {f"{SYSTEMD_DIRECTORIES[key]}/{value}"
            for key, value in settings if key in SYSTEMD_DIRECTORIES}
    made |= {fields[1] for fields in entries("workerpool.tmpfiles") if fields[0] in {"d", "D"}}
    installed = [step[-1] for step in steps if step[-1].startswith("/")]
    assert {"/srv/models", config, "/run/workerpool"} <= needed
    unmade = [path for path in sorted(needed - made - BASE_SYSTEM)
              if not any(path == done or path.startswith(done + "/") for done in installed)]
    assert unmade == []


def test_pool_yaml_publishes_new_weights_from_a_pod_that_may_write_them():
    """The pool's pod mounts the weights read-only, where ``workerpool publish`` cannot rename
    a file: the comment that says how to publish names another pod, mounting them read-write."""
    text = (DEPLOY / "kubernetes" / "pool.yaml").read_text()
    comment = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    deployment = next(d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    destination = re.search(r"workerpool publish \S+ (/\S+?)`", comment).group(1)
    mount = next(mount for mount in container["volumeMounts"]
                 if destination.startswith(mount["mountPath"] + "/"))
    assert mount["readOnly"] and container["args"][0] == destination
    assert "another pod that mounts the claim read-write" in comment
