"""Every number in a notebook's prose is one its run printed, or is marked as quoted or fixed.

Prose written beside one run and left standing after the next says things its outputs no longer
show. So a digit in a markdown cell must appear in the notebook's saved outputs (commas ignored,
``1.4`` matching ``1.40``), or be code (inline or fenced), or sit on a blockquote line (``> ...``,
quoting an article), or be declared in the same cell as a fixed fact or a quote:
``<!-- fixed: 224 64 2016 -->``. Small integers (0-12: counts, sections), heading numbers, numbers
that are part of a name (VGG16, ResNet-50, Llama-3.2-1B, 16GB) and years cited after "et al." are
not checked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SMALL = 12

FENCED = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`[^`]*`")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$", re.S)
DECLARED = re.compile(r"<!--\s*(?:fixed|quoted)\s*:(.*?)-->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)|https?://\S+")
HEADING_NUMBER = re.compile(r"^(#+\s*)[\d.]+\s", re.M)
LIST_NUMBER = re.compile(r"^(\s*)\d+\.\s", re.M)
BLOCKQUOTE = re.compile(r"^\s*>.*$", re.M)
CITED_YEAR = re.compile(r"et al\.,?\s*\(?\d{4}")
# a number, not part of a name: not after a letter (the multiplier x aside) or after "letter-"
NUMBER = re.compile(r"(?<![A-Za-wy-z\d.,])(?<![A-Za-z]-)(\d+(?:,\d{3})*(?:\.\d+)?)(?![A-Za-z\d])")
ANY_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


def as_value(token: str) -> float | None:
    text = token.replace(",", "").rstrip(".")
    try:
        return float(text)
    except ValueError:
        return None


def output_values(notebook: dict) -> set[float]:
    """Every number any output of the notebook shows (text, HTML, widget state)."""
    texts = []
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            texts.append("".join(output.get("text", "")))
            for mime, data in output.get("data", {}).items():
                if mime.startswith("text/"):
                    texts.append("".join(data))
    texts.append(json.dumps(notebook.get("metadata", {}).get("widgets", {})))
    return {v for text in texts for t in ANY_NUMBER.findall(text) if (v := as_value(t)) is not None}


def prose_numbers(markdown: str) -> tuple[list[str], set[float]]:
    """The numbers a markdown cell states, and the ones it declares fixed or quoted."""
    declared = {
        v for body in DECLARED.findall(markdown) for t in ANY_NUMBER.findall(body)
        if (v := as_value(t)) is not None
    }  # fmt: skip
    text = FENCED.sub(" ", markdown)
    for pattern in (COMMENT, INLINE_CODE, MATH, LINK_TARGET, BLOCKQUOTE, CITED_YEAR):
        text = pattern.sub(" ", text)
    text = HEADING_NUMBER.sub(r"\1", text)
    text = LIST_NUMBER.sub(r"\1", text)
    return NUMBER.findall(text), declared


def unexplained_numbers(notebook: dict) -> list[str]:
    shown = output_values(notebook)
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        tokens, declared = prose_numbers("".join(cell["source"]))
        for token in tokens:
            value = as_value(token)
            if value is None or (value.is_integer() and abs(value) <= SMALL):
                continue
            if value not in shown and value not in declared:
                found.append(f"cell {index}: {token}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_numbers_come_from_the_outputs(path: Path) -> None:
    unexplained = unexplained_numbers(json.loads(path.read_text(encoding="utf-8")))
    assert not unexplained, (
        f"{path.name}: numbers in prose that no output shows (print them from the run, or mark "
        f"them <!-- fixed: ... --> / quote them on a '> ' line): {unexplained}"
    )


def notebook_with(markdown: str, printed: str) -> dict:
    return {
        "metadata": {},
        "cells": [
            {"cell_type": "markdown", "source": [markdown]},
            {
                "cell_type": "code",
                "source": [],
                "outputs": [{"output_type": "stream", "text": [printed]}],
            },
        ],
    }


def test_the_check_flags_a_typed_number_and_accepts_printed_quoted_and_fixed_ones() -> None:
    printed = "peak 6003.2 MB, x1.40 the time\n"
    assert (
        unexplained_numbers(notebook_with("The peak was 6,003.2 MB, x1.4 the time.", printed)) == []
    )
    assert unexplained_numbers(notebook_with("The peak was 5,120.0 MB.", printed)) == [
        "cell 0: 5,120.0"
    ]
    quoted = "> The article: 14222 MB without checkpointing.\n\nVGG16 and ResNet-50 at `batch=64`."
    assert unexplained_numbers(notebook_with(quoted, printed)) == []
    fixed = "<!-- fixed: 224 2016 -->\nImages of 224 px (Chen et al. 2016; see 2016 too)."
    assert unexplained_numbers(notebook_with(fixed, printed)) == []
    assert unexplained_numbers(notebook_with("## 13. Heading\n\n3 segments", printed)) == []
