"""Write the README's tour, headline and card tables and docs/RESULTS.md's run sections.

A figure typed into a page goes stale the next time its notebook runs. So every run figure on
those pages is read from the committed notebooks (the list of cards from the GPU table,
``tutorial_utils.gpus``): each notebook's headlines (``record_headline``
outputs, read by ``read_headlines``) and its execution metadata (when each cell ran). The script
rewrites only the text between marker comments (``<!-- pages:NAME:begin -->`` and
``<!-- pages:NAME:end -->``); everything else on a page is kept by hand and holds no run figure.

Minutes for a learner, per notebook core (the cells before "## Exercises"): the code a learner
reads (non-blank lines of the core's visible code cells at ``CODE_LINES_PER_MINUTE``), its prose
(words as ``prose_stats.py`` counts them, at ``PROSE_WORDS_PER_MINUTE``) and the time its code
cells ran in the committed ``cpu`` run.

Usage: python scripts/write_pages.py [--check]   (--check: exit 1 if a page differs, write nothing)
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from prose_stats import CORE_END, prose_stats, word_count

from tutorial_utils.display.headlines import Headline, read_headlines
from tutorial_utils.gpus import cards_markdown

ROOT = Path(__file__).resolve().parent.parent
CODE_LINES_PER_MINUTE = 10  # reading code to follow it, not skimming it
PROSE_WORDS_PER_MINUTE = 150  # technical prose, slower than the 200-250 of plain reading
CORE_MINUTES_TARGET = 180  # issue 42: the seven cores in three hours or less
# Notebooks whose committed run records no headline yet. A notebook listed here gets a "no
# headline yet" row instead of failing the page test; the lead empties this set at merge, once
# every notebook has been re-executed with its record_headline cells.
PENDING_HEADLINES: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NotebookRun:
    """What the pages say about one committed notebook: its headlines and how long it takes."""

    stem: str
    title: str
    headlines: dict[str, Headline]
    profile: str
    torch_version: str
    run_date: str
    run_s: float  # the whole notebook, first cell started to last cell done
    core_run_s: float  # the core's code cells, each from start to done
    code_lines: int
    prose_words: int

    @property
    def minutes(self) -> tuple[float, float, float]:
        """Reading the code, reading the prose, waiting for the core's cells."""
        return (
            self.code_lines / CODE_LINES_PER_MINUTE,
            self.prose_words / PROSE_WORDS_PER_MINUTE,
            self.core_run_s / 60,
        )


def core_cells(cells: list[dict]) -> list[dict]:
    """The cells before the "## Exercises" heading."""
    core = []
    for cell in cells:
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).startswith(CORE_END):
            break
        core.append(cell)
    return core


def seen_code_lines(cell: dict) -> int:
    """Non-blank lines of a code cell a learner reads: none when its source is hidden."""
    metadata = cell.get("metadata", {})
    if metadata.get("jupyter", {}).get("source_hidden") or "solution" in metadata.get("tags", []):
        return 0
    return sum(1 for line in "".join(cell["source"]).splitlines() if line.strip())


def cell_span(cell: dict) -> tuple[datetime, datetime] | None:
    """When a code cell started and finished in the committed run, from nbclient's metadata."""
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.status.busy"), timing.get("iopub.status.idle")
    if not start or not end:
        return None
    return datetime.fromisoformat(start.replace("Z", "+00:00")), datetime.fromisoformat(
        end.replace("Z", "+00:00")
    )


def run_environment(cells: list[dict]) -> tuple[str, str]:
    """The profile and torch version the first cell printed ("profile: cpu", "torch 2.15.0")."""
    for cell in cells:
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        profile = re.search(r"^profile:\s*(\w+)", text, re.M)
        if profile:
            torch_version = re.search(r"torch (\d+\.\d+\.\d+)", text)
            return profile.group(1), torch_version.group(1) if torch_version else "unknown"
    return "unknown", "unknown"


def read_run(path: Path) -> NotebookRun:
    """One committed notebook, read for the pages."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    spans = [span for cell in cells if cell["cell_type"] == "code" if (span := cell_span(cell))]
    if not spans:
        raise ValueError(
            f"{path.name} has no execution metadata: run "
            f"`python scripts/execute_notebooks.py --profile cpu {path}` first"
        )
    core = [c for c in core_cells(cells) if c["cell_type"] == "code"]
    core_spans = [span for cell in core if (span := cell_span(cell))]
    title = "".join(cells[0]["source"]).splitlines()[0].lstrip("# ")
    profile, torch_version = run_environment(cells)
    return NotebookRun(
        stem=path.stem,
        title=re.sub(r"^\d+\s*·\s*", "", title),
        headlines=read_headlines(path),
        profile=profile,
        torch_version=torch_version,
        run_date=min(start for start, _ in spans).date().isoformat(),
        run_s=(max(end for _, end in spans) - min(start for start, _ in spans)).total_seconds(),
        core_run_s=sum((end - start).total_seconds() for start, end in core_spans),
        code_lines=sum(seen_code_lines(cell) for cell in core),
        prose_words=sum(word_count(s) for s in prose_stats(path).sentences),
    )


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.replace("|", "\\|").split())


def markdown_table(columns: list[tuple[str, str]], rows: list[list[str]]) -> str:
    """A Markdown table: each column a (header, alignment: "---" or "---:"), each row its cells."""
    lines = [[header for header, _ in columns], [align for _, align in columns], *rows]
    return "\n".join("|" + "|".join(f" {c} " if c else " " for c in line) + "|" for line in lines)


def tour_table(runs: list[NotebookRun]) -> str:
    rows, total = [], 0.0
    for run in runs:
        code, prose, wait = run.minutes
        total += code + prose + wait
        rows.append(
            [
                f"[`{run.stem}`](notebooks/{run.stem}.ipynb)",
                cell(run.title),
                f"{code:.0f} + {prose:.0f} + {wait:.1f} = **{code + prose + wait:.0f}**",
            ]
        )
    rows.append(["the seven cores", "", f"**{total:.0f}** (target: {CORE_MINUTES_TARGET} or less)"])
    columns = [
        ("notebook", "---"),
        ("what it teaches", "---"),
        ("minutes: code + prose + run = core", "---"),
    ]
    note = (
        f"Minutes for each core (the notebook before its exercises): its code at "
        f"{CODE_LINES_PER_MINUTE} lines a minute, its prose at {PROSE_WORDS_PER_MINUTE} words a "
        f"minute, and the time its code cells ran in the committed run "
        f"({runs_summary(runs)}), from the notebooks' execution metadata."
    )
    return note + "\n\n" + markdown_table(columns, rows)


def runs_summary(runs: list[NotebookRun]) -> str:
    """'cpu profile, torch 2.15.0, 2026-12-04': what made the committed outputs."""
    kinds = sorted({(r.profile, r.torch_version) for r in runs})
    dates = sorted({r.run_date for r in runs})
    made = "; ".join(f"{profile} profile, torch {torch}" for profile, torch in kinds)
    return f"{made}, {dates[0]}" + ("" if len(dates) == 1 else f" to {dates[-1]}")


def headline_table(runs: list[NotebookRun]) -> str:
    rows = []
    for run in runs:
        if not run.headlines:
            rows.append([f"`{run.stem}`", "(no headline recorded yet)"])
        for headline in run.headlines.values():
            rows.append([f"`{run.stem}`", cell(headline["text"])])  # verbatim
    return markdown_table([("notebook", "---"), ("result, as its run printed it", "---")], rows)


RUNS_COLUMNS = [
    ("notebook", "---"),
    ("profile", "---"),
    ("torch", "---"),
    ("run on", "---"),
    ("whole run s", "---:"),
    ("core cells s", "---:"),
    ("code lines", "---:"),
    ("prose words", "---:"),
]


def runs_table(runs: list[NotebookRun]) -> str:
    rows = [
        [
            f"`{run.stem}`",
            run.profile,
            run.torch_version,
            run.run_date,
            f"{run.run_s:.1f}",
            f"{run.core_run_s:.1f}",
            str(run.code_lines),
            str(run.prose_words),
        ]
        for run in runs
    ]
    return markdown_table(RUNS_COLUMNS, rows)


def results_section(runs: list[NotebookRun]) -> str:
    parts = [
        "Written by `scripts/write_pages.py` from the committed notebooks; do not edit by hand.",
        "### The committed runs\n\n" + runs_table(runs),
    ]
    for run in runs:
        lines = [f"### `{run.stem}`: {cell(run.title)}", ""]
        if not run.headlines:
            lines.append("No headline recorded yet (its cells do not call `record_headline`).")
        for key, headline in run.headlines.items():
            lines.append(f"- **{cell(headline['text'])}** (`{key}`)")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def replace_between(text: str, name: str, body: str, page: str) -> str:
    """``text`` with what stands between the ``name`` markers replaced by ``body``."""
    begin, end = f"<!-- pages:{name}:begin -->", f"<!-- pages:{name}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{page}: needs one {begin} and, after it, one {end}")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


ESTIMATE_TAG = "pages-estimate"  # the code cell whose printed table docs/ESTIMATE.md shows


def estimate_example(root: Path) -> str | None:
    """The estimate table a notebook's committed run printed, from its cell tagged
    ``pages-estimate``, fenced for docs/ESTIMATE.md; None when no notebook has one."""
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for cell in cells:
            if cell["cell_type"] != "code" or ESTIMATE_TAG not in cell["metadata"].get("tags", []):
                continue
            printed = "".join(
                "".join(out["text"])
                for out in cell.get("outputs", [])
                if out.get("output_type") == "stream" and out.get("name") == "stdout"
            )
            profile, torch = run_environment(cells)
            return (
                f"Printed by [`{path.stem}`](../notebooks/{path.name})'s committed run "
                f"(`{profile}` profile, torch {torch}; its `estimate_table`, the command's own "
                f"renderer), written here by `scripts/write_pages.py`:\n\n```\n"
                f"{printed.rstrip()}\n```"
            )
    return None


def notebook_runs(root: Path) -> list[NotebookRun]:
    paths = sorted((root / "notebooks").glob("*.ipynb"))
    if not paths:
        raise ValueError(f"no notebooks under {root / 'notebooks'}")
    return [read_run(path) for path in paths]


def written_pages(root: Path, runs: list[NotebookRun]) -> dict[Path, str]:
    """Each page's text with its generated parts rewritten from ``runs``."""
    readme, results = root / "README.md", root / "docs" / "RESULTS.md"
    text = readme.read_text(encoding="utf-8")
    text = replace_between(text, "tour", tour_table(runs), "README.md")
    text = replace_between(text, "headlines", headline_table(runs), "README.md")
    text = replace_between(text, "cards", cards_markdown(), "README.md")
    pages = {
        readme: text,
        results: replace_between(
            results.read_text(encoding="utf-8"), "runs", results_section(runs), "docs/RESULTS.md"
        ),
    }
    example = estimate_example(root)
    if example is not None:
        manual = root / "docs" / "ESTIMATE.md"
        pages[manual] = replace_between(
            manual.read_text(encoding="utf-8"), "estimate", example, "docs/ESTIMATE.md"
        )
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return write_or_check(args.root, args.check)
    except ValueError as error:  # a page without its markers, a notebook never executed
        print(f"write_pages: {error}", file=sys.stderr)
        return 2


def write_or_check(root: Path, check: bool) -> int:
    """Rewrite the pages (or, with ``check``, only say which differ); 1 when one differs."""
    runs = notebook_runs(root)
    missing = [r.stem for r in runs if not r.headlines and r.stem not in PENDING_HEADLINES]
    if missing:
        print(
            f"no headline recorded in {missing}: re-execute them, or list them in PENDING_HEADLINES"
        )
        return 1
    stale = []
    for path, text in written_pages(root, runs).items():
        old = path.read_text(encoding="utf-8")
        if old == text:
            continue
        stale.append(path)
        if check:
            name = str(path.relative_to(root))
            diff = difflib.unified_diff(
                old.splitlines(), text.splitlines(), name, "notebooks", lineterm=""
            )
            print("\n".join(list(diff)[:40]))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"rewrote {path.relative_to(root)}")
    if check and stale:
        print("pages disagree with the notebooks: run `python scripts/write_pages.py`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
