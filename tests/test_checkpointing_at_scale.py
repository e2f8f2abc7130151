"""Notebook 05's rank files under real torchrun, their readable errors, and the panel's drawing."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.patches import Rectangle

from tutorial_utils.display.figure_check import figure_problems
from tutorial_utils.lessons.checkpointing_at_scale import (
    SETUPS,
    RankError,
    all_gathers,
    example_file,
    parse_rank_output,
    plot_scale_run,
    rank_report,
    run_ranks,
    scale_panel,
    show_example,
)

RANK_FILE = Path(__file__).parents[1] / "examples" / "ddp_fsdp_checkpointing.py"
MINIMAL_FILE = Path(__file__).parents[1] / "examples" / "checkpointing_minimal.py"

# rank 0's output at --width 64 --depth 4 --batch 256 --turns 2 (two gloo ranks)
SAMPLE = """\
2 ranks on cpu (gloo); 4 blocks of width 64; global batch 256 = 128 per rank

DDP, the block shared by all 4 applications, each checkpointed:
  rank 0  use_reentrant=True                     FAILED: Expected to mark a variable ready only once
  rank 1  use_reentrant=True                     FAILED: Expected to mark a variable ready only once
  rank 0  use_reentrant=False                    ok, gradients equal one process's on the whole batch: True
  rank 1  use_reentrant=False                    ok, gradients equal one process's on the whole batch: True

MiB per rank, third step: kept between steps (parameters + Adam) | forward + backward peak | the same by peak_bytes
  rank 0  DDP                      1.57 |    0.97 |    0.97
  rank 1  DDP                      1.57 |    0.97 |    0.97
  rank 0  DDP + checkpointing      1.57 |    0.88 |    0.88
  rank 1  DDP + checkpointing      1.57 |    0.88 |    0.88
  rank 0  FSDP                     0.78 |    1.28 |    1.13
  rank 1  FSDP                     0.78 |    1.28 |    1.13
  rank 0  FSDP + checkpointing     0.78 |    1.06 |    0.91
  rank 1  FSDP + checkpointing     0.78 |    1.06 |    0.91

step time per rank, one thread each, 2 interleaved turns:
rank 0, DDP:
 cpu time  plain          median 0.006 s (0.004-0.008)
 cpu time  checkpointed   median 0.009 s (0.009-0.009)  x1.56, beyond noise: True
wall time  plain          median 0.012 s (0.010-0.014)
wall time  checkpointed   median 0.011 s (0.010-0.012)  x0.90, beyond noise: False
rank 0, FSDP:
 cpu time  plain          median 0.040 s (0.040-0.041)
 cpu time  checkpointed   median 0.037 s (0.036-0.038)  x0.92, beyond noise: True
wall time  plain          median 0.054 s (0.046-0.061)
wall time  checkpointed   median 0.051 s (0.041-0.061)  x0.95, beyond noise: False
rank 1, DDP:
 cpu time  plain          median 0.004 s (0.004-0.004)
 cpu time  checkpointed   median 0.006 s (0.006-0.007)  x1.53, beyond noise: True
wall time  plain          median 0.012 s (0.010-0.014)
wall time  checkpointed   median 0.016 s (0.015-0.016)  x1.27, beyond noise: True
rank 1, FSDP:
 cpu time  plain          median 0.021 s (0.020-0.021)
 cpu time  checkpointed   median 0.021 s (0.021-0.021)  x1.02, beyond noise: False
wall time  plain          median 0.053 s (0.046-0.059)
wall time  checkpointed   median 0.050 s (0.041-0.058)  x0.94, beyond noise: False
"""


def bars(figure) -> list[Rectangle]:
    return [p for ax in figure.axes for p in ax.patches if isinstance(p, Rectangle)]


def test_parses_every_setup_and_ratio_per_rank():
    run = parse_rank_output(SAMPLE)
    assert sorted({rank for rank, _ in run.peak_mib}) == [0, 1]
    assert run.kept_mib[1, "FSDP"] == 0.78
    assert run.peak_mib[0, "DDP + checkpointing"] == 0.88
    assert run.cpu_ratio[0, "DDP"] == (1.56, True)
    assert run.cpu_ratio[1, "FSDP"] == (1.02, False)
    assert run.text.startswith("2 ranks on cpu")
    assert "MiB per rank" in run.text and "use_reentrant" not in run.text  # no DDP cases


def test_incomplete_output_is_refused():
    with pytest.raises(ValueError, match="sections"):
        parse_rank_output(SAMPLE.split("\n\nstep time")[0])
    with pytest.raises(ValueError, match="incomplete"):
        parse_rank_output(SAMPLE.replace("x1.02, beyond noise: False", ""))


def test_figure_draws_four_setups_and_two_ratios_per_rank_and_passes_the_check():
    figure = plot_scale_run(parse_rank_output(SAMPLE), "4 blocks of width 64")
    assert len(bars(figure)) == 2 * (4 + 2)
    assert "measured on this machine" in figure._suptitle.get_text()
    assert figure_problems(figure) == []


def test_the_minimal_rank_file_trains_under_torchrun_on_two_gloo_ranks():
    printed = run_ranks(MINIMAL_FILE)
    lines = sorted(line for line in printed.splitlines() if line.startswith("rank "))
    assert lines == [
        "rank 0: DDP + checkpoint, step done",
        "rank 0: FSDP2 + apply_activation_checkpointing, step done, torch.float32 gradients",
        "rank 1: DDP + checkpoint, step done",
        "rank 1: FSDP2 + apply_activation_checkpointing, step done, torch.float32 gradients",
    ]
    assert len(MINIMAL_FILE.read_text().splitlines()) <= 70  # about 40 lines of code


def test_a_failing_rank_comes_back_as_its_own_error_not_the_launchers(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text(
        "import torch.distributed as dist\n"
        'dist.init_process_group("gloo")\n'
        "if dist.get_rank() == 1:\n"
        '    raise ValueError("rank 1 has no data")\n'
        "dist.barrier()\n"
    )
    with pytest.raises(RankError) as error:
        run_ranks(broken)
    message = str(error.value)
    assert "rank 1:" in message and "ValueError: rank 1 has no data" in message
    assert "ChildFailedError" not in message and "Connection closed" not in message
    assert f"torchrun --standalone --nproc-per-node 2 {broken}" in message
    exits = tmp_path / "exits.py"
    exits.write_text("raise SystemExit('no ranks here')\n")
    with pytest.raises(RankError, match="torchrun exited with") as error:
        rank_report(exits, "--width 16 --depth 1 --batch 4".split())
    assert "exitcode  : 1" in str(error.value)  # no rank raised: torchrun's own account


def test_the_examples_are_found_and_shown_as_python():
    assert example_file("checkpointing_minimal.py") == MINIMAL_FILE
    shown = show_example("checkpointing_minimal.py")
    assert "fully_shard" in shown.data and shown.language == "python"


def test_all_gathers_are_read_per_rank_and_order_and_a_report_without_them_is_refused():
    report = SAMPLE + (
        "\nFSDP in bf16, collectives in one step's forward and backward, per rank:\n"
        "  rank 0  checkpoint, then fully_shard                   9 all-gathers |   5 "
        "reduce-scatters | float32 gradients\n"
    )
    assert all_gathers(report) == {(0, "checkpoint, then fully_shard"): 9}
    assert parse_rank_output(report).peak_mib == parse_rank_output(SAMPLE).peak_mib
    with pytest.raises(ValueError, match="no all-gather counts"):
        all_gathers(SAMPLE)


@pytest.mark.slow
def test_the_panel_runs_the_rank_file_on_two_gloo_ranks():
    panel = scale_panel(RANK_FILE, width=32, depth=2, batch=64)
    figure, text = panel.run()
    for rank in (0, 1):
        setups = [name for name in SETUPS if f"rank {rank}  {name} " in text]
        assert setups == list(SETUPS)
    assert bars(figure)
    assert figure_problems(figure) == []
    assert panel.runs == 1
