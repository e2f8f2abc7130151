"""Headline figures: a result stated once, by the cell that measured it, and read from there.

A notebook's key results (a peak, a time ratio and whether it is beyond noise) are shown by
``record_headline``: the reader sees its sentence as the cell's output, and the same output
carries the figures under a mimetype of their own. ``scripts/write_pages.py`` reads them from the
committed notebooks to write the README's tables and ``docs/RESULTS.md``, so a page never holds a
figure typed by hand, and a re-executed notebook rewrites its pages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

__all__ = ["HEADLINE_MIME", "Headline", "read_headlines", "record_headline"]

HEADLINE_MIME = "application/vnd.checkpointing-tutorial.headline+json"
Figure = float | int | bool | str


class Headline(TypedDict):
    """One recorded result: its key within the notebook, the sentence shown, and its figures."""

    key: str
    text: str
    figures: dict[str, Figure]


def record_headline(key: str, text: str, **figures: Figure) -> None:
    """Show ``text`` as this cell's output and store ``figures`` (named with units, such as
    ``peak_mib`` or ``cpu_time_ratio``) beside it for the pages written from the notebook."""
    if not key.isidentifier():
        raise ValueError(f"a headline key is a Python identifier, such as 'vgg16_peak': {key!r}")
    from IPython.display import display

    headline: Headline = {"key": key, "text": text, "figures": dict(figures)}
    display({HEADLINE_MIME: headline, "text/plain": text}, raw=True)


def read_headlines(notebook_path: Path) -> dict[str, Headline]:
    """Every headline a committed notebook's outputs hold, by key (a repeated key is an error)."""
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    found: dict[str, Headline] = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            data: Mapping[str, object] = output.get("data", {})
            headline = data.get(HEADLINE_MIME)
            if not isinstance(headline, dict):
                continue
            if headline["key"] in found:
                raise ValueError(
                    f"{notebook_path.name}: headline {headline['key']!r} recorded twice"
                )
            found[headline["key"]] = Headline(
                key=headline["key"], text=headline["text"], figures=dict(headline["figures"])
            )
    return found
