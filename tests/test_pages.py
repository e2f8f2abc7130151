"""The README's tables and docs/RESULTS.md say what the committed notebooks' runs printed.

``scripts/write_pages.py`` writes them from the notebooks' headlines and execution metadata. These
tests hold the committed pages equal to what it would write now (so a re-executed notebook cannot
leave a stale page behind), and check the generator itself on a small notebook built here.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import write_pages  # noqa: E402

from tutorial_utils.display.headlines import HEADLINE_MIME  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PAGE = (
    "# Title\n\nKept by hand.\n\n<!-- pages:{0}:begin -->\nold\n<!-- pages:{0}:end -->\n\nKept.\n"
)


def executed(source: str, start: str, end: str, outputs: list[dict] | None = None) -> dict:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["execution"] = {"iopub.status.busy": start, "iopub.status.idle": end}
    cell.outputs = [nbformat.from_dict(o) for o in outputs or []]
    return cell


def headline_output(key: str, text: str, **figures: object) -> dict:
    data = {HEADLINE_MIME: {"key": key, "text": text, "figures": figures}, "text/plain": text}
    return {"output_type": "display_data", "data": data, "metadata": {}}


def small_project(tmp_path: Path, ratio: float = 1.34) -> Path:
    """A repository of one executed notebook with one headline, and pages with markers."""
    cells = [
        nbformat.v4.new_markdown_cell("# 01 · A small lesson\n\nThe idea, in six words here."),
        executed(
            "print('profile')",
            "2026-12-04T10:00:00Z",
            "2026-12-04T10:00:30Z",
            [{"output_type": "stream", "name": "stdout", "text": "profile: cpu\ntorch 2.15.0\n"}],
        ),
        executed(
            "a = 1\n\nb = 2\n",
            "2026-12-04T10:00:30Z",
            "2026-12-04T10:01:30Z",
            [
                headline_output(
                    "chain_cost",
                    f"Checkpointing cost x{ratio:.1f} CPU time, beyond noise",
                    cpu_time_ratio=ratio,
                    beyond_noise=True,
                    peak_mib=20.0,
                )
            ],
        ),
        nbformat.v4.new_markdown_cell("## Exercises"),
        executed("c = 3", "2026-12-04T10:01:30Z", "2026-12-04T10:03:00Z"),
    ]
    (tmp_path / "notebooks").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / "notebooks" / "01_small.ipynb")
    (tmp_path / "docs").mkdir()
    readme = PAGE.format("tour") + "".join(
        PAGE.format(name).replace("# Title\n\n", "") for name in ("headlines", "cards")
    )
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    (tmp_path / "docs" / "RESULTS.md").write_text(PAGE.format("runs"), encoding="utf-8")
    return tmp_path


def test_the_generator_writes_the_runs_figures_and_keeps_the_hand_kept_text(tmp_path: Path) -> None:
    root = small_project(tmp_path)
    assert write_pages.main(["--root", str(root), "--check"]) == 1  # "old" stands there
    assert write_pages.main(["--root", str(root)]) == 0
    assert write_pages.main(["--root", str(root), "--check"]) == 0
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert "Kept by hand." in readme and "old" not in readme
    assert "| `h100` | H100 | 9.0, Hopper |" in readme  # the card list, from the GPU table
    assert "| Checkpointing cost x1.3 CPU time, beyond noise |" in readme
    assert "CPU x1.3, beyond noise in CPU time" not in readme  # the clock is said once
    assert "| Checkpointing cost x1.3 CPU time, beyond noise |" in readme  # verbatim, as printed
    # minutes: 3 code lines at 10 a minute, 10 words at 150, and the core's 90 s of cells (not
    # the exercise's 90 s)
    assert "| 0 + 0 + 1.5 = **2** |" in readme
    results = (root / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    assert "| `01_small` | cpu | 2.15.0 | 2026-12-04 | 180.0 | 90.0 | 3 | 10 |" in results


def test_a_rerun_with_another_figure_makes_the_check_fail(tmp_path: Path) -> None:
    root = small_project(tmp_path)
    write_pages.main(["--root", str(root)])
    (tmp_path / "rerun").mkdir()
    small_project(tmp_path / "rerun", ratio=1.52)
    (root / "notebooks" / "01_small.ipynb").write_bytes(
        (tmp_path / "rerun" / "notebooks" / "01_small.ipynb").read_bytes()
    )
    assert write_pages.main(["--root", str(root), "--check"]) == 1
    write_pages.main(["--root", str(root)])
    assert "Checkpointing cost x1.5 CPU time, beyond noise" in (root / "README.md").read_text(
        encoding="utf-8"
    )


def test_a_notebook_without_headlines_fails_unless_it_is_pending(tmp_path: Path) -> None:
    root = small_project(tmp_path)
    path = root / "notebooks" / "01_small.ipynb"
    notebook = json.loads(path.read_text(encoding="utf-8"))
    notebook["cells"][2]["outputs"] = []
    path.write_text(json.dumps(notebook), encoding="utf-8")
    assert write_pages.main(["--root", str(root)]) == 1


def test_a_page_without_its_markers_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = small_project(tmp_path)
    (root / "docs" / "RESULTS.md").write_text("# Results\n", encoding="utf-8")
    assert write_pages.main(["--root", str(root)]) == 2
    assert "docs/RESULTS.md: needs one <!-- pages:runs:begin -->" in capsys.readouterr().err


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_records_headlines_unless_it_is_pending(path: Path) -> None:
    recorded = write_pages.read_run(path).headlines
    if path.stem in write_pages.PENDING_HEADLINES:
        assert not recorded, (
            f"{path.stem} records headlines now: remove it from write_pages.PENDING_HEADLINES"
        )
        pytest.skip(f"{path.stem} is in write_pages.PENDING_HEADLINES (no headline recorded yet)")
    assert recorded, f"{path.stem}: no record_headline output; re-execute it (2-5 headlines)"


def test_the_committed_pages_say_what_the_notebooks_printed() -> None:
    runs = write_pages.notebook_runs(ROOT)
    stale = [
        str(page.relative_to(ROOT))
        for page, text in write_pages.written_pages(ROOT, runs).items()
        if page.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"{stale} disagree with the notebooks: run `python scripts/write_pages.py`"


def test_the_committed_outputs_come_from_the_pinned_torch_in_the_cpu_profile() -> None:
    import setup  # scripts/setup.py: the torch release the setup installs here

    (pin,) = [p for p in setup.TORCH_PINS["Linux", "x86_64"].pins if p.startswith("torch==")]
    pinned = pin.removeprefix("torch==")
    made = {run.stem: (run.profile, run.torch_version) for run in write_pages.notebook_runs(ROOT)}
    other = {stem: m for stem, m in made.items() if m != ("cpu", pinned)}
    assert not other, (
        f"re-execute with `scripts/execute_notebooks.py --profile cpu` under torch {pinned}: {other}"
    )


def test_the_seven_cores_take_three_hours_or_less() -> None:
    runs = write_pages.notebook_runs(ROOT)
    minutes = {run.stem: round(sum(run.minutes), 1) for run in runs}
    assert sum(sum(run.minutes) for run in runs) <= write_pages.CORE_MINUTES_TARGET, (
        f"the seven cores take more than {write_pages.CORE_MINUTES_TARGET} minutes: {minutes}"
    )


OUTSIDE = re.compile(r"(?<![\w.-])(?:\.\./)*shared/|/work/")  # the workspace around the repository
TEXT_SUFFIXES = {".md", ".py", ".txt", ".toml", ".yml", ".yaml", ".cfg", ".sh", ".ipynb"}


def sources_of(path: Path) -> str:
    """A file's text as the repository holds it; a notebook's cell sources only (its outputs
    print paths of the machine that ran it)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return text
    return "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])


def test_the_readme_stays_a_page_a_learner_reads() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 20_000, f"README.md is {size:,} bytes: move reference material to docs/"


def repository_text_files() -> list[Path]:
    """The repository's text files, without the environment, caches and build outputs."""
    skipped = {".git", ".venv", "node_modules", "test-artifacts", "__pycache__"}
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if d not in skipped and not d.endswith(".egg-info")]
        found += [Path(folder, name) for name in files if Path(name).suffix in TEXT_SUFFIXES]
    return sorted(found)


def test_nothing_in_the_repository_points_outside_it() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)!r}"
        for path in repository_text_files()
        if path != Path(__file__)
        for match in OUTSIDE.finditer(sources_of(path))
    ]
    assert not found, f"paths outside the repository (cite by title, author, venue): {found}"
