import torch

from tutorial_utils.lessons import cuda_only


def test_a_cell_without_cuda_says_so_and_is_tallied(monkeypatch, capsys):
    monkeypatch.setattr(cuda_only, "_skipped", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_only.skipped_cells_report() == "cells skipped for want of CUDA: none"
    assert cuda_only.needs_cuda("NVML memory used") is False
    assert capsys.readouterr().out == "skipped without CUDA: NVML memory used\n"
    assert cuda_only.skipped_cells_report() == (
        "cells skipped for want of CUDA (1): NVML memory used"
    )


def test_a_cell_with_cuda_runs_silently(monkeypatch, capsys):
    monkeypatch.setattr(cuda_only, "_skipped", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_only.needs_cuda("offloading") is True
    assert capsys.readouterr().out == ""
    assert cuda_only.skipped_cells_report().endswith("none")
