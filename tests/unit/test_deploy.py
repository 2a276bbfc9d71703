"""The files in deploy/ run as shipped: what the systemd unit needs is made by systemd, by a file
shipped beside it or by a documented install step, what a manifest's comment tells an operator
to do, its mounts allow, and the Kubernetes manifests fit together and with the server: the
replicas' probes, ports, drain and selectors, and the autoscalers' target and metric."""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from typing import Any

import jsonschema
import pytest
import yaml
from support import dockerfile
from support.manifests import (
    CRD_SCHEMAS,
    CRDS,
    crd_schema,
    documents,
    every_document,
    serve_accepts,
    the,
    validated,
)
from support.paths import ROOT

from workerpool.cli.main import build_parser
from workerpool.config.sources import unknown_variables
from workerpool.gateway.routes import ROUTES

DEPLOY = ROOT / "deploy"
SYSTEMD_DIRECTORIES = {"RuntimeDirectory": "/run", "StateDirectory": "/var/lib",
                       "CacheDirectory": "/var/cache", "LogsDirectory": "/var/log",
                       "ConfigurationDirectory": "/etc"}
"""The unit settings systemd makes a directory for, at each start, and where."""
BASE_SYSTEM = {"/bin/kill"}  # util-linux's: on every machine that runs systemd
METRIC = "workerpool_request_seconds_total"  # what the autoscalers read: its rate is requests held
HEADROOM = 0.75  # the share of a pool's workers the autoscalers aim to keep busy
ADAPTER_RULE_KEYS = {"seriesQuery", "seriesFilters", "resources", "name", "metricsQuery"}
"""The keys of a Prometheus adapter rule: it would ignore any other, a typo say."""


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


def listening_port(address: str) -> int:
    """The port of a ``HOST:PORT`` the server listens on, which other pods can reach."""
    host, _, port = address.rpartition(":")
    assert host in {"0.0.0.0", "[::]"}, address
    return int(port)


def dockerfile_http() -> str:
    """The HTTP address the image serves on unless told otherwise."""
    return dockerfile.environment()["WORKERPOOL_HTTP"]


def answered(path: str) -> bool:
    """The server answers ``GET path`` on its HTTP port."""
    return any(pattern.match(path) and method == "GET" for pattern, method, _ in ROUTES)


def pre_stop_seconds(hook: dict[str, Any]) -> int:
    """How long a preStop hook waits: the native sleep, or ``sleep N`` run in the container."""
    if "sleep" in hook:
        return hook["sleep"]["seconds"]
    command = hook["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2
    return int(command[1])


def replicas() -> tuple[dict[str, Any], dict[str, Any]]:
    """replicas.yaml's Deployment and its one container."""
    deployment = the(documents("replicas.yaml"), "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_every_container_of_the_image_takes_its_arguments_and_its_environment():
    """Each container of the image runs, with the image's ``ENV`` and its own, a command that
    parses its arguments and names no variable it ignores: the image's defaults are ``serve``'s,
    so the worker hosts (``workers``) unset those it has no option for."""
    image = dockerfile.entrypoint()
    pods = {"Deployment": lambda d: d["spec"]["template"]["spec"], "ServingRuntime": lambda d: d["spec"]}
    containers = [(name, container) for name, found in every_document().items() for document in found
                  if document["kind"] in pods for container in pods[document["kind"]](document)["containers"]]
    assert len(containers) == 5  # kserve, pool, replicas, and the router and hosts of scale-out
    for name, container in containers:
        assert container["image"] == "workerpool:latest", name
        command = container.get("command", image)
        assert command[0] == "workerpool", name
        parsed = build_parser().parse_args([*command[1:], *(a.replace("{{.Name}}", "model") for a in container["args"])])
        environ = dockerfile.environment() | {v["name"]: v["value"] for v in container.get("env", [])}
        assert unknown_variables(parsed.command_parser, environ) == [], (name, container["name"])


def test_replicas_yaml_runs_whole_pools_that_drain_before_they_are_killed():
    """Each pod a pool the CLI accepts, on the image's HTTP port, probed on routes the server
    answers; ready or not within a second or two; and killed only after the preStop wait (the
    load balancers drop the pod meanwhile) and ``--graceful-timeout`` (the pool drains)."""
    deployment, container = replicas()
    template = deployment["spec"]["template"]
    parsed = serve_accepts(container["args"])
    port = listening_port(parsed.http or dockerfile_http())
    assert {"name": "http", "containerPort": port} in container["ports"]
    scrape = template["metadata"]["annotations"]
    assert scrape["prometheus.io/port"] == str(port) and scrape["prometheus.io/path"] == "/metrics"
    probes = {key: probe for key, probe in container.items() if key.endswith("Probe")}
    assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}
    for probe in probes.values():
        assert probe["httpGet"]["port"] == "http" and answered(probe["httpGet"]["path"]), probe
    ready = probes["readinessProbe"]
    assert ready["httpGet"]["path"] in {"/v2/health/ready", "/readyz"}
    assert ready["periodSeconds"] <= 2 and ready["failureThreshold"] == 1
    [pool] = the(documents("pool.yaml"), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {key: probes[key] for key in ("startupProbe", "livenessProbe")} == \
        {key: pool[key] for key in ("startupProbe", "livenessProbe")}
    wait = pre_stop_seconds(container["lifecycle"]["preStop"])
    assert wait > 0
    assert template["spec"]["terminationGracePeriodSeconds"] > wait + parsed.graceful_timeout
    assert "replicas" not in deployment["spec"]  # the autoscaler's to set, not each apply's
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_replicas_yaml_selects_its_pods_for_the_service_and_the_disruption_budget():
    found = documents("replicas.yaml")
    deployment, container = replicas()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service, budget = the(found, "Service"), the(found, "PodDisruptionBudget")
    for selector in [deployment["spec"]["selector"]["matchLabels"], service["spec"]["selector"],
                     budget["spec"]["selector"]["matchLabels"]]:
        assert selector and selector.items() <= labels.items()
    named = {port["name"] for port in container["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= named
    # a voluntary eviction leaves a replica serving, even at the autoscaler's fewest
    assert budget["spec"]["maxUnavailable"] < the(found, "HorizontalPodAutoscaler")["spec"]["minReplicas"]


def test_the_horizontal_pod_autoscaler_scales_the_replicas_on_the_adapters_rule():
    """The HPA targets the Deployment, on the Pods metric the adapter's rule makes from the
    pool's counter, aiming at ``HEADROOM`` of the workers busy, slow to scale down."""
    found = documents("replicas.yaml")
    deployment, container = replicas()
    scaler = the(found, "HorizontalPodAutoscaler")["spec"]
    assert scaler["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": deployment["metadata"]["name"]}
    [metric] = scaler["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    workers = serve_accepts(container["args"]).workers
    assert float(metric["pods"]["target"]["averageValue"]) == HEADROOM * workers
    scale_down = scaler["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] >= 60
    assert scale_down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]  # not all at once
    config = yaml.safe_load(the(documents("prometheus-adapter.yaml"), "ConfigMap")["data"]["config.yaml"])
    name = metric["pods"]["metric"]["name"]
    [rule] = [rule for rule in config["rules"] if rule["name"]["as"] == name]
    assert set(rule) <= ADAPTER_RULE_KEYS
    assert rule["seriesQuery"] == METRIC + '{namespace!="",pod!=""}'
    assert re.fullmatch(rule["name"]["matches"], METRIC)
    overrides = rule["resources"]["overrides"]
    assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert rule["metricsQuery"] == "sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)"


def test_kedas_scaled_object_scales_the_replicas_as_the_horizontal_pod_autoscaler_does():
    """Same target, bounds, threshold and scale-down window; its query sums the counter's rate
    over the Deployment's pods only (a pod is named DEPLOYMENT-HASH-SUFFIX), in its namespace."""
    deployment, _ = replicas()
    name = deployment["metadata"]["name"]
    hpa = the(documents("replicas.yaml"), "HorizontalPodAutoscaler")["spec"]
    scaled = the(documents("keda.yaml"), "ScaledObject")
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert target["name"] == name and target.get("kind", "Deployment") == "Deployment"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"] == hpa["behavior"]["scaleDown"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    query = re.fullmatch(r"sum\(rate\((\w+)\{(.*)\}\[2m\]\)\)", trigger["metadata"]["query"])
    assert query and query.group(1) == METRIC
    labels = dict(re.findall(r'(\w+=~?)"([^"]*)"', query.group(2)))
    assert labels.keys() == {"namespace=", "pod=~"}
    assert labels["namespace="] == scaled["metadata"].get("namespace", "default")
    assert re.fullmatch(labels["pod=~"], f"{name}-7c9d5b8f6d-x2k4q")
    others = [d["metadata"]["name"] for found in every_document().values() for d in found
              if d["kind"] == "Deployment" and d["metadata"]["name"] != name]
    assert others and not any(re.fullmatch(labels["pod=~"], f"{other}-7c9d5b8f6d-x2k4q") for other in others)
    assert trigger["metadata"]["threshold"] == hpa["metrics"][0]["pods"]["target"]["averageValue"]


def test_kserve_scales_the_inference_service_on_concurrency_at_the_same_headroom():
    found = documents("kserve.yaml")
    [runtime] = the(found, "ServingRuntime")["spec"]["containers"]
    predictor = the(found, "InferenceService")["spec"]["predictor"]
    assert predictor["scaleMetric"] == "concurrency"  # queue-proxy's count of requests held
    assert predictor["scaleTarget"] == HEADROOM * serve_accepts(runtime["args"]).workers
    # Knative aims at a share of scaleTarget (70% unless told): all of it, so the target holds
    annotations = the(found, "InferenceService")["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/target-utilization-percentage"] == "100"
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]


@pytest.mark.parametrize(("kind", "where", "field", "typo"), [
    ("ScaledObject", ["spec"], "cooldownPeriod", "cooldownPeroid"),
    ("InferenceService", ["spec", "predictor"], "minReplicas", "minReplica"),
    ("ServingRuntime", ["spec", "containers", 0, "readinessProbe", "httpGet"], "path", "paht"),
])
def test_a_custom_resource_with_a_misspelt_field_is_refused(kind, where, field, typo):
    """The API server would prune the misspelt field and apply the rest; the check refuses it,
    where the CRD's schema alone (no ``additionalProperties: false``) lets it through."""
    document = next(d for found in every_document().values() for d in found if d["kind"] == kind)
    validated(document)
    broken = copy.deepcopy(document)
    place = broken
    for step in where:
        place = place[step]
    place[typo] = place.pop(field)
    assert jsonschema.Draft202012Validator(crd_schema(document["apiVersion"], kind)).is_valid(broken)
    with pytest.raises(jsonschema.ValidationError, match=typo):
        validated(broken)


def test_every_vendored_crd_schema_is_used_and_says_where_it_comes_from():
    files = sorted(path.name for path in CRDS.glob("*.json"))
    assert files == sorted(CRD_SCHEMAS.values())
    readme = (CRDS / "README.md").read_text()
    assert all(name in readme for name in files) and "Apache License 2.0" in readme
    used = {(d["apiVersion"], d["kind"]) for found in every_document().values() for d in found}
    assert set(CRD_SCHEMAS) <= used
