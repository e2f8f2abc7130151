"""docs/VALIDATION.md's estimates are what the estimator predicts now, within 0.5%: a change
that moves a row must regenerate the tables (``scripts/validation_table.py``). The step-time
table's "fit" rows are what its bandwidth share was fitted on, and the page says so truly."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import validation_table  # noqa: E402

pytestmark = pytest.mark.slow  # tens of seconds: started early, beside the notebooks

TEXT = validation_table.DOC.read_text()
TIME = (validation_table.TIME_BEGIN, validation_table.TIME_END)


def test_every_row_has_its_estimate_and_a_source():
    committed = validation_table.committed_estimates(TEXT)
    assert len(committed) == len(validation_table.POINTS)
    timed = validation_table.committed_estimates(TEXT, *TIME)
    assert len(timed) == len(validation_table.TIME_POINTS)
    points = validation_table.POINTS + validation_table.TIME_POINTS
    assert all(point.source and point.measures for point in points)
    assert {p.role for p in validation_table.TIME_POINTS} == {"fit", "held out"}


def test_the_table_estimates_have_not_moved():
    committed = validation_table.committed_estimates(TEXT)
    for point, figure in zip(validation_table.POINTS, committed, strict=True):
        now = validation_table.estimated(point)[point.compared_with]
        assert now == pytest.approx(figure, rel=0.005, abs=0.006), point.configuration


def test_the_predicted_step_times_have_not_moved():
    committed = validation_table.committed_estimates(TEXT, *TIME)
    for point, figure in zip(validation_table.TIME_POINTS, committed, strict=True):
        now = validation_table.estimated(point)["predicted s/step"]
        assert now == pytest.approx(figure, rel=0.005, abs=0.006), point.configuration


def test_the_bandwidth_share_is_the_fit_of_the_fit_rows():
    """The fit rows' errors are of equal size and opposite sign (their ratios' product is 1),
    which is how BANDWIDTH_SHARE was chosen: a change to the time model must refit it."""
    committed = validation_table.committed_estimates(TEXT, *TIME)
    ratios = [
        figure / validation_table.published_seconds(point)
        for point, figure in zip(validation_table.TIME_POINTS, committed, strict=True)
        if point.role == "fit"
    ]
    assert len(ratios) == 2
    assert math.prod(ratios) == pytest.approx(1.0, abs=0.01)
