"""Cells that run only where CUDA is present: one line where it is absent, and a tally.

A notebook run on a CPU (a laptop, or the ``gpu``/``article`` rehearsal under
``TUTORIAL_STEPS``) must say which of its cells had nothing to measure, rather than print
nothing or a zero. ``needs_cuda`` is the cell's guard; ``skipped_cells_report`` is its last line.
"""

from __future__ import annotations

import torch

__all__ = ["needs_cuda", "skipped_cells_report"]

_skipped: list[str] = []


def needs_cuda(what: str) -> bool:
    """True where CUDA is present; else print that ``what`` is skipped, remember it, False."""
    if torch.cuda.is_available():
        return True
    _skipped.append(what)
    print(f"skipped without CUDA: {what}")
    return False


def skipped_cells_report() -> str:
    """One line naming every cell this kernel skipped for want of CUDA (or that none was)."""
    if not _skipped:
        return "cells skipped for want of CUDA: none"
    return f"cells skipped for want of CUDA ({len(_skipped)}): " + "; ".join(_skipped)
