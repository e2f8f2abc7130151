"""Notebook 05's rank files, run for real by torchrun on 2 gloo ranks, and the launcher's failures.

The rank files live in ``examples/``; the notebook shows them with highlighting and runs them.
Rank 0 writes the measuring file's report to ``--report``, apart from what gloo prints on stdout.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.distributed_ranks import raise_on_rank, stall_on_rank
from tutorial_utils.training.distributed import DistributedRunError, check_spawnable, launch

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "05_checkpointing_at_scale.ipynb"
RANK_FILE = ROOT / "examples" / "ddp_fsdp_checkpointing.py"
REENTRANT_DDP_ERROR = "Expected to mark a variable ready only once"


def test_the_notebook_shows_both_rank_files_from_the_repository() -> None:
    code = "\n".join(
        c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"
    )
    for name in ("checkpointing_minimal.py", "ddp_fsdp_checkpointing.py"):
        assert f'show_example("{name}")' in code, name
        assert (ROOT / "examples" / name).is_file(), name
    assert "RANK_SCRIPT" not in code  # no rank file inside a string


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> str:
    """What rank 0 reports for a small model: a few seconds of work on 2 gloo ranks."""
    written = tmp_path_factory.mktemp("report") / "report.txt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(RANK_FILE), "--width", "32", "--depth", "4",
               "--batch", "512", "--turns", "2", "--report", str(written)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0  DDP " not in done.stdout  # the report goes to its file only
    return written.read_text(encoding="utf-8")


def test_torchrun_runs_two_gloo_ranks(report: str) -> None:
    assert report.startswith(
        "2 ranks on cpu (gloo); 4 blocks of width 32; global batch 512 = 256 per rank\n"
    )


def test_reentrant_checkpointing_of_a_shared_block_fails_on_every_rank_and_both_fixes_work(
    report: str,
) -> None:
    cases = dict.fromkeys(("use_reentrant=True", "use_reentrant=True, static_graph=True",
                           "use_reentrant=False"))  # fmt: skip
    for case in cases:
        lines = re.findall(rf"^  rank (\d)  {re.escape(case)}\s{{2,}}(.*)$", report, re.M)
        assert [rank for rank, _ in lines] == ["0", "1"], case
        cases[case] = {outcome for _, outcome in lines}
    assert cases["use_reentrant=True"] == {f"FAILED: {REENTRANT_DDP_ERROR}"}
    ok = {"ok, gradients equal one process's on the whole batch: True"}
    assert cases["use_reentrant=True, static_graph=True"] == ok
    assert cases["use_reentrant=False"] == ok


def memory(report: str) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(kept, forward+backward peak following resizes, peak_bytes' peak) per setup and rank."""
    found = re.findall(
        r"^  rank (\d)  (\S.*?)\s+([\d.]+) \|\s+([\d.]+) \|\s+([\d.]+)$", report, re.M
    )
    return {(setup, int(rank)): tuple(map(float, mib)) for rank, setup, *mib in found}


def test_fsdp_halves_the_model_state_and_checkpointing_lowers_the_peak(report: str) -> None:
    assert "\nMiB per rank, third step: " in report
    mib = memory(report)
    assert len(mib) == 8  # four setups, two ranks
    for rank in (0, 1):
        assert mib["FSDP", rank][0] == pytest.approx(mib["DDP", rank][0] / 2, rel=0.01)
        for setup in ("DDP", "FSDP"):
            plain, checkpointed = mib[setup, rank], mib[f"{setup} + checkpointing", rank]
            assert checkpointed[0] == plain[0]  # the model state does not change
            assert checkpointed[1] < plain[1] and checkpointed[2] < plain[2]  # the peak does


def test_only_fsdp_resizes_storages_that_peak_bytes_alone_misses(report: str) -> None:
    """DDP resizes no storage: both measures agree. FSDP2's all-gathered parameters come and go
    by storage resizes, which only the resize-following peak counts."""
    for (setup, _), (_, peak, ops_peak) in memory(report).items():
        if setup.startswith("DDP"):
            assert peak == ops_peak, setup
        else:
            assert peak > ops_peak, setup


def test_step_times_come_per_rank_with_and_without_checkpointing(report: str) -> None:
    for rank in (0, 1):
        for setup in ("DDP", "FSDP"):
            block = report.split(f"rank {rank}, {setup}:\n")[1].splitlines()[:4]
            assert [line.split()[:3] for line in block] == [
                ["cpu", "time", "plain"],
                ["cpu", "time", "checkpointed"],
                ["wall", "time", "plain"],
                ["wall", "time", "checkpointed"],
            ]
            assert "beyond noise" in block[1] and "beyond noise" in block[3]


def test_only_fsdp1_under_a_reentrant_checkpoint_gathers_again(report: str) -> None:
    """One step, 4 blocks: every wrapping order gathers as often, except FSDP1 under a reentrant
    checkpoint around each unit, which gathers each block once more (transformers' warning)."""
    found = re.findall(r"^  rank (\d)  (\S.*?)\s+(\d+) all-gathers \|.*\| float32 gradients$",
                       report, re.M)  # fmt: skip
    gathers = {(order, int(rank)): int(n) for rank, order, n in found}
    assert len(gathers) == 10  # five orders, two ranks
    for rank in (0, 1):
        inside = gathers["checkpoint, then fully_shard", rank]
        for order in ("fully_shard, then checkpoint", "fully_shard, then reentrant checkpoint",
                      "FSDP1, checkpoint inside each unit"):  # fmt: skip
            assert gathers[order, rank] == inside, order
        assert gathers["FSDP1, reentrant checkpoint around each unit", rank] == inside + 4


def test_a_failing_rank_gives_one_clear_error_and_leaves_no_process() -> None:
    with pytest.raises(
        DistributedRunError, match=r"^rank 1 failed: ValueError: rank 1 was told to fail$"
    ) as info:
        launch(raise_on_rank, 1, world_size=2, device_type="cpu", timeout_s=60)
    assert info.value.rank == 1
    assert "raise_on_rank" in info.value.rank_traceback
    assert multiprocessing.active_children() == []


def test_a_rank_over_its_time_is_stopped() -> None:
    with pytest.raises(DistributedRunError, match=r"TimeoutError: still running after"):
        launch(stall_on_rank, 1, 120, world_size=2, device_type="cpu", timeout_s=3)
    assert multiprocessing.active_children() == []


def test_functions_a_spawned_process_cannot_import_are_refused_before_launch() -> None:
    def local_function(ctx):
        return ctx.rank

    with pytest.raises(ValueError, match="top level of an importable module"):
        check_spawnable(local_function)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        launch(raise_on_rank, 0, world_size=0, device_type="cpu")


def test_the_copy_cells_show_the_distributed_setup() -> None:
    """The calls a learner copies are in the notebook's code, not behind a helper."""
    cells = [c for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    copied = "\n".join(c.source for c in cells if "copy" in c.metadata.get("tags", []))
    for call in ("init_process_group(", "DistributedDataParallel(", "static_graph=True",
                 "checkpoint(", "apply_activation_checkpointing(", "fully_shard(",
                 "MixedPrecisionPolicy("):  # fmt: skip
        assert call in copied, call
    assert any("find_unused_parameters=True" in c.source for c in cells)
