"""The GPU check's CPU side: the report, section isolation, the time budget, the decisions.

Its GPU figures exist only once ``scripts/gpu_check.py`` has run on a GPU; here every section's
logic (a module of ``tutorial_utils/gpu_check/``) is driven with made-up results, a faked device
count, a faked notebook executor and a fake clock, and the cross-check's dry-run half runs for
real on the meta device.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Annotated, NotRequired, TypedDict

import pytest
import torch
import torch.nn as nn

from tutorial_utils.articles.experiments import adam_optimizer
from tutorial_utils.articles.profiles import PROFILE_ENV
from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.display.figure_check import CHECK_FIGURES_ENV
from tutorial_utils.gpu_check import allocator, nccl, runner
from tutorial_utils.gpu_check.batch_search import (
    SEARCH_BUDGET_BYTES,
    SEARCH_SAMPLE,
    _neta_plain,
    batch_search_outcome,
    first_out_of_memory,
)
from tutorial_utils.gpu_check.crosscheck import (
    STEPS,
    CrossCheckStep,
    crosscheck,
    crosscheck_outcome,
    dry_run_row,
)
from tutorial_utils.gpu_check.estimate import ESTIMATE_CHECKS, estimate_outcome, estimate_rows
from tutorial_utils.gpu_check.nccl import nccl_rank, nccl_section, nccl_skip_reason
from tutorial_utils.gpu_check.notebooks import (
    MIN_NOTEBOOK_S,
    NOTEBOOKS,
    NOTEBOOKS_DIR,
    RESERVE_S,
    execute_copy,
    notebook_env,
    notebook_timeout,
    notebooks_section,
    stopping_cell,
)
from tutorial_utils.gpu_check.offloading import offloading_outcome
from tutorial_utils.gpu_check.report import (
    DRY_RUN,
    FAILED,
    MEASURED,
    PASSED,
    SKIPPED,
    Column,
    Outcome,
    SectionResult,
    Shown,
    Table,
    columns_of,
    one_line,
    relative_error,
    render_report,
    render_table,
    report_data,
    write_report,
)
from tutorial_utils.gpu_check.runner import Budget, Section, exit_status, run_section, run_sections
from tutorial_utils.measurement.batch_search import BatchTrial, MaxBatchResult
from tutorial_utils.measurement.dry_run import build_on_meta, dry_run_step
from tutorial_utils.measurement.gradients import compare_gradients
from tutorial_utils.measurement.step import Recording, default_optimizer
from tutorial_utils.units import MiB

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script = _load_script()  # main, SECTIONS and the defaults; the rest is tutorial_utils.gpu_check


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _budget(total_s: float = 540.0) -> tuple:
    clock = FakeClock()
    return Budget(total_s, clock), clock


def _report(results, planned=None, hardware="cuda (NVIDIA Test GPU); 1 GPU(s) visible") -> dict:
    planned = planned or [result.title for result in results]
    return report_data(hardware, 540.0, 123.4, planned, results)


# -- the report -------------------------------------------------------------------------------


def _made_up_results() -> list:
    table = Table(
        "Figures",
        [
            Column("name", "name"),
            Column("peak MiB", "peak", "{:.1f}", MEASURED),
            Column("peak MiB", "dry", "{:.1f}", DRY_RUN),
            Column("equal", "equal", "{}", MEASURED),
        ],
        [
            {"name": "a | b", "peak": 12.345, "dry": 12.0, "equal": True},
            {"name": "c", "peak": None, "dry": 3.0, "equal": False},
        ],
    )
    return [
        SectionResult("one", "First", PASSED, 1.25, [table], ["A note."]),
        SectionResult("two", "Second", FAILED, 0.5, error="RuntimeError: boom", traceback="tb"),
        SectionResult("nccl", "Two NCCL ranks", SKIPPED, 0.0, error="one GPU visible"),
    ]


def test_report_names_the_hardware_first_and_labels_every_figure():
    text = render_report(_report(_made_up_results(), ["First", "Second", "Two NCCL ranks"]))
    lines = text.splitlines()
    assert lines[0] == "# GPU check"
    assert lines[2] == "Hardware: cuda (NVIDIA Test GPU); 1 GPU(s) visible."
    assert "3 of 3 sections ran in 123 s (budget 540 s): 1 passed, 1 failed, 1 skipped." in text
    assert "Not run" not in text
    header = next(line for line in lines if line.startswith("| name "))
    assert header == (
        "| name | peak MiB (measured on the GPU) | peak MiB (dry run) | equal (measured on the GPU) |"
    )
    assert "| a \\| b | 12.3 | 12.0 | yes |" in lines  # a pipe in a cell does not split it
    assert "| c | n/a | 3.0 | no |" in lines
    assert "A note." in lines


def test_report_gives_failed_and_skipped_sections_their_line():
    text = render_report(_report(_made_up_results()))
    lines = text.splitlines()
    assert "| First | passed | 1.2 |  |" in lines
    assert "| Second | FAILED | 0.5 | RuntimeError: boom |" in lines
    assert "| Two NCCL ranks | skipped: one GPU visible | 0.0 |  |" in lines
    assert "Error: RuntimeError: boom" in lines  # in the section's own part too
    assert "skipped: one GPU visible in 0.0 s." in lines
    assert [line for line in lines if line.startswith("## ")] == [
        "## 1. First",
        "## 2. Second",
        "## 3. Two NCCL ranks",
    ]


def test_a_run_cut_short_says_which_sections_did_not_run():
    results = _made_up_results()[:1]
    text = render_report(_report(results, ["First", "Second", "Third"]))
    assert "1 of 3 sections ran" in text
    assert "Not run (the check stopped before them): Second, Third." in text


def test_report_and_json_written_side_by_side_render_the_same(tmp_path):
    report = _report(_made_up_results())
    output = tmp_path / "docs" / "gpu_report.md"
    write_report(output, report)
    saved = json.loads(output.with_suffix(".json").read_text())
    assert saved["sections"][1]["traceback"] == "tb"
    assert render_report(saved) == output.read_text()  # rendering needs only the JSON


# -- isolation and exit status ----------------------------------------------------------------


def test_a_section_that_raises_does_not_stop_the_others(monkeypatch):
    freed = []
    monkeypatch.setattr(runner, "free_cuda_memory", lambda: freed.append(True))
    seen_at_start = []

    def section(outcome=None, error=None):
        def run(budget):
            seen_at_start.append(len(freed))
            if error is not None:
                raise error
            return outcome

        return run

    sections = [
        Section("ok", "OK", section(Outcome())),
        Section("raises", "Raises", section(error=RuntimeError("boom\nmore detail"))),
        Section("checks", "Checks", section(Outcome(failures=["x is 1", "y is 2"]))),
        Section("skips", "Skips", section(Outcome(skipped="one GPU visible"))),
    ]
    progress = []
    budget, _ = _budget()
    results = run_sections(
        sections, budget, lambda so_far: progress.append([r.key for r in so_far])
    )
    assert [r.status for r in results] == ["passed", "FAILED", "FAILED", "skipped"]
    assert results[1].error == "RuntimeError: boom"
    assert "Traceback" in results[1].traceback and "more detail" in results[1].traceback
    assert results[2].error == "x is 1; y is 2" and results[2].traceback is None
    assert seen_at_start == [0, 1, 2, 3]  # memory freed between sections
    assert progress == [
        ["ok"],
        ["ok", "raises"],
        ["ok", "raises", "checks"],
        [s.key for s in sections],
    ]
    assert all(r.seconds >= 0 for r in results)
    assert exit_status(results) == 1
    assert exit_status([results[0], results[3]]) == 0  # skipped is not failed


def test_one_line_takes_a_cells_error_name_and_value():
    class CellError(Exception):
        ename, evalue = "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2 GiB\nmore"

    assert one_line(CellError("long text with the cell's source")) == (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    )
    assert one_line(ValueError("")) == "ValueError"


def test_without_cuda_it_exits_2_and_writes_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    default = script.DEFAULT_OUTPUT
    before = default.read_bytes() if default.exists() else None
    assert script.main(["--output", str(tmp_path / "docs" / "report.md")]) == 2
    assert script.main([]) == 2
    assert list(tmp_path.iterdir()) == []
    assert (default.read_bytes() if default.exists() else None) == before
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 2  # one line per call
    assert "run it on a machine with a GPU" in captured.err


def test_main_rewrites_the_report_after_each_section(monkeypatch, capsys, tmp_path):
    """With CUDA faked and the sections replaced: what a cut-short run would leave, and the exit."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(script, "hardware_line", lambda device: "cuda (Fake GPU)")
    monkeypatch.setattr(runner, "free_cuda_memory", lambda: None)
    output = tmp_path / "gpu_report.md"
    seen = []

    def second(budget):
        seen.append(json.loads(output.with_suffix(".json").read_text()))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    sections = (Section("a", "First", lambda budget: Outcome()), Section("b", "Second", second))
    monkeypatch.setattr(script, "SECTIONS", sections)
    assert script.main(["--output", str(output), "--budget-s", "60"]) == 1
    (partial,) = seen
    assert [s["title"] for s in partial["sections"]] == ["First"]
    assert partial["planned"] == ["First", "Second"]
    text = output.read_text()
    assert text.splitlines()[2] == "Hardware: cuda (Fake GPU); 1 GPU(s) visible."
    assert "| Second | FAILED |" in text and "OutOfMemoryError: CUDA out of memory." in text
    out = capsys.readouterr().out
    assert "First: passed in " in out and "Second: FAILED in " in out
    assert "s (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)" in out


def test_the_script_runs_every_section_module_once_the_notebooks_last():
    """Each module of tutorial_utils/gpu_check but the report and the runner is one section; one
    left out of the script would never run on the GPU."""
    import pkgutil

    import tutorial_utils.gpu_check as package

    names = {m.name for m in pkgutil.iter_modules(package.__path__)} - {"report", "runner"}
    sections = {
        importlib.import_module(f"tutorial_utils.gpu_check.{name}").SECTION for name in names
    }
    assert set(script.SECTIONS) == sections and len(script.SECTIONS) == len(sections)
    assert script.SECTIONS[-1].key == "notebooks"  # it takes what the budget has left


# -- NCCL -------------------------------------------------------------------------------------


def test_nccl_is_skipped_not_failed_on_one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(nccl, "launch", lambda *a, **k: pytest.fail("launched on one GPU"))
    budget, _ = _budget()
    result = run_section(Section("nccl", "Two NCCL ranks", nccl_section), budget)
    assert result.status == SKIPPED and result.error == "one GPU visible"
    assert exit_status([result]) == 0
    assert nccl_skip_reason(0) == "0 GPUs visible"
    assert nccl_skip_reason(2) is None


@pytest.mark.parametrize(("sums", "status"), [((3.0, 3.0), "passed"), ((3.0, 2.0), "FAILED")])
def test_nccl_runs_two_ranks_where_two_gpus_exist(monkeypatch, sums, status):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    calls = []

    def fake_launch(fn, *args, world_size, device_type, timeout_s):
        calls.append((fn, world_size, device_type))
        return [
            {"rank": r, "device": f"cuda:{r}", "gpu": "Test", "backend": "nccl", "sum": s,
             "all_equal": True, "expected": 3.0, "seconds": 0.01}
            for r, s in enumerate(sums)
        ]  # fmt: skip

    monkeypatch.setattr(nccl, "launch", fake_launch)
    budget, _ = _budget()
    result = run_section(Section("nccl", "Two NCCL ranks", nccl_section), budget)
    assert calls == [(nccl_rank, 2, "cuda")]
    assert result.status == status
    assert (result.error is None) == (status == "passed")
    assert len(result.tables[0].rows) == 2


# -- notebooks --------------------------------------------------------------------------------


def _notebook(sources: list[str], counts: list[int | None]) -> dict:
    cells = [
        {"cell_type": "code", "id": f"cell-{index}", "source": source, "execution_count": count,
         "metadata": {}, "outputs": []}
        for index, (source, count) in enumerate(zip(sources, counts, strict=True))
    ]  # fmt: skip
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def source(tmp_path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name in NOTEBOOKS:
        (folder / name).write_text(json.dumps(_notebook(["print(1)", "x = 2"], [None, None])))
    return folder


def test_the_checked_notebooks_are_the_projects_02_and_03():
    assert NOTEBOOKS_DIR == ROOT / "notebooks"
    assert all((NOTEBOOKS_DIR / name).is_file() for name in NOTEBOOKS)
    assert [name[:2] for name in NOTEBOOKS] == ["02", "03"]


def test_notebooks_run_as_copies_in_the_gpu_profile(monkeypatch, source):
    monkeypatch.setenv("MPLBACKEND", "agg")
    monkeypatch.setenv(PROFILE_ENV, "ci")
    original = _digests(source)
    budget, clock = _budget(315.0)
    calls = []

    def executor(path, env, timeout_s):
        calls.append((path, dict(env), timeout_s))
        assert path.parent != source and source not in path.parents
        assert hashlib.sha256(path.read_bytes()).hexdigest() == original[path.name]
        path.write_text(json.dumps(_notebook(["print(1)", "x = 2"], [1, 2])))  # ran in place
        clock.now += 100.0

    outcome = notebooks_section(budget, executor, source)
    assert [path.name for path, _, _ in calls] == list(NOTEBOOKS)
    for _, env, _ in calls:
        assert env[PROFILE_ENV] == "gpu" and env[CHECK_FIGURES_ENV] == "1"
        assert "MPLBACKEND" not in env
    # an equal share of (315 - 15) for the first; the second gets all that is left after it
    assert [timeout for _, _, timeout in calls] == [150.0, 200.0]
    assert _digests(source) == original  # the originals are untouched
    assert not any(path.exists() for path, _, _ in calls)  # the copies went with their folder
    assert outcome.failures == []
    (table,) = outcome.tables
    assert [row["status"] for row in table.rows] == ["passed", "passed"]
    assert all(row["profile"] == "gpu" and row["seconds"] >= 0 for row in table.rows)


def test_a_failing_notebook_is_reported_with_its_cell_and_the_next_still_runs(source):
    budget, _ = _budget()
    ran = []

    class CellExecutionError(Exception):
        ename, evalue = "ZeroDivisionError", "division by zero"

    def executor(path, env, timeout_s):
        ran.append(path.name)
        if path.name.startswith("02"):
            path.write_text(json.dumps(_notebook(["import x", "1 / 0\nmore", "y"], [1, 2, None])))
            raise CellExecutionError("the cell's source and traceback")

    outcome = notebooks_section(budget, executor, source)
    assert ran == list(NOTEBOOKS)
    first, second = outcome.tables[0].rows
    assert first["status"] == "FAILED" and first["error"] == "ZeroDivisionError: division by zero"
    assert first["cell"] == "code cell 2 of 3: 1 / 0"
    assert second["status"] == "passed"
    assert outcome.failures == [f"{NOTEBOOKS[0]}: ZeroDivisionError: division by zero"]


def test_notebooks_are_not_started_once_the_budget_is_spent(source):
    budget, clock = _budget(540.0)
    clock.now += 540.0 - RESERVE_S - MIN_NOTEBOOK_S - 5.0
    allowed = []

    def executor(path, env, timeout_s):
        allowed.append(timeout_s)
        clock.now += 10.0  # too little is left for the second

    outcome = notebooks_section(budget, executor, source)
    statuses = [row["status"] for row in outcome.tables[0].rows]
    assert statuses == ["passed", "not run: the time budget is spent"]
    assert allowed == [MIN_NOTEBOOK_S + 5.0]  # no half shares: the first takes it all
    assert outcome.failures == [f"{NOTEBOOKS[1]}: not run: the time budget is spent"]


def test_notebook_timeout_shares_what_is_left_after_the_reserve():
    reserve, least = RESERVE_S, MIN_NOTEBOOK_S
    assert notebook_timeout(reserve + 300.0, 2) == 150.0
    assert notebook_timeout(reserve + 300.0, 1) == 300.0
    assert notebook_timeout(reserve + least, 1) == least
    assert notebook_timeout(reserve + least - 1, 1) is None
    assert notebook_timeout(reserve + 2 * least - 1, 2) == 2 * least - 1
    assert script.DEFAULT_BUDGET_S < 600  # the device machine's limit for one command


def test_budget_counts_from_its_creation():
    budget, clock = _budget(100.0)
    clock.now += 30.0
    assert budget.elapsed() == 30.0 and budget.left() == 70.0


def test_stopping_cell_is_the_last_that_started(tmp_path):
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(_notebook(["a = 1", "", "while True: pass"], [1, 2, 3])))
    assert stopping_cell(path) == "code cell 3 of 3: while True: pass"
    path.write_text(json.dumps(_notebook(["a = 1"], [None])))
    assert stopping_cell(path) is None


# -- batch search and offloading, from made-up figures ----------------------------------------


def _search(batches_fit: list[tuple[int, bool]], mode: str = "cuda") -> MaxBatchResult:
    trials = [
        BatchTrial(b, fits, None if not fits else b * MiB, None if fits else "CUDA out of memory.")
        for b, fits in batches_fit
    ]
    best = max((b for b, fits in batches_fit if fits), default=0)
    return MaxBatchResult(best, trials, SEARCH_BUDGET_BYTES, 0, mode, "cuda")


DOUBLING = [(1, True), (2, True), (4, True), (8, True), (16, True), (32, True), (64, False)]
BISECTION = [(48, True), (56, False), (52, False), (50, True), (51, False)]


def test_the_search_size_makes_the_doubling_phase_overflow_the_card():
    """The dry run (exact tensor bytes) already puts NetA's plain step at batch 64 over the card,
    so the capped search's doubling phase must meet an out-of-memory error there or before."""
    peak = dry_run_step(
        build_on_meta(_neta_plain),
        (64, *SEARCH_SAMPLE),
        optimizer_factory=adam_optimizer,
        recording=Recording(round_to_blocks=True),
    ).peak_bytes
    assert peak > SEARCH_BUDGET_BYTES


def test_batch_search_outcome_passes_only_when_the_oom_was_survived():
    capped, tracked = _search(DOUBLING + BISECTION), _search(DOUBLING + BISECTION, "tracked")
    good = batch_search_outcome(capped, tracked, 1000, 1000, True)
    assert good.failures == []
    row = good.tables[0].rows[0]
    assert row["batch_size"] == 50 and row["first_over"] == 64 and row["doubling"] is True
    assert row["tried"].startswith("1, 2, 4, 8, 16, 32, 64 (over), 48, 56 (over)")
    assert good.tables[1].rows == [{"before": 1000, "after": 1000, "difference": 0, "alive": True}]
    leaked = batch_search_outcome(capped, tracked, 1000, 1512, True)
    assert leaked.failures == ["memory_allocated 1512 B after the search, 1000 B before"]
    no_oom = batch_search_outcome(_search(DOUBLING[:-1]), tracked, 0, 0, False)
    assert len(no_oom.failures) == 2 and "OOM path was not exercised" in no_oom.failures[0]
    late = first_out_of_memory(_search([(1, True), (3, False)]))
    assert late["batch"] == 3 and late["doubling"] is False


def test_offloading_outcome_needs_a_lower_peak_and_the_same_gradients():
    plain = [torch.ones(3), torch.arange(4.0)]
    same = compare_gradients(plain, [g.clone() for g in plain])
    assert same == {"parameters": 2, "bitwise": True, "close": True, "max_difference": 0.0}
    off = compare_gradients(plain, [plain[0] + 1e-7, plain[1] + 1.0])
    assert off["bitwise"] is False and off["close"] is False and off["max_difference"] == 1.0
    rows = [
        {"step": "plain", "cuda_peak_allocated_mib": 100.0},
        {"step": "offloaded", "cuda_peak_allocated_mib": 60.0},
    ]
    assert offloading_outcome(rows, same).failures == []
    rows[1]["cuda_peak_allocated_mib"] = 100.0
    failures = offloading_outcome(rows, off).failures
    assert failures == [
        "offloading did not lower the CUDA peak allocated",
        "gradients differ by up to 1",
    ]


# -- the cross-check ---------------------------------------------------------------------------


def test_crosscheck_dry_run_rows_are_in_cuda_blocks_and_ordered():
    rows = [dry_run_row(step) for step in STEPS]
    assert all(round(row["dry_run_peak_mib"] * MiB) % 512 == 0 for row in rows)
    article_plain, article_two, flat_six, neta_plain, neta_checkpointed = rows
    assert article_two["dry_run_peak_mib"] == article_plain["dry_run_peak_mib"]
    assert flat_six["dry_run_peak_mib"] < article_plain["dry_run_peak_mib"]
    assert neta_checkpointed["dry_run_peak_mib"] < neta_plain["dry_run_peak_mib"]
    assert {row["optimizer"] for row in rows} == {"SGD momentum", "Adam"}


def test_crosscheck_claims_no_error_without_a_gpu():
    step = CrossCheckStep(
        "chain", lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)),
        (5, 8), 3, equal_segments(2), "SGD momentum", default_optimizer,
    )  # fmt: skip
    (row,) = crosscheck(torch.device("cpu"), (step,))
    assert row["dry_run_peak_mib"] >= row["tracked_peak_mib"]  # rounding up never lowers
    assert row["dry_run_error"] is None and row["tracker_error"] is None
    outcome = crosscheck_outcome([row])
    assert outcome.failures == ["chain, 2 segments: no CUDA peak allocated"]  # the name
    (table,) = outcome.tables
    (line,) = [
        line for line in render_table(dataclasses.asdict(table)) if line.startswith("| chain")
    ]
    assert "%" not in line and line.count("n/a") == 5  # CUDA allocated/reserved, 2 errors, NVML


def test_crosscheck_table_gives_both_errors_against_cuda():
    row = {
        "step": "VGG16 (article)",
        "strategy": "2 segments",
        "batch": 32,
        "optimizer": "SGD momentum",
        "tracked_peak_mib": 99.0,
        "dry_run_peak_mib": 101.0,
        "cuda_peak_allocated_mib": 100.0,
        "tracker_error": relative_error(99.0, 100.0),
        "dry_run_error": relative_error(101.0, 100.0),
        "cuda_peak_reserved_mib": 120.0,
        "nvml_used_mib": None,
        "step_seconds": 0.25,
        "tracked_baseline_mib": 10.0,
        "cuda_allocated_before_mib": 10.5,
    }
    outcome = crosscheck_outcome([row])
    assert outcome.failures == []
    lines = render_table(dataclasses.asdict(outcome.tables[0]))
    assert (
        "| VGG16 (article) | 2 segments | 32 | SGD momentum | 101.0 | 99.0 | 100.0 | -1.00% | +1.00% "
        "| 120.0 | n/a | 0.250 |" in lines
    )
    assert "tracked peak MiB (measured on the GPU)" in lines[2]
    assert "peak MiB, 512 B blocks (dry run)" in lines[2]
    assert any("10.0 MiB while CUDA had 10.5 MiB" in note for note in outcome.notes)


def test_execute_copy_runs_a_real_kernel_with_the_env_and_stops_at_the_deadline(
    monkeypatch, tmp_path
):
    """The one test that starts a kernel (about 4 s): execute_notebooks.run_notebook gets the
    environment to the kernel, bounds the notebook by its deadline and keeps what ran."""
    from nbclient.exceptions import CellTimeoutError

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # execute_notebooks imports stamp_colab
    path = tmp_path / "copy.ipynb"
    sources = [f"import os; print(os.environ['{PROFILE_ENV}'])", "import time; time.sleep(30)"]
    path.write_text(json.dumps(_notebook(sources, [None, None])))
    started = time.monotonic()
    with pytest.raises(CellTimeoutError):
        execute_copy(path, notebook_env(os.environ), timeout_s=3)
    assert time.monotonic() - started < 20  # the sleeping cell was cut short
    cells = json.loads(path.read_text())["cells"]
    assert "".join(cells[0]["outputs"][0]["text"]) == "gpu\n"
    assert stopping_cell(path) == "code cell 2 of 2: import time; time.sleep(30)"


def test_estimate_rows_without_a_gpu_claim_no_error(tmp_path):
    """The estimate section's CPU side: a dry run beside a real CPU step of the same workload
    (equal but for AdamW's 4-byte step counters, which the CPU step holds on its device and a
    CUDA step does not), and a failure line for the missing CUDA peak."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 300}
        )
    )
    check = (f"hf:{config}", 2, 32, "fp32", 0, "every-block")
    (row,) = estimate_rows(torch.device("cpu"), (check,))
    trained_tensors = 2 * 12 + 4  # GPT-2: 12 tensors per block, embeddings and final LayerNorm
    counters_mib = 4 * trained_tensors / MiB
    assert row["tracked_peak_mib"] - row["estimate_mib"] <= counters_mib  # blocks round up
    assert row["cuda_peak_allocated_mib"] is None and row["estimate_error"] is None
    outcome = estimate_outcome([row])
    assert outcome.failures == [f"hf:{config} every-block: no CUDA peak allocated"]
    off = {**row, "cuda_peak_allocated_mib": 1.0, "estimate_error": 0.05}
    assert "off by +5.00%" in estimate_outcome([off]).failures[0]
    assert estimate_outcome([{**off, "estimate_error": 0.01}]).failures == []


def test_estimate_checks_are_valid_workloads():
    from tutorial_utils.estimate.estimator import Workload
    from tutorial_utils.estimate.strategies import parse_strategy

    for model, batch, size, precision, lora, strategy in ESTIMATE_CHECKS:
        Workload(model, batch=batch, size=size, precision=precision, lora_rank=lora)
        parse_strategy(strategy)
    assert any(check[3].startswith("amp-") for check in ESTIMATE_CHECKS)


def test_allocator_section_judges_both_counters(tmp_path):
    """The allocator section's CPU side: its checks are valid workloads, a tiny one's prediction
    runs here, and a row fails without a measured counter or beyond its tolerance."""
    from tutorial_utils.estimate.estimator import Workload
    from tutorial_utils.estimate.strategies import parse_strategy

    assert "allocator" in [section.key for section in script.SECTIONS]
    for model, batch, size, precision, lora, strategy in allocator.ALLOCATOR_CHECKS:
        Workload(model, batch=batch, size=size, precision=precision, lora_rank=lora)
        parse_strategy(strategy)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 300}
        )
    )
    predicted = allocator.predicted_counters(
        Workload(f"hf:{config}", batch=2, size=32, precision="fp32"), "every-block"
    )
    assert predicted.max_reserved_bytes >= predicted.max_allocated_bytes > 0
    row = {
        "model": "hf:gpt2",
        "strategy": "none",
        "allocated_error": 0.01,
        "reserved_error": None,
    }
    assert allocator.allocator_failures([row]) == ["hf:gpt2 none: no CUDA reserved peak"]
    row["reserved_error"] = -0.5
    assert allocator.allocator_failures([row]) == [
        "hf:gpt2 none: predicted reserved off by -50.00%"
    ]


def test_a_rows_columns_are_declared_once_on_its_fields():
    """``columns_of`` reads each shown field's header, format and source off its TypedDict, in
    field order, base first, through ``NotRequired``; a field without ``Shown`` is no column."""

    class Base(TypedDict):
        step: Annotated[str, Shown("step")]
        hidden: int

    class Row(Base):
        peak_mib: NotRequired[Annotated[float, Shown("peak MiB", "{:.1f}", MEASURED)]]

    columns = columns_of(Row)
    assert [(c.header, c.key, c.fmt, c.source) for c in columns] == [
        ("step", "step", "{}", None),
        ("peak MiB", "peak_mib", "{:.1f}", MEASURED),
    ]
