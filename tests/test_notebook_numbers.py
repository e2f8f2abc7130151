"""Every number in a notebook's prose is one the cells it describes printed, or is marked fixed.

Prose written beside one run and left standing after the next says things its outputs no longer
show, and a number found *somewhere* in a notebook may belong to another experiment. So a number
in a markdown cell must appear in the outputs of the code cells that cell talks about: the code
cells before it, back to the previous heading; where no code cell stands between that heading and
the prose, the code cells after it, up to the next heading. A markdown cell split by a heading is
checked part by part. Commas are ignored, and ``1.4`` matches ``1.40``.

Not checked: code (inline or fenced), blockquote lines (``> ...``, quoting an article), numbers
declared in the same cell as a fixed fact or a quote (``<!-- fixed: 224 64 2016 -->``), small
integers (0-12: counts, sections), heading and list numbers, numbers that are part of a name
(VGG16, ResNet-50, Llama-3.2-1B, 16GB), versions ("torch 2.15", "5.23.0") and years cited after
"et al.".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SMALL = 12
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

FENCED = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`[^`]*`")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$", re.S)
DECLARED = re.compile(r"<!--\s*(?:fixed|quoted)\s*:(.*?)-->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)|https?://\S+")
HEADING = re.compile(r"^ {0,3}#{1,6}\s", re.M)
HEADING_NUMBER = re.compile(r"^(#+\s*)[\d.]+\s", re.M)
LIST_NUMBER = re.compile(r"^(\s*)\d+\.\s", re.M)
BLOCKQUOTE = re.compile(r"^\s*>.*$", re.M)
CITED_YEAR = re.compile(r"et al\.,?\s*\(?\d{4}")
SOFTWARE = "torch|PyTorch|torchvision|transformers|peft|TRL|bitsandbytes|Python|CUDA|cuDNN|NumPy"
VERSION = re.compile(rf"\b(?:{SOFTWARE})\s+v?\d+(?:\.\d+)*|\bv?\d+\.\d+\.\d+\b", re.I)
MODEL_REFERENCE = re.compile(r"IPY_MODEL_(\w+)")
# a number, not part of a name: not after a letter (the multiplier x aside) or after "letter-"
NUMBER = re.compile(r"(?<![A-Za-wy-z\d.,])(?<![A-Za-z]-)(\d+(?:,\d{3})*(?:\.\d+)?)(?![A-Za-z\d])")
ANY_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


def as_value(token: str) -> float | None:
    text = token.replace(",", "").rstrip(".")
    try:
        return float(text)
    except ValueError:
        return None


def numbers_in(text: str) -> set[float]:
    return {v for t in ANY_NUMBER.findall(text) if (v := as_value(t)) is not None}


def widget_texts(model_id: str, states: dict, seen: set[str]) -> list[str]:
    """The saved state of a widget and of every widget it holds (a panel's children)."""
    if model_id in seen or model_id not in states:
        return []
    seen.add(model_id)
    text = json.dumps(states[model_id])
    texts = [text]
    for child in MODEL_REFERENCE.findall(text):
        texts += widget_texts(child, states, seen)
    return texts


def cell_output_values(cell: dict, notebook: dict) -> set[float]:
    """Every number one code cell's outputs show (text, HTML, headline figures, its widgets)."""
    states = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    texts: list[str] = []
    for output in cell.get("outputs", []):
        texts.append("".join(output.get("text", "")))
        for mime, data in output.get("data", {}).items():
            if mime == WIDGET_VIEW:
                texts += widget_texts(data.get("model_id", ""), states, set())
            elif mime.startswith("text/") or mime.endswith("json"):
                texts.append(data if isinstance(data, str) else json.dumps(data))
    return {v for text in texts for v in numbers_in("".join(text))}


def prose_numbers(markdown: str) -> tuple[list[str], set[float]]:
    """The numbers a piece of markdown states, and the ones it declares fixed or quoted."""
    declared = {v for body in DECLARED.findall(markdown) for v in numbers_in(body)}
    text = FENCED.sub(" ", markdown)
    for pattern in (COMMENT, INLINE_CODE, MATH, LINK_TARGET, BLOCKQUOTE, CITED_YEAR, VERSION):
        text = pattern.sub(" ", text)
    text = HEADING_NUMBER.sub(r"\1", text)
    text = LIST_NUMBER.sub(r"\1", text)
    return NUMBER.findall(text), declared


def split_at_headings(markdown: str) -> list[tuple[bool, str]]:
    """A markdown cell's parts, each as (starts with a heading, text)."""
    starts = [m.start() for m in HEADING.finditer(markdown)]
    bounds = [0, *[s for s in starts if s > 0], len(markdown)]
    return [
        (bool(HEADING.match(markdown, a)), markdown[a:b])
        for a, b in zip(bounds, bounds[1:], strict=False)
        if markdown[a:b].strip()
    ]


def sections(notebook: dict) -> list[list[tuple[int, str, str]]]:
    """The notebook as sections between headings: each a list of (cell index, kind, text), kind
    "code" or "prose", in order. A markdown part that starts with a heading opens a section."""
    found: list[list[tuple[int, str, str]]] = [[]]
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            found[-1].append((index, "code", ""))
        elif cell["cell_type"] == "markdown":
            for opens, text in split_at_headings("".join(cell["source"])):
                if opens:
                    found.append([])
                found[-1].append((index, "prose", text))
    return found


def described_cells(section: list[tuple[int, str, str]], position: int) -> list[int]:
    """The code cells that the prose at ``position`` of its section talks about."""
    before = [index for index, kind, _ in section[:position] if kind == "code"]
    if before:
        return before
    return [index for index, kind, _ in section[position + 1 :] if kind == "code"]


def unexplained_numbers(notebook: dict) -> list[str]:
    """Each prose number not shown by the cells it describes, as 'cell N: token (cells ...)'."""
    found = []
    for section in sections(notebook):
        for position, (index, kind, text) in enumerate(section):
            if kind != "prose":
                continue
            tokens, declared = prose_numbers(text)
            cells = described_cells(section, position)
            shown = set().union(
                *(cell_output_values(notebook["cells"][c], notebook) for c in cells)
            )
            for token in tokens:
                value = as_value(token)
                if value is None or (value.is_integer() and abs(value) <= SMALL):
                    continue
                if value not in shown and value not in declared:
                    where = f"cells {cells[0]}-{cells[-1]}" if cells else "no code cell"
                    found.append(f"cell {index}: {token} (checked against {where})")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_numbers_come_from_the_cells_they_describe(path: Path) -> None:
    unexplained = unexplained_numbers(json.loads(path.read_text(encoding="utf-8")))
    assert not unexplained, (
        f"{path.name}: numbers in prose that the code cells it describes (back to the previous "
        f"heading) do not print. Print them from the run (record_headline), move the prose next "
        f"to the cell that prints them, or mark them <!-- fixed: ... --> / quote them on a '> ' "
        f"line: {unexplained}"
    )


def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "source": [text]}


def code(printed: str = "") -> dict:
    outputs = [{"output_type": "stream", "text": [printed]}] if printed else []
    return {"cell_type": "code", "source": [], "outputs": outputs}


def notebook_of(*cells: dict) -> dict:
    return {"metadata": {}, "cells": list(cells)}


def notebook_with(text: str, printed: str) -> dict:
    return notebook_of(markdown(text), code(printed))


def test_the_check_flags_a_typed_number_and_accepts_printed_quoted_and_fixed_ones() -> None:
    printed = "peak 6003.2 MB, x1.40 the time\n"
    assert (
        unexplained_numbers(notebook_with("The peak was 6,003.2 MB, x1.4 the time.", printed)) == []
    )
    assert unexplained_numbers(notebook_with("The peak was 5,120.0 MB.", printed)) == [
        "cell 0: 5,120.0 (checked against cells 1-1)"
    ]
    quoted = "> The article: 14222 MB without checkpointing.\n\nVGG16 and ResNet-50 at `batch=64`."
    assert unexplained_numbers(notebook_with(quoted, printed)) == []
    fixed = "<!-- fixed: 224 2016 -->\nImages of 224 px (Chen et al. 2016; see 2016 too)."
    assert unexplained_numbers(notebook_with(fixed, printed)) == []
    assert unexplained_numbers(notebook_with("## 13. Heading\n\n3 segments", printed)) == []
    versions = "torch 2.15 warns; transformers 5.23 renamed it; peft 0.21.2 too."
    assert unexplained_numbers(notebook_with(versions, printed)) == []


def test_a_number_must_come_from_the_cells_before_it_in_its_section() -> None:
    notebook = notebook_of(
        markdown("## One"),
        code("peak 41.5 MiB"),
        markdown("## Two"),
        code("peak 77.0 MiB"),
        markdown("The peak is 77.0 MiB, and 41.5 MiB above."),
    )
    # 41.5 is printed, but under another heading: it is not what this prose describes
    assert unexplained_numbers(notebook) == ["cell 4: 41.5 (checked against cells 3-3)"]


def test_prose_before_any_code_in_its_section_is_checked_against_the_cells_after_it() -> None:
    notebook = notebook_of(
        code("x1.31"),
        markdown("## Timing\n\nThe next cell shows x1.31 and then 2.5 s."),
        code("took 2.5 s"),
        markdown("## Next"),
        code("x1.31"),
    )
    assert unexplained_numbers(notebook) == ["cell 1: 1.31 (checked against cells 2-2)"]


def test_text_above_a_heading_in_the_same_cell_belongs_to_the_section_before() -> None:
    notebook = notebook_of(
        code("peak 41.5 MiB"),
        markdown("So the peak was 41.5 MiB.\n\n## Next\n\nThe next cell prints 93.0."),
        code("93.0 and 41.5"),
    )
    assert unexplained_numbers(notebook) == []


def test_a_panels_numbers_are_those_of_its_own_widgets() -> None:
    states = {
        "box": {"state": {"children": ["IPY_MODEL_label"]}},
        "label": {"state": {"value": "peak 19.25 MiB"}},
        "other": {"state": {"value": "peak 55.75 MiB"}},
    }
    panel = code()
    panel["outputs"] = [{"output_type": "display_data", "data": {WIDGET_VIEW: {"model_id": "box"}}}]
    notebook = notebook_of(panel, markdown("The panel shows 19.25 MiB, not 55.75 MiB."))
    notebook["metadata"] = {"widgets": {WIDGET_STATE: {"state": states}}}
    assert unexplained_numbers(notebook) == ["cell 1: 55.75 (checked against cells 0-0)"]
