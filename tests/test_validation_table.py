"""docs/VALIDATION.md's estimates are what the estimator predicts now, within 0.5%: a change
that moves a row must regenerate the table (``scripts/validation_table.py``)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import validation_table  # noqa: E402


def test_every_row_has_its_estimate_and_a_source():
    committed = validation_table.committed_estimates(validation_table.DOC.read_text())
    assert len(committed) == len(validation_table.POINTS)
    assert all(point.source and point.measures for point in validation_table.POINTS)


def test_the_table_estimates_have_not_moved():
    committed = validation_table.committed_estimates(validation_table.DOC.read_text())
    for point, figure in zip(validation_table.POINTS, committed, strict=True):
        now = validation_table.estimated(point)[point.compared_with]
        assert now == pytest.approx(figure, rel=0.005, abs=0.006), point.configuration
