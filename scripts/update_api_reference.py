"""Refresh the signature and summary of every ``### `name``` entry of docs/api.md, and of every
``- `folder.name(...)` — summary`` bullet, from the code: the summary is the docstring's whole
first paragraph, so no sentence is cut (tests/integration/test_docs.py checks the page is current).

    .venv/bin/python scripts/update_api_reference.py

Sections, their order and any text after an entry's summary line stay as written; a public name
without an entry is listed so that it can be placed by hand (the tests check every name is there).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import tl_geometry

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"
ENTRY = re.compile(r"### `(?P<name>[A-Za-z_.]+)`\n\n```text\n(?P<signature>.*?)\n```\n\n(?P<summary>[^\n]*)\n")
BULLET = re.compile(r"^- `(?P<name>[a-z_]+\.[a-z_]+)\(.*?` — (?P<summary>.*)$", re.M)


def describe(name: str) -> tuple[str, str] | None:
    folder, _, leaf = name.rpartition(".")
    obj = getattr(getattr(tl_geometry, folder) if folder else tl_geometry, leaf, None)
    if obj is None or not callable(obj):
        return None
    try:
        signature = f"{'class ' if inspect.isclass(obj) else ''}{leaf}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return None
    summary = (inspect.getdoc(obj) or "").split("\n\n")[0].replace("\n", " ")
    return signature, summary


def refreshed(text: str) -> str:
    """``text`` (docs/api.md) with every entry's and bullet's signature and summary from the code."""

    def entry(match: re.Match) -> str:
        found = describe(match["name"])
        if found is None:
            return match[0]
        signature, summary = found
        return f"### `{match['name']}`\n\n```text\n{signature}\n```\n\n{summary}\n"

    def bullet(match: re.Match) -> str:
        found = describe(match["name"])
        if found is None:
            return match[0]
        signature, summary = found
        return f"- `{match['name'].rpartition('.')[0]}.{signature}` — {summary}"

    return BULLET.sub(bullet, ENTRY.sub(entry, text))


def main() -> None:
    text = refreshed(API.read_text(encoding="utf-8"))
    API.write_text(text, encoding="utf-8")
    public = [*tl_geometry.__all__, *(f"{folder}.{name}" for folder in ("capture", "intervene")
                                      for name in getattr(tl_geometry, folder).__all__)]
    missing = [name for name in public if f"### `{name}`" not in text]
    if missing:
        print("no entry yet for:", ", ".join(missing))


if __name__ == "__main__":
    main()
