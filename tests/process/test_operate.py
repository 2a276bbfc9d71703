"""Operating a pool: the HTTP endpoint, probes, systemd notifications, configuration, JSON logs.

Real servers, a real HTTP client (urllib), Prometheus' own parser, a real Unix datagram socket
standing in for systemd.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import dockerfile
from support.commands import cli
from support.manifests import documents, every_document, serve_accepts, the, validated
from support.models import SLOW
from support.paths import ROOT
from support.processes import slow_request
from support.server import Server
from support.sockets import free_backend, free_port
from support.status import pool_ready

import workerpool
from workerpool.weights.publish import publish


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """Every sample of ``/metrics``, by name, then by its labels."""
    status, text = get(url + "/metrics")
    assert status == 200
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def http_server(model: str, *args: str, workers: int = 2) -> Server:
    return Server(model, "--http", f"127.0.0.1:{free_port()}", *args, workers=workers)


def test_metrics_move_with_traffic_and_memory_matches_status(small_model, local_model):
    with http_server(small_model) as server, workerpool.Client(server.endpoint) as client:
        url = server.status(memory=False)["http"]
        width = local_model.input_shape[1]
        for _ in range(5):
            client.infer(np.ones((1, width), np.float32))
        with pytest.raises(workerpool.BadRequest):
            client.infer(np.ones((1, width + 1), np.float32))
        samples = scrape(url)
        status = server.status()
    model = (("model", "small"),)
    zmq = (("route", "zmq"),)
    assert samples["workerpool_requests_total"][(("code", "ok"), *model, *zmq)] == 5
    assert samples["workerpool_requests_total"][(("code", "bad_request"), *model, *zmq)] == 1
    assert samples["workerpool_request_duration_seconds_count"][(*model, *zmq)] == 6
    assert samples["workerpool_texts_total"][model] == 0  # a model of arrays
    assert samples["workerpool_run_seconds_count"][model] == 6
    assert samples["workerpool_queue_wait_seconds_count"][model] == 6
    assert samples["workerpool_workers"][(("state", "ready"),)] == 2
    assert samples["workerpool_generation"][model] == 1
    assert samples["workerpool_batch_rows_count"][model] == 5  # the bad request ran no rows
    assert samples["workerpool_queue_depth"][model] == 0 and samples["workerpool_in_flight"][model] == 0
    scraped = samples["workerpool_memory_bytes"][(("kind", "workers_pss"),)]
    assert abs(scraped - status["totals"]["workers_pss"]) <= 0.1 * status["totals"]["workers_pss"]
    assert len({labels for labels in samples["workerpool_worker_memory_bytes"]}) == 2 * 3


def test_request_seconds_count_every_request_held_waiting_or_running(small_model):
    """The autoscaling counter: one worker, three requests of 0.6 s sent at once, so one runs
    while two wait: 0.6 + 1.2 + 1.8 = 3.6 request-seconds (a gauge scraped now and then would
    see 0 or 3 depending on when), less what the requests' arrivals were spread over; mid-run,
    a scrape counts the stretch not yet ended."""
    with http_server(small_model, *SLOW, workers=1) as server:
        url = server.status(memory=False)["http"]
        assert scrape(url)["workerpool_request_seconds_total"][()] == 0
        requests = [slow_request(server.endpoint, 0.6) for _ in range(3)]
        server.wait_for(lambda s: s["queue"]["in_flight"] + s["queue"]["depth"] == 3)
        early = scrape(url)["workerpool_request_seconds_total"][()]
        time.sleep(0.2)  # a span of time is what is measured
        assert scrape(url)["workerpool_request_seconds_total"][()] - early >= 3 * 0.2
        for request in requests:
            request.join(20)
        held = scrape(url)["workerpool_request_seconds_total"][()]
    assert 3.6 - 0.1 <= held < 3.6 + 0.5


def test_the_autoscalers_metric_is_one_the_pool_exports_and_every_metric_is_documented(small_model):
    """The Prometheus adapter's rule and KEDA's query name a series a live pool serves, and
    docs/operations.md's table names every family ``/metrics`` has."""
    adapter = yaml.safe_load(the(documents("prometheus-adapter.yaml"), "ConfigMap")["data"]["config.yaml"])
    keda = the(documents("keda.yaml"), "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    read = {re.match(r"(\w+)\{", rule["seriesQuery"]).group(1) for rule in adapter["rules"]}
    read |= set(re.findall(r"rate\((\w+)\{", keda))
    with http_server(small_model, workers=1) as server:
        status, text = get(server.status(memory=False)["http"] + "/metrics")
    assert status == 200
    families = {family.name: family for family in text_string_to_metric_families(text)}
    served = {sample.name for family in families.values() for sample in family.samples}
    assert read == {"workerpool_request_seconds_total"} and read <= served
    operations = (ROOT / "docs" / "operations.md").read_text()
    table = operations.split("\n## Health, readiness and metrics\n", 1)[1].split("\n## ", 1)[0]
    documented = {name.removesuffix("_total"): set(labels.split(",")) - {""}
                  for name, labels in re.findall(r"`(workerpool_\w+)(?:\{([\w,]*)\})?`", table)}
    assert set(families) == set(documented)
    for name, family in families.items():  # the labels each sample has are those the table lists
        assert {label for sample in family.samples for label in sample.labels} - {"le"} <= documented[name], name


def test_readyz_follows_the_pool_and_status_ready_says_the_same(small_model):
    backend = free_backend()
    with http_server(small_model, "--backend", backend, *SLOW, workers=0) as server:
        url = server.status(memory=False)["http"]
        assert get(url + "/healthz") == (200, "ok\n")
        status, reason = get(url + "/readyz")
        assert status == 503 and "no worker is ready yet (0 starting)" in reason
        probe = cli("status", "--ready", "--control", server.control)
        assert probe.returncode == 1 and "not ready: no worker is ready" in probe.stderr
        server.signal(signal.SIGTTIN)
        server.wait_for(pool_ready(1))
        assert get(url + "/readyz") == (200, "ready\n")
        assert cli("status", "--ready", "--control", server.control).returncode == 0
        slow = slow_request(server.endpoint, 3.0)
        server.wait_for(lambda s: s["queue"]["in_flight"] == 1)
        server.signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (answer := get(url + "/readyz"))[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answer == (503, "the server is shutting down\n")
        assert get(url + "/healthz")[0] == 200  # draining is alive
        assert slow.join(20).outputs[0, 0] == -6.0  # the held request still finished
    assert get_fails(url)


def get_fails(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/healthz", timeout=2)
    except OSError:
        return True
    return False


def test_status_without_a_server_answers_at_once(tmp_path):
    began = time.monotonic()
    done = cli("status", "--control", f"ipc://{tmp_path}/none.sock")
    assert done.returncode == 1 and "does not exist" in done.stderr
    assert time.monotonic() - began < 10  # a second or so: the interpreter's start, no wait


def test_systemd_hears_ready_reloading_stopping_and_the_watchdog(tmp_path, monkeypatch, small_model):
    address = str(tmp_path / "notify")
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(address)
    manager.settimeout(30)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    served = tmp_path / "served.bpk"
    publish(small_model, served)
    heard: list[dict[str, str]] = []

    def hear(key: str) -> dict[str, str]:
        while True:
            fields = dict(line.split("=", 1) for line in manager.recv(4096).decode().splitlines())
            heard.append(fields)
            if key in fields:
                return fields

    try:
        with Server(served, workers=1) as server:
            ready = hear("READY")
            assert ready["MAINPID"] == str(server.proc.pid) and "serving mlp" in ready["STATUS"]
            hear("WATCHDOG")
            from workerpool import models
            models.generate_mlp(tmp_path / "v2.bpk", 1024 * 1024, seed=9)
            publish(tmp_path / "v2.bpk", served)
            assert "generation 2" in hear("RELOADING")["STATUS"]
            assert "generation 2" in hear("READY")["STATUS"]
            models.generate_mlp(tmp_path / "misfit.bpk", 1024 * 1024, width=512, seed=3)
            publish(tmp_path / "misfit.bpk", served)  # checked alone, as publish --no-check does
            assert "degraded: new weights refused" in hear("STATUS")["STATUS"]
            server.signal(signal.SIGTERM)
            assert "draining" in hear("STOPPING")["STATUS"]
    finally:
        manager.close()
    worker_pids = {f.get("MAINPID") for f in heard} - {None}
    assert worker_pids == {str(server.proc.pid)}  # only the supervisor ever speaks


def test_config_file_environment_and_command_line_in_that_order(tmp_path, small_model, monkeypatch):
    (tmp_path / "pool.toml").write_text('workers = 3\nmax-batch = 7\nmax_queue = 9\nno-watch = true\n')
    monkeypatch.setenv("WORKERPOOL_MAX_BATCH", "5")
    monkeypatch.setenv("WORKERPOOL_MAX_QUEUE", "11")
    monkeypatch.setenv("WORKERPOOL_CONTROL", "")  # empty: unset, as shells mean it
    done = cli("serve", small_model, "--config", tmp_path / "pool.toml", "--max-queue", "13",
               "--print-config")
    assert done.returncode == 0, done.stderr
    effective = dict(line.split(" = ", 1) for line in done.stdout.splitlines() if " = " in line)
    assert (effective["workers"], effective["max-batch"], effective["max-queue"]) == ("3", "5", "13")
    assert effective["no-watch"] == "true" and effective["batch-wait"] == "0.0"  # as the docs write keys
    assert "# control: not set" in done.stdout
    (tmp_path / "again.toml").write_text(done.stdout)  # the printed file reads back
    monkeypatch.delenv("WORKERPOOL_MAX_BATCH")
    monkeypatch.delenv("WORKERPOOL_MAX_QUEUE")
    again = cli("serve", small_model, "--config", tmp_path / "again.toml", "--print-config")
    assert again.returncode == 0 and again.stdout == done.stdout


def test_settings_given_for_one_model_alone_print_as_a_file_that_reads_back(tmp_path, small_model):
    done = cli("serve", f"a={small_model}", f"b={small_model}", "--model", "b=mlp", "--max-batch", "b=4",
               "--print-config")
    assert done.returncode == 0, done.stderr
    assert 'model = ["b=mlp"]' in done.stdout and 'max-batch = [32, "b=4"]' in done.stdout
    (tmp_path / "again.toml").write_text(done.stdout)
    again = cli("serve", "--config", tmp_path / "again.toml", "--print-config")
    assert again.returncode == 0 and again.stdout == done.stdout, again.stderr


def test_json_logs_are_one_object_per_line(small_model):
    with Server(small_model, "--log-format", "json", workers=1) as server, \
            workerpool.Client(server.endpoint) as client:
        client.info()
    lines = [line for line in server.log().splitlines() if line.startswith("{")]
    entries = [json.loads(line) for line in lines]
    assert entries and all({"time", "level", "logger", "message", "pid"} <= set(e) for e in entries)
    assert any(e.get("worker") and e["logger"] == "workerpool.router.core" for e in entries)
    assert {e["pid"] for e in entries} - {server.proc.pid}  # the workers log as JSON too
    assert not any("lost" in e["message"] for e in entries)  # a normal stop is no loss


def test_deployment_examples_are_valid_kubernetes_and_use_whatserve_accepts():
    deploy = ROOT / "deploy"
    documents = every_document()
    for found in documents.values():
        for document in found:
            validated(document)
    deployment = next(d for d in documents["pool.yaml"] if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    parsed = serve_accepts(container["args"])
    assert spec["terminationGracePeriodSeconds"] > parsed.graceful_timeout
    http_port = int(dockerfile.environment()["WORKERPOOL_HTTP"].rpartition(":")[2])
    assert {"name": "http", "containerPort": http_port} in container["ports"]
    runtime = next(d for d in documents["kserve.yaml"] if d["kind"] == "ServingRuntime")
    assert runtime["spec"]["protocolVersions"] == ["v2"]
    served = runtime["spec"]["containers"][0]
    parsed = serve_accepts(served["args"])
    port = int(parsed.http.rpartition(":")[2])
    assert served["ports"] == [{"containerPort": port, "protocol": "TCP"}]
    assert served["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": port}
    service = next(d for d in documents["kserve.yaml"] if d["kind"] == "InferenceService")
    model = service["spec"]["predictor"]["model"]
    assert (model["runtime"], model["protocolVersion"]) == (runtime["metadata"]["name"], "v2")
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    unit = (deploy / "workerpool.service").read_text()
    assert "Type=notify" in unit and "ExecReload=/bin/kill -HUP $MAINPID" in unit
    readme_installs = re.findall(r"python3 -m pip install '\.\[([\w,]+)\]'", (ROOT / "README.md").read_text())
    readme_extras = {extra for extras in readme_installs for extra in extras.split(",")} - {"test"}
    assert readme_extras == dockerfile.extras()  # the image serves what the README serves


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed here (no systemd on this machine)")
def test_the_unit_file_passes_systemd_analyze(tmp_path):
    unit = tmp_path / "workerpool.service"
    unit.write_text((ROOT / "deploy" / "workerpool.service").read_text().replace(
        "/opt/workerpool/bin/workerpool", shutil.which("true") or "/bin/true"))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], check=False, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_the_readmes_config_example_is_accepted(tmp_path, small_model):
    """The README's TOML example, and every one in docs/configuration.md, is a valid ``--config``."""
    readme = (ROOT / "README.md").read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    docs = (ROOT / "docs" / "configuration.md").read_text().split("```toml\n")[1:]
    assert docs, "docs/configuration.md shows a --config example"
    printed = []
    for example in [readme, *(block.split("```", 1)[0] for block in docs)]:
        (tmp_path / "serve.toml").write_text(example)
        done = cli("serve", small_model, "--config", tmp_path / "serve.toml", "--print-config")
        assert done.returncode == 0, done.stderr
        printed.append(done.stdout)
    assert 'http = "127.0.0.1:8002"' in printed[0] and "max-batch = 16" in printed[0]


def test_workers_take_connect_from_the_environment_too(small_model, monkeypatch):
    missing = cli("workers", small_model)
    assert missing.returncode == 2 and "workers needs --connect" in missing.stderr
    monkeypatch.setenv("WORKERPOOL_CONNECT", "tcp://127.0.0.1:5556")
    done = cli("workers", small_model, "--print-config")
    assert done.returncode == 0 and 'connect = "tcp://127.0.0.1:5556"' in done.stdout
