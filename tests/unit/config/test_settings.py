"""The settings table is the one declaration of serve's and workers' options: the command
line, the config dataclasses, the worker's command line and the docs agree with it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from support.paths import ROOT

from workerpool.cli.main import build_parser
from workerpool.config import docs, settings, sources
from workerpool.config.pool import HostConfig, ServeConfig
from workerpool.worker.spec import ModelSpec, WorkerSpec
from workerpool.worker.spec import build_parser as worker_parser


def _command(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_the_docs_option_tables_are_the_settings_table():
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert docs.render(page) == page, "run: python3 -m workerpool.config.docs docs/configuration.md"


@pytest.mark.parametrize("command", [settings.SERVE, settings.WORKERS])
def test_each_option_of_a_pool_command_is_a_setting(command):
    actions = [a for a in _command(command)._actions if a.dest not in {"help", "command_parser"}]
    declared = settings.of_command(command)
    assert [a.dest for a in actions] == [s.name for s in declared]
    for action, setting in zip(actions, declared, strict=True):
        assert action.option_strings == ([] if setting.positional else [setting.flag])
        if setting.per_model:  # VALUE and NAME=VALUE as given, read by config.models
            assert action.default == [], setting.name
        elif setting.default_factory is None:
            assert action.default == (False if setting.switch else setting.default), setting.name


@pytest.mark.parametrize("command", [settings.SERVE, settings.WORKERS])
def test_a_file_and_the_environment_know_the_keys_of_the_settings(command):
    keys = sources.options_of(_command(command))
    assert set(keys) == {s.name for s in settings.of_command(command) if s.from_files and not s.positional}


@pytest.mark.parametrize(("kind", "required"), [
    (ServeConfig, {"models": [], "workers": 1}),
    (HostConfig, {"models": [], "workers": 1, "connect": "tcp://h:1"}),
])
def test_the_config_defaults_are_the_settings_defaults(kind, required):
    config = kind(**required)
    declared = {s.name: s for s in settings.SETTINGS}
    for field in dataclasses.fields(kind):
        if field.name in declared and field.name not in required:
            assert getattr(config, field.name) == declared[field.name].initial(), field.name


def test_the_workers_command_line_is_the_worker_spec():
    options = {a.dest for a in worker_parser()._actions} - {"help"}
    assert options == {f.name for f in dataclasses.fields(WorkerSpec)}
    spec = WorkerSpec(models=[ModelSpec(name="m", path="/m.bpk")], backend="ipc:///b", max_memory=1 << 20,
                      parent=7, threads=2)
    assert WorkerSpec.from_argv(spec.to_argv()) == spec
