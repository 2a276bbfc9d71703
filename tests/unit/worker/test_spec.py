"""``WorkerSpec`` as data (the fork path) and as a command line (the spawn path): what a spec
holds survives either, and what is no spec is refused with the reason."""

from __future__ import annotations

import json

import pytest

from workerpool.worker.spec import (
    MAX_MODELS,
    MAX_NUMBERS,
    MAX_TEXT,
    InvalidSpec,
    ModelSpec,
    WorkerSpec,
)

ONE = [ModelSpec(name="m", path="/m.bpk")]
SPECS = [
    WorkerSpec(models=ONE, backend="ipc:///tmp/b"),
    WorkerSpec(models=[ModelSpec(name="embed", path="/weights dir/m.bpk", factory="pkg.mod:factory",
                                 generation=7, expect=[1, 2, 3, 4], source="/proc/1/fd/3", max_batch=8),
                       ModelSpec(name="rerank", path="/r.bpk")],
               backend="tcp://10.0.0.1:5556", load="copy", heartbeat=0.25, liveness=3,
               log_level="debug", remote=True, ready_fd=9, curve_key="/k/me.key_secret",
               curve_server_key="/k/server.key", max_memory=1 << 30, parent=12, threads=2,
               cache_dir="/var/cache/wp"),
]
MODEL = ONE[0].to_data()


@pytest.mark.parametrize("spec", SPECS)
def test_a_spec_survives_json_as_data(spec):
    assert WorkerSpec.from_data(json.loads(json.dumps(spec.to_data()))) == spec


@pytest.mark.parametrize("spec", SPECS)
def test_a_spec_survives_the_command_line(spec):
    assert WorkerSpec.from_argv(spec.to_argv()) == spec


def test_a_whole_number_is_a_float_field_value():
    assert WorkerSpec.from_data({"models": [MODEL], "backend": "ipc:///b", "heartbeat": 2}).heartbeat == 2


@pytest.mark.parametrize(("change", "reason"), [
    ({"models": [{**MODEL, "generation": "7"}]}, "generation: str where int belongs"),
    ({"models": [{**MODEL, "generation": True}]}, "generation: bool where int belongs"),
    ({"remote": 1}, "remote: int where bool belongs"),
    ({"heartbeat": "1"}, "heartbeat: str where float belongs"),
    ({"backend": 5}, "backend: int where str belongs"),
    ({"link_fd": 3}, "a worker reaches its router through --backend or --link-fd, not both"),
    ({"link_fd": -1}, "link_fd: -1 is not a number from 0 up"),
    ({"models": [{**MODEL, "path": "/" * (MAX_TEXT + 1)}]}, f"path: {MAX_TEXT + 1} characters, more than {MAX_TEXT}"),
    ({"models": [{**MODEL, "expect": [1, "2"]}]}, "expect: not a list of at most"),
    ({"models": [{**MODEL, "expect": list(range(MAX_NUMBERS + 1))}]}, "expect: not a list of at most"),
    ({"models": [{**MODEL, "expect": {"0": 1}}]}, "expect: dict where list[int] belongs"),
    ({"models": [{**MODEL, "name": "a/b"}]}, "name: 'a/b' cannot name a model"),
    ({"models": [MODEL, MODEL]}, "models: two are named alike"),
    ({"models": []}, f"models: not a list of 1 to {MAX_MODELS} models"),
    ({"models": {"m": MODEL}}, "models: dict where a list belongs"),
    ({"models": [{**MODEL, "size": 1}]}, "unknown fields ['size']"),
    ({"load": "borrow"}, "load: 'borrow' is not one of"),
    ({"curve_key": "/k/me.key_secret"}, "--curve-key and --curve-server-key go together"),
    ({"size": 1}, "unknown fields ['size']"),
    ({"heartbeat": float("nan")}, "heartbeat: nan is not a number from 0.001 up"),
    ({"heartbeat": -1}, "heartbeat: -1 is not a number from 0.001 up"),
    ({"liveness": 0}, "liveness: 0 is not a number from 1 up"),
    ({"threads": -3}, "threads: -3 is not a number from 1 up"),
    ({"models": [{**MODEL, "generation": 0}]}, "generation: 0 is not a number from 1 up"),
    ({"log_level": "bogus"}, "log_level: 'bogus' is not one of debug, info, warning, error"),
    ({"models": [{**MODEL, "source": "/proc/self/fd/3\0x"}]}, "source: holds a NUL character"),
], ids=lambda value: str(value)[:40])
def test_data_that_breaks_the_spec_is_refused_with_the_reason(change, reason):
    data = {**SPECS[0].to_data(), **change}
    with pytest.raises(InvalidSpec, match="^" + reason.replace("[", r"\[").replace("]", r"\]")):
        WorkerSpec.from_data(data)


@pytest.mark.parametrize("data", [None, [], "spec", 7])
def test_a_spec_is_a_json_object(data):
    with pytest.raises(InvalidSpec, match="a worker spec is a JSON object"):
        WorkerSpec.from_data(data)


def test_a_required_field_missing_from_data_is_named():
    with pytest.raises(InvalidSpec, match=r"missing fields \['models'\]"):
        WorkerSpec.from_data({"backend": "ipc:///b"})


def test_a_spec_made_in_python_is_checked_too():
    with pytest.raises(InvalidSpec, match="load"):
        WorkerSpec(models=ONE, backend="ipc:///b", load="borrow")


MODELS = json.dumps([MODEL])


@pytest.mark.parametrize("argv", [
    ["--models", MODELS, "--backend", "ipc:///b", "--load", "borrow"],
    ["--models", MODELS, "--backend", "tcp://h:1", "--curve-key", "/k/me.key_secret"],
    ["--models", json.dumps([{**MODEL, "path": "/" * (MAX_TEXT + 1)}]), "--backend", "ipc:///b"],
    ["--models", "[", "--backend", "ipc:///b"],
    ["--models", "{}", "--backend", "ipc:///b"],
    ["--backend", "ipc:///b"],
])
def test_a_command_line_that_breaks_the_spec_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        WorkerSpec.from_argv(argv)
    assert exit.value.code == 2 and "workerpool-worker: error:" in capsys.readouterr().err
