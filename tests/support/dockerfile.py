"""deploy/Dockerfile as a build without ``--build-arg`` reads it: each ``${NAME}`` of an ``ARG``
replaced by its default. The install-line tests and the image test read it here alike."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from support.paths import ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ARG = re.compile(r"^ARG (\w+)=(\S*)$", re.MULTILINE)
INSTALL = re.compile(r"^RUN python3 -m pip install ([^&\n]+?)\s*(?:&&|$)", re.MULTILINE)
ENV = re.compile(r"^ENV (.+)$", re.MULTILINE)
COPY = re.compile(r"^COPY (.+)$", re.MULTILINE)
ENTRYPOINT = re.compile(r"^ENTRYPOINT (\[.*\])$", re.MULTILINE)
HEALTHCHECK = re.compile(r"^HEALTHCHECK .*?CMD (\[.*\])$", re.MULTILINE)


def arguments(path: Path = DOCKERFILE) -> dict[str, str]:
    """The build arguments (``ARG NAME=DEFAULT``) and their defaults."""
    return dict(ARG.findall(path.read_text()))


def expanded(path: Path = DOCKERFILE) -> str:
    """The file's text with every ``${NAME}`` of an ``ARG`` that has a default replaced by it."""
    defaults = arguments(path)
    return re.sub(r"\$\{(\w+)\}", lambda match: defaults.get(match[1], match[0]), path.read_text())


def install_arguments() -> list[str]:
    """What the image's one ``python3 -m pip install`` installs, as words: options and requirements."""
    [line] = INSTALL.findall(expanded())
    return shlex.split(line)


def extras() -> set[str]:
    """The extras of the checkout that the image installs."""
    [checkout] = [word for word in install_arguments() if word.startswith(".[")]
    return set(checkout.removeprefix(".[").removesuffix("]").split(","))


def copies() -> list[tuple[list[str], str]]:
    """Each ``COPY SOURCE... DEST``: the sources, in the build context (the checkout), and
    where they go, from the image's WORKDIR."""
    return [(words[:-1], words[-1]) for words in (line.split() for line in COPY.findall(expanded()))]


def environment() -> dict[str, str]:
    """The variables the image's ``ENV`` lines set."""
    return dict(word.split("=", 1) for line in ENV.findall(expanded()) for word in shlex.split(line))


def entrypoint() -> list[str]:
    """The command the image runs (exec form), before the arguments a container gives it."""
    [command] = ENTRYPOINT.findall(DOCKERFILE.read_text())
    return json.loads(command)


def healthcheck() -> list[str]:
    """The command of the image's ``HEALTHCHECK`` (exec form)."""
    [command] = HEALTHCHECK.findall(DOCKERFILE.read_text())
    return json.loads(command)
