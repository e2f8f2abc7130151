"""The GPU check's results and their rendering (pure: the report is a function of the results).

A section returns an ``Outcome`` (tables of raw figures, notes, failed checks, or why it was
skipped); the runner makes it a ``SectionResult``; ``report_data`` gathers every result as JSON-ready
data and ``render_report`` turns that data alone into the markdown page.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NotRequired, Required, get_args, get_origin, get_type_hints

from tutorial_utils.display.tables import cell_text, columns_table, markdown_cell

__all__ = [
    "Column",
    "columns_of",
    "DRY_RUN",
    "FAILED",
    "MEASURED",
    "one_line",
    "Outcome",
    "PASSED",
    "relative_error",
    "render_report",
    "render_table",
    "report_data",
    "SectionResult",
    "Shown",
    "SKIPPED",
    "Status",
    "status_text",
    "Table",
    "tolerance_failures",
    "write_report",
]

Status = Literal["passed", "FAILED", "skipped"]
PASSED: Status = "passed"
FAILED: Status = "FAILED"
SKIPPED: Status = "skipped"
MEASURED, DRY_RUN = "measured on the GPU", "dry run"


@dataclass(frozen=True)
class Column:
    """One column of a report table; ``source`` labels a figure, None a name or a setting."""

    header: str
    key: str
    fmt: str = "{}"
    source: str | None = None


@dataclass(frozen=True)
class Shown:
    """How a row's field is shown in a report table, written once on the field of the row's
    TypedDict as ``Annotated[T, Shown(header, fmt, source)]`` (source None: a name or a setting)."""

    header: str
    fmt: str = "{}"
    source: str | None = None


def columns_of(row_type: type) -> list[Column]:
    """The table columns a row's TypedDict declares, in the order of its fields (a base's first):
    one per field annotated ``Annotated[T, Shown(...)]``, ``NotRequired`` around it or not."""
    columns = []
    for key, hint in get_type_hints(row_type, include_extras=True).items():
        while get_origin(hint) in (NotRequired, Required):
            hint = get_args(hint)[0]
        for mark in getattr(hint, "__metadata__", ()):
            if isinstance(mark, Shown):
                columns.append(Column(mark.header, key, mark.fmt, mark.source))
    return columns


@dataclass
class Table:
    """Rows of raw figures; the columns say how each is shown and where it came from."""

    title: str
    columns: list[Column]
    rows: Sequence[Mapping[str, object]]


@dataclass
class Outcome:
    """What a section found. Failed checks keep their figures; ``skipped`` says why it did not run."""

    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None


@dataclass
class SectionResult:
    key: str
    title: str
    status: Status
    seconds: float
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # one line: the exception, the failed checks, or why it was skipped
    traceback: str | None = None


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``; a notebook cell's error as its own name and value."""
    name = getattr(error, "ename", None) or type(error).__name__
    message = str(getattr(error, "evalue", None) or error).strip()
    return f"{name}: {message.splitlines()[0]}" if message else name


def relative_error(value: float | None, reference: float | None) -> float | None:
    """(value - reference) / reference; None without a reference (no GPU)."""
    return None if value is None or not reference else (value - reference) / reference


def tolerance_failures(
    label: str, error: float | None, tolerance: float, missing: str, compared: str
) -> list[str]:
    """A compared figure's failure, if any: no measured reference (``missing``), or ``compared``
    off by more than ``tolerance``."""
    if error is None:
        return [f"{label}: {missing}"]
    if abs(error) > tolerance:
        return [f"{label}: {compared} off by {error:+.2%}"]
    return []


def _header(column: dict) -> str:
    return (
        column["header"] if column["source"] is None else f"{column['header']} ({column['source']})"
    )


def render_table(table: dict) -> list[str]:
    """A table (as ``dataclasses.asdict`` gives it) as markdown lines under its title."""
    columns = [(column["key"], _header(column), column["fmt"]) for column in table["columns"]]
    body = columns_table(table["rows"], columns, "markdown")
    return [f"### {table['title']}", "", *body.splitlines(), ""]


def status_text(status: Status, error: str | None) -> str:
    """The status as the report shows it: passed, FAILED, or "skipped: " and why."""
    return f"skipped: {error}" if status == SKIPPED else status


def render_report(report: dict) -> str:
    """The report as markdown: hardware and totals first, then one part per section."""
    sections = report["sections"]
    counts = {status: sum(s["status"] == status for s in sections) for status in (PASSED, FAILED)}
    skipped = sum(s["status"] == SKIPPED for s in sections)
    lines = [
        "# GPU check",
        "",
        f"Hardware: {report['hardware']}.",
        "",
        f"{len(sections)} of {len(report['planned'])} sections ran in {report['elapsed_s']:.0f} s "
        f"(budget {report['budget_s']:.0f} s): {counts[PASSED]} passed, {counts[FAILED]} failed, "
        f"{skipped} skipped. Produced by `python scripts/gpu_check.py`; the JSON beside this page "
        "holds every figure and each failure's traceback.",
        f'"{MEASURED}": read or measured on this GPU in this run; "{DRY_RUN}": the same step on '
        "the meta device (exact tensor bytes, no GPU involved).",
        "",
    ]
    not_run = report["planned"][len(sections) :]
    if not_run:
        lines += [f"Not run (the check stopped before them): {', '.join(not_run)}.", ""]
    lines += ["| section | status | seconds | error |", "| --- | --- | ---: | --- |"]
    for section in sections:
        status = status_text(section["status"], section["error"])
        error = "" if section["status"] == SKIPPED else markdown_cell(section["error"] or "")
        lines.append(f"| {section['title']} | {status} | {section['seconds']:.1f} | {error} |")
    lines.append("")
    for number, section in enumerate(sections, 1):
        lines += [f"## {number}. {section['title']}", ""]
        lines += [
            f"{status_text(section['status'], section['error'])} in {section['seconds']:.1f} s.",
            "",
        ]
        if section["status"] == FAILED:
            lines += [f"Error: {markdown_cell(cell_text(section['error']))}", ""]
        for table in section["tables"]:
            lines += render_table(table)
        lines += [*(f"{note}\n" for note in section["notes"])]
    return "\n".join(lines).rstrip() + "\n"


def report_data(
    hardware: str,
    budget_s: float,
    elapsed_s: float,
    planned: Sequence[str],
    results: list[SectionResult],
) -> dict:
    """Everything the report shows, as JSON-ready data."""
    return {
        "hardware": hardware,
        "budget_s": budget_s,
        "elapsed_s": elapsed_s,
        "planned": list(planned),
        "sections": [dataclasses.asdict(result) for result in results],
    }


def write_report(output: Path, report: dict) -> None:
    """The markdown page and the JSON beside it."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_report(report))
    output.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
