"""The docs say what the code, the scripts and the deployment files do, each figure in one place."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import yaml
from support import dockerfile
from support.paths import ROOT

from workerpool.units import MiB

PAGES = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]

FIGURE = r"\d+(?:\.\d+)?\s?MiB"
WORKER_COST = re.compile(
    rf"(?:added worker|adding a worker|a worker (?:costs|adds)).{{0,40}}?{FIGURE}"
    rf"|{FIGURE}.{{0,10}}?per (?:added )?worker", re.IGNORECASE)
"""What a worker costs, in MiB: "each added worker costs about 4.5 MiB", "what each added worker
costs (its USS) | 4.4 MiB", "a worker adds (4.4 MiB", "19 MiB per worker", "13.1 MiB per added
worker"; matched in text whose line breaks are spaces."""


def prose(page: Path) -> str:
    return " ".join(page.read_text().split())


def section(page: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above."""
    text = page.read_text()
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{len(level)}}} ", body, maxsplit=1)[0]


def test_what_a_worker_costs_is_quoted_once_as_the_script_measured_it():
    """4.4, 4.5 and 5.2 MiB once stood for the same thing on different pages: the figure is in
    docs/benchmarks.md alone, with the command that measured it, and the others link there."""
    quoted = [(page.relative_to(ROOT).as_posix(), match.group(0))
              for page in PAGES for match in WORKER_COST.finditer(prose(page))]
    assert len(quoted) == 1 and quoted[0][0] == "docs/benchmarks.md", quoted
    figure = float(re.search(r"[\d.]+", quoted[0][1]).group(0))
    results = json.loads((ROOT / "scripts" / "results" / "memory.json").read_text())
    fork = [run for run in results["runs"] if run["pool"] == "fork"]
    slope = np.polyfit([r["workers"] for r in fork], [r["processes"]["pss"] for r in fork], 1)[0]
    assert figure == round(slope / MiB, 1)
    assert "python3 " + " ".join(results["command"]) in prose(ROOT / "docs" / "benchmarks.md")
    assert "docs/benchmarks.md#memory" in (ROOT / "README.md").read_text()


def test_no_page_calls_the_http_port_a_metrics_port():
    """``--http`` serves KServe v2 and OpenAI embeddings too; ZeroMQ clients use ``--bind``."""
    wrong = re.compile(r"metrics port|serves only metrics|port serves metrics", re.IGNORECASE)
    texts = [*PAGES, *ROOT.glob("workerpool/**/*.py")]
    assert [path.relative_to(ROOT).as_posix() for path in texts
            if wrong.search(" ".join(path.read_text().split()))] == []


def test_operations_md_names_the_probes_pool_yaml_has():
    manifests = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "pool.yaml").read_text())
    deployment = next(d for d in manifests if d and d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    probes = {probe["httpGet"]["path"] for key, probe in container.items() if key.endswith("Probe")}
    text = section(ROOT / "docs" / "operations.md", "## Containers and Kubernetes")
    about_pool = text.split("`pool.yaml`", 1)[1].split("`scale-out.yaml`", 1)[0]
    assert set(re.findall(r"`(/[\w/]+)`", about_pool)) == probes


def test_operations_md_names_the_extras_and_the_health_check_of_the_image():
    text = section(ROOT / "docs" / "operations.md", "## Containers and Kubernetes")
    assert f"`EXTRAS` (default `{dockerfile.arguments()['EXTRAS']}`" in text
    assert "--build-arg EXTRAS=" in text
    assert f"`{' '.join(dockerfile.healthcheck()[:3])}`" in text


def test_operations_md_gives_the_load_balancer_files_the_tests_run_as_they_are():
    text = (ROOT / "docs" / "operations.md").read_text()
    for language, path in [("nginx", "deploy/nginx/workerpool.conf"), ("haproxy", "deploy/haproxy/workerpool.cfg")]:
        assert f"```{language}\n{(ROOT / path).read_text()}```" in text, path
