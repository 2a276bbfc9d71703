"""The scripts' shape: entry points import the shared parts from ``benchlib``, never from each
other, and ``benchlib`` holds no entry point."""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import ROOT

SCRIPTS = ROOT / "scripts"
ENTRY_POINTS = [*SCRIPTS.glob("*.py"), *(SCRIPTS / "checks").glob("*.py")]
BENCHLIB = sorted((SCRIPTS / "benchlib").glob("*.py"))


def imported(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports (relative imports left out)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_script_imports_another():
    scripts = {path.stem for path in ENTRY_POINTS}
    wrong = {str(path.relative_to(ROOT)): sorted(imported(path) & scripts)
             for path in [*ENTRY_POINTS, *BENCHLIB] if imported(path) & scripts}
    assert wrong == {}


def test_benchlib_has_no_entry_point():
    wrong = [str(path.relative_to(ROOT)) for path in BENCHLIB
             if "__main__" in path.read_text()
             or any(isinstance(node, ast.FunctionDef) and node.name == "main"
                    for node in ast.parse(path.read_text()).body)]
    assert BENCHLIB and wrong == []
