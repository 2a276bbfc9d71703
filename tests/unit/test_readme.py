"""The README's copy-paste commands are the ones CI and users really run."""

from __future__ import annotations

import re

from support.paths import ROOT


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


VENV = "python3 -m venv .venv && . .venv/bin/activate && "


def test_the_readme_commands_for_a_fresh_machine_start_by_making_a_venv():
    """Debian's and Ubuntu's system Python refuse ``pip install`` (externally-managed-environment):
    every README line that installs and then runs something, the main command and the test
    command among them, makes and activates a venv first."""
    commands = shell_blocks((ROOT / "README.md").read_text())
    fresh = [line for command in commands for line in command.splitlines()
             if "pip install" in line and "&&" in line]
    test_command = next(c for c in commands if "pytest" in c)
    assert commands[0] in fresh and test_command in fresh
    assert [line for line in fresh if not line.startswith(VENV)] == []


def test_no_install_hint_names_the_unrelated_workerpool_package():
    """``workerpool`` on the package index is someone else's project: every hint installs the
    checkout (``.``) or the distribution ``workerpool-mmap``."""
    wrong = re.compile(r"pip install\s+(-\S+\s+)*['\"]?workerpool(?![-\w])")
    texts = [ROOT / "README.md", ROOT / "CHANGELOG.md", *ROOT.glob("docs/**/*.md"),
             *ROOT.glob("scripts/**/*.py"),
             *ROOT.glob("workerpool/**/*.py"), *ROOT.glob("deploy/**/*")]
    found = [f"{path.relative_to(ROOT)}: {match.group(0)}" for path in texts if path.is_file()
             for match in wrong.finditer(path.read_text(errors="replace"))]
    assert found == []
    assert 'name = "workerpool-mmap"' in (ROOT / "pyproject.toml").read_text()


def test_readme_is_a_short_guide():
    """The reference lives in docs/; the README stays readable in ten minutes."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; move detail into docs/"


LINK = re.compile(r"(?<!\\)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lowercased, punctuation dropped, spaces as
    dashes, a repeated heading numbered ``-1``, ``-2``, ..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    inside = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            inside = not inside
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if inside or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def links(markdown: str) -> list[str]:
    """Every link target outside code blocks and inline code (link text may wrap lines)."""
    prose, inside = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            prose.append(line)
    return LINK.findall(re.sub(r"`[^`]*`", "", "\n".join(prose)))


def test_every_relative_link_in_the_docs_points_at_something_that_exists():
    pages = [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))]
    assert len(pages) > 1
    broken = []
    for page in pages:
        for target in links(page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(resolved.read_text()):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def test_the_openai_example_follows_the_model_it_calls():
    """The OpenAI snippet embeds with the text model, so it comes once that model is served."""
    readme = (ROOT / "README.md").read_text()
    served = readme.index("workerpool serve --http :8000 minilm.bpk")
    assert readme.index("client.embeddings.create(") > served
