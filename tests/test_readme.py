"""The README's copy-paste commands are the ones CI and users really run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shell_blocks(text: str) -> list[str]:
    blocks, inside, current = [], False, []
    for line in text.splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append("\n".join(current))
            inside, current = line == "```sh", []
        elif inside:
            current.append(line)
    return blocks


def test_ci_runs_exactly_the_readme_test_command():
    commands = shell_blocks((ROOT / "README.md").read_text())
    test_command = next(c for c in commands if "pytest" in c)
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


def test_readme_main_command_installs_creates_and_serves():
    commands = shell_blocks((ROOT / "README.md").read_text())
    main = commands[0]
    assert "pip install" in main and "workerpool new-model" in main and "workerpool serve" in main


def test_no_install_hint_names_the_unrelated_workerpool_package():
    """``workerpool`` on the package index is someone else's project: every hint installs the
    checkout (``.``) or the distribution ``workerpool-mmap``."""
    wrong = re.compile(r"pip install\s+(-\S+\s+)*['\"]?workerpool(?![-\w])")
    texts = [ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("scripts/*.py"),
             *ROOT.glob("workerpool/**/*.py"), *ROOT.glob("deploy/**/*")]
    found = [f"{path.relative_to(ROOT)}: {match.group(0)}" for path in texts if path.is_file()
             for match in wrong.finditer(path.read_text(errors="replace"))]
    assert found == []
    assert 'name = "workerpool-mmap"' in (ROOT / "pyproject.toml").read_text()
