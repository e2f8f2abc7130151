"""Headline figures: a result stated once, by the cell that measured it, and read from there.

A notebook's key results (a peak, a time ratio and whether it is beyond noise) are shown by
``record_headline``: the reader sees its sentence as the cell's output, and the same output
carries the figures under a mimetype of their own. ``scripts/write_pages.py`` reads them from the
committed notebooks to write the README's tables and ``docs/RESULTS.md``, so a page never holds a
figure typed by hand, and a re-executed notebook rewrites its pages.
"""

from __future__ import annotations

import json
import math
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


def plain_figure(name: str, value: object) -> Figure:
    """A figure as JSON keeps it: a numpy or torch scalar becomes its Python number."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, Figure):  # numpy.int64, a 0-d tensor
        value = item()
    if not isinstance(value, Figure):
        raise ValueError(
            f"figure {name}={value!r}: give a number, bool or str (a run's figure, named with "
            f"its unit, such as peak_mib=41.5)"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"figure {name}={value!r} is not a finite number: was it measured?")
    return value


def record_headline(key: str, text: str, **figures: Figure) -> None:
    """Show ``text`` as this cell's output and store ``figures`` (named with units, such as
    ``peak_mib`` or ``cpu_time_ratio``) beside it for the pages written from the notebook.

    ``scripts/write_pages.py`` shows a ``*time_ratio`` figure to one decimal with its
    ``beyond_noise`` figure (``ddp_cpu_time_ratio`` pairs with ``ddp_beyond_noise`` first).
    """
    if not key.isidentifier():
        raise ValueError(f"a headline key is a Python identifier, such as 'vgg16_peak': {key!r}")
    from IPython.display import display

    plain = {name: plain_figure(name, value) for name, value in figures.items()}
    headline: Headline = {"key": key, "text": text, "figures": plain}
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
