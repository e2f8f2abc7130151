"""The bench's tables: rows, ratios, labels, n/a (the GPU check's are in test_gpu_check.py).

The dry-run table at the articles' sizes is computed once (a few seconds on 2 cores, every step
on the meta device) and checked for what a wrong figure would break: each setting present,
peaks in the order the physics demands, ratios to the right base, every row labelled.
"""

from __future__ import annotations

import pytest
import torch

from tutorial_utils import bench
from tutorial_utils.articles.models import NetA
from tutorial_utils.bench.dry_runs import DRY_RUN_COLUMNS
from tutorial_utils.bench.rows import (
    ARTICLE_CARD_BYTES,
    NETA_CHECKPOINTED,
    VGG16_ARTICLE,
    VGG16_FLAT,
    add_ratios,
)
from tutorial_utils.bench.timed import dry_run_gflop
from tutorial_utils.display.tables import columns_table
from tutorial_utils.measurement.step import DRY_RUN_LABEL, Recording, measure_step
from tutorial_utils.units import MiB


@pytest.fixture(scope="module")
def dry():
    return bench.dry_run_bench(deep_chain_pairs=DEEP_PAIRS)  # the bench's 128 take half a minute


DEEP_PAIRS = 24


def _rows(dry, model: str) -> dict[str, dict]:
    return {row["checkpointing"]: row for row in dry.rows if row["model"] == model}


def test_bench_table_gives_ratios_and_says_n_a():
    rows = add_ratios(
        [
            {
                "model": "m",
                "checkpointing": "none",
                "batch": 4,
                "tracked_peak_mib": 10.0,
                "activation_peak_mib": 8.0,
                "cuda_peak_allocated_mib": None,
                "nvml_used_mib": None,
                "step_seconds": 1.0,
                "step_gflop": 2.0,
            },
            {
                "model": "m",
                "checkpointing": "2 segments",
                "batch": 4,
                "tracked_peak_mib": 5.0,
                "activation_peak_mib": 2.0,
                "cuda_peak_allocated_mib": None,
                "nvml_used_mib": None,
                "step_seconds": 1.5,
                "step_gflop": 2.6,
            },
        ]
    )
    assert rows[1]["tracked_peak_ratio"] == 0.5 and rows[1]["activation_peak_ratio"] == 0.25
    assert rows[1]["step_ratio"] == 1.5 and rows[1]["cuda_peak_allocated_ratio"] is None
    assert rows[1]["flops_ratio"] == pytest.approx(1.3)
    header, rule, *lines = columns_table(rows, bench.COLUMNS, "markdown").splitlines()
    assert header.count("|") == rule.count("|") == lines[0].count("|")
    assert "step s (measured)" in header and "time ratio (predicted from FLOPs)" in header
    assert (
        "| m | 2 segments | 4 | 5.0 | 0.50 | 2.0 | 0.25 | n/a | n/a | n/a | 1.500 | 1.50 | 2.6 "
        "| 1.30 |" in lines
    )


def test_dry_run_rows_cover_every_setting_and_are_labelled(dry):
    article, flat = _rows(dry, VGG16_ARTICLE), _rows(dry, VGG16_FLAT)
    neta = [(row["batch"], row["checkpointing"]) for row in dry.rows if row["model"] == "NetA"]
    assert set(article) == {"0 segments", "2 segments"}
    for label in ("0 segments", "2 segments", "4 segments", "6 segments (sqrt n)", "10 segments"):
        assert label in flat
    kinds = (
        "best uniform",
        "planner, least peak",
        "nested, least peak",
        "selective, 4",
        "selective, 6",
        "compile budget 0.0",
        "compile budget 0.5",
        "compile budget 1.0",
        "floor",
    )
    assert all(any(label.startswith(kind) for label in flat) for kind in kinds)
    assert neta[:4] == [(b, s) for b in (23, 31) for s in ("none", NETA_CHECKPOINTED)]
    assert [s.split(",")[0] for _, s in neta[4:]] == ["none", NETA_CHECKPOINTED]
    deep = _rows(dry, bench.deep_chain_name(DEEP_PAIRS))
    assert len(dry.rows) == len(article) + len(flat) + len(neta) + len(deep)
    assert all(row["batch"] == 64 for row in [*article.values(), *flat.values()])
    for row in dry.rows:
        is_floor = row["checkpointing"].startswith("floor")
        assert row["source"] == DRY_RUN_LABEL or is_floor
        assert (row["step_gflop"] is None) == is_floor


def test_dry_run_peaks_are_ordered_as_checkpointing_allows(dry):
    flat = _rows(dry, VGG16_FLAT)

    def peak(prefix: str) -> float:
        (row,) = [row for label, row in flat.items() if label.startswith(prefix)]
        return row["tracked_peak_mib"]

    assert peak("floor") <= peak("planner") <= peak("best uniform") < peak("0 segments")
    assert peak("floor") <= peak("nested")
    compiled = [row for label, row in flat.items() if label.startswith("compile budget")]
    assert compiled[0]["step_gflop"] > compiled[-1]["step_gflop"]  # budget 0 recomputes most
    assert compiled[-1]["step_gflop"] == flat["0 segments"]["step_gflop"]  # budget 1: none
    uniform = [row for label, row in flat.items() if label.split(" ")[0].isdigit()]
    assert all(peak("best uniform") <= row["tracked_peak_mib"] for row in uniform)
    article = _rows(dry, VGG16_ARTICLE)  # one segment holds every convolution: nothing saved
    assert article["2 segments"]["tracked_peak_mib"] == article["0 segments"]["tracked_peak_mib"]
    assert article["2 segments"]["step_gflop"] > article["0 segments"]["step_gflop"]
    neta = [row for row in dry.rows if row["model"] == "NetA"]
    for plain, checkpointed in (neta[0:2], neta[2:4]):
        assert checkpointed["tracked_peak_mib"] < plain["tracked_peak_mib"]
        assert checkpointed["flops_ratio"] > 1 == plain["flops_ratio"]
    plain_max, checkpointed_max = neta[4:6]
    assert checkpointed_max["batch"] > plain_max["batch"] > 23
    assert dry.neta_max_batch == {
        "none": plain_max["batch"],
        NETA_CHECKPOINTED: checkpointed_max["batch"],
    }
    assert all(row["tracked_peak_mib"] <= ARTICLE_CARD_BYTES / MiB for row in neta[4:6])


def test_dry_run_ratios_are_to_the_plain_step_at_the_same_batch(dry):
    flat = _rows(dry, VGG16_FLAT)
    plain = flat["0 segments"]
    for row in flat.values():
        assert row["tracked_peak_ratio"] == pytest.approx(
            row["tracked_peak_mib"] / plain["tracked_peak_mib"]
        )
        if row["step_gflop"] is not None:
            assert row["flops_ratio"] == pytest.approx(row["step_gflop"] / plain["step_gflop"])
    neta = [row for row in dry.rows if row["model"] == "NetA"]
    assert neta[3]["tracked_peak_ratio"] == pytest.approx(
        neta[3]["tracked_peak_mib"] / neta[2]["tracked_peak_mib"]
    )
    assert all(row.get("tracked_peak_ratio") is None for row in neta[4:6])  # no plain twin


def test_dry_run_table_prints_the_label_n_a_and_the_timings(dry, capsys):
    assert dry.vgg16_step_seconds < 5  # the bound; about 0.05 s on 2 cores
    bench.print_dry_run_bench(dry)
    out = capsys.readouterr().out
    assert DRY_RUN_LABEL in out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(dry.rows)  # header and rule
    assert all(line.count("|") == len(DRY_RUN_COLUMNS) + 1 for line in table)
    floor_line = next(line for line in table if "floor" in line)
    assert floor_line.endswith("| n/a | n/a | n/a |")
    assert "A dry run of VGG16 (article layout) at 224 px, batch 64 took" in out
    assert "the dry-run part took" in out


def test_flops_from_a_dry_run_equal_the_real_steps():
    """The bench's predicted time ratio for a real row comes from a dry run at the same shape."""
    torch.manual_seed(0)
    model = NetA(use_checkpoint=True)
    inputs, targets = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    real = measure_step(
        model, inputs, targets, time_step=False, recording=Recording(count_flops=True)
    )
    assert real.flops.recompute > 0
    assert dry_run_gflop(model, inputs.shape) == real.flops.total / 1e9


def test_estimate_bench_times_the_table_and_the_search(capsys):
    """At a small preset: four strategies dry-run, both phases timed, all of it printed."""
    from tutorial_utils.estimate.timing import estimate_bench, print_estimate_bench

    result = estimate_bench("hf:gpt2", size=256)
    assert result.strategies == 4
    assert result.table_seconds > 0 and result.search_seconds > 0
    assert "longest sequence" in result.table and "not searched" not in result.table
    print_estimate_bench(result)
    out = capsys.readouterr().out
    assert "the table of 4 strategies in" in out and "largest-fit search in" in out


def test_deep_chain_rows_show_nested_below_one_level_within_one_forward_pass(dry):
    rows = _rows(dry, bench.deep_chain_name(DEEP_PAIRS))
    assert len(rows) == 3
    plain = rows["none"]
    one = next(row for label, row in rows.items() if label.startswith("one level"))
    nested = next(row for label, row in rows.items() if label.startswith("nested"))
    assert nested["activation_peak_mib"] < one["activation_peak_mib"] < plain["activation_peak_mib"]
    assert one["flops_ratio"] < nested["flops_ratio"] <= one["flops_ratio"] + 1 / 3 + 1e-9
    assert "(runs 2x)" in next(label for label in rows if label.startswith("one level"))


def test_the_batchnorm_table_separates_the_double_update_from_the_strategies_that_keep_it():
    lines = bench.batchnorm_bench().splitlines()[1:]
    rows = {line.split("  ")[0]: line for line in lines}
    assert " 0 of 8" not in rows["segments=4 (checkpoint_sequential)"]
    for name in (
        "equal_segments(4)",
        "planner, least peak",
        "nested, least peak",
        "selective(regions=3)",
    ):
        assert rows[name].endswith(" 0 of 8  identical"), rows[name]
    assert " 0 of 8  " in rows["compile budget 0.50"]  # one update; rounding differs at most
