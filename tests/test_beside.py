"""``pytest --beside COMMAND`` (tests/beside.py): each check runs once, at the lowest priority, its
output comes before pytest's closing line, and its failure fails a run whose tests passed."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOKS = "pytest_addoption, pytest_sessionstart, pytest_sessionfinish, pytest_terminal_summary"


def test_checks_beside_run_once_at_the_lowest_priority_and_a_failure_fails_the_run(tmp_path):
    """One passing and one failing check beside a passing test, on one xdist worker."""
    (tmp_path / "conftest.py").write_text(f"from tests.conftest import {HOOKS}\n")
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    runs = shlex.quote(str(tmp_path / "runs"))
    passing = f"sh -c 'echo run >> {runs}; echo niceness $(nice)'"
    failing = "sh -c 'echo found 2 errors; exit 2'"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "1"]
    command += ["--beside", passing, "--beside", failing, str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr  # the test passed
    assert (tmp_path / "runs").read_text() == "run\n"  # in the controller, not in each worker
    lines = result.stdout.rstrip().splitlines()
    assert lines[-5].startswith(f"{shlex.join(shlex.split(passing))}: passed, ")
    assert lines[-4] == "  niceness 19"
    assert "FAILED (exit 2)" in lines[-3] and lines[-2] == "  found 2 errors"
    assert lines[-1].startswith("1 passed")  # pytest's closing line stays the last one
