"""The option tables of ``docs/configuration.md``, made from :data:`.settings.SETTINGS`.

The page holds them between markers, ``<!-- settings: NAME -->`` and ``<!-- /settings -->``;
``python3 -m workerpool.config.docs docs/configuration.md`` writes them again after a setting
changes, and a test fails while the page says otherwise than the table.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from .settings import SERVE, WORKERS, Setting, of_command

BEGIN, END = "<!-- settings: {name} -->", "<!-- /settings -->"


def _option(setting: Setting) -> str:
    """``--load mmap|copy``: the flag with what follows it on the command line."""
    value = setting.metavar or "|".join(setting.choices or ())
    if not value and not setting.switch:
        value = setting.name.upper()  # argparse's own metavar
    return f"`{setting.flag} {value}`" if value else f"`{setting.flag}`"


def _default(setting: Setting) -> str:
    if setting.doc_default is not None:
        return setting.doc_default
    value = setting.default
    if setting.file_value is not None and value is not None:  # as a user writes it: 25 ms, not 0.025 s
        value = setting.file_value(value)
    if setting.switch:
        return "off"
    if value is None:
        return "none"
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _table(columns: dict[str, Callable[[Setting], str]], rows: list[Setting]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for setting in rows:
        lines.append("| " + " | ".join(cell(setting).replace("|", "\\|") for cell in columns.values()) + " |")
    return "\n".join(lines)


def _shared() -> list[Setting]:
    """The options ``workers`` takes from ``serve`` with the same meaning."""
    return [setting for setting in of_command(WORKERS)
            if SERVE in setting.commands and not setting.positional and isinstance(setting.help, str)]


def blocks() -> dict[str, str]:
    """The generated text of the page, by marker name."""
    serve = [setting for setting in of_command(SERVE) if not setting.positional]
    own = [setting for setting in of_command(WORKERS) if SERVE not in setting.commands]
    return {
        "serve": _table({"option": _option, "default": _default, "meaning": lambda s: s.doc}, serve),
        "workers-shared": ", ".join(f"`{setting.flag}`" for setting in _shared()) + ".",
        "workers": _table({"option": _option, "meaning": lambda s: s.doc}, own),
    }


def render(page: str) -> str:
    """``page`` with the text between each pair of markers made again."""
    for name, text in blocks().items():
        begin = BEGIN.format(name=name)
        start = page.index(begin) + len(begin)
        end = page.index(END, start)
        page = f"{page[:start]}\n{text}\n{page[end:]}"
    return page


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        written = render(f.read())
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write(written)
