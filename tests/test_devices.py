"""Devices: Apple's GPU (mps) detected and labelled, one synchronize for every device.

The MPS paths run here with torch.backends.mps and torch.mps faked: never run on a Mac here.
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn

from tutorial_utils.lessons.setup import report_environment
from tutorial_utils.measurement import devices
from tutorial_utils.measurement.devices import (
    MPS_UNTESTED,
    default_device,
    describe_device,
    mps_status,
    synchronize,
)
from tutorial_utils.measurement.nvml import MPS_LABEL, MpsReadings, mps_readings
from tutorial_utils.measurement.step import measure_step
from tutorial_utils.units import MiB


def _fake_mac(monkeypatch, available: bool = True) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_without_mps_the_setup_cell_says_nothing_of_it(monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    assert mps_status() is None
    report_environment("ci")
    assert "mps" not in capsys.readouterr().out


def test_the_setup_cell_quiets_bitsandbytes_warnings_and_keeps_its_errors(caplog) -> None:
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = logger.level
    try:
        report_environment("ci")
        with caplog.at_level(logging.NOTSET):
            logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community")
            logger.error("a real error")
        assert [r.getMessage() for r in caplog.records] == ["a real error"]
    finally:
        logger.setLevel(level)


def test_a_mac_with_mps_is_told_so_and_keeps_the_cpu_default(monkeypatch, capsys) -> None:
    _fake_mac(monkeypatch)
    monkeypatch.delenv("TUTORIAL_PROFILE", raising=False)
    profile = report_environment()
    out = capsys.readouterr().out
    assert "Apple's GPU (mps) is available" in out and "device='mps'" in out
    assert MPS_UNTESTED in out
    assert profile.name == "cpu" and default_device().type == "cpu"


def test_mps_built_but_unusable_names_the_macos_it_needs(monkeypatch) -> None:
    _fake_mac(monkeypatch, available=False)
    assert "12.3" in mps_status() and not devices.mps_available()


def test_an_mps_device_is_labelled_as_untested() -> None:
    assert describe_device("mps").startswith("mps (Apple GPU") and MPS_UNTESTED in describe_device(
        "mps"
    )


def test_synchronize_waits_on_the_device_s_own_queue(monkeypatch) -> None:
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: waited.append(("cuda", device)))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: waited.append(("mps", None)))
    for device in ("cpu", "meta", torch.device("cpu")):
        synchronize(device)
    assert waited == []
    synchronize("mps")
    synchronize("cuda:1")
    assert waited == [("mps", None), ("cuda", torch.device("cuda:1"))]


def test_mps_readings_come_from_torch_mps_and_only_on_mps(monkeypatch) -> None:
    assert "not Apple's GPU" in str(mps_readings("cpu"))
    assert "is_available() is False" in str(mps_readings("mps"))  # no MPS here
    _fake_mac(monkeypatch)
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 3 * MiB)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 8 * MiB)
    assert mps_readings(torch.device("mps")) == MpsReadings(3 * MiB, 8 * MiB)


def test_mps_readings_are_labelled_and_shown_beside_the_tracked_peak() -> None:
    line = MpsReadings(allocated_bytes=3 * MiB, driver_allocated_bytes=8 * MiB).describe(10 * MiB)
    assert line.startswith(MPS_LABEL) and MPS_UNTESTED in line
    assert "3.0 MiB in tensors" in line and "8.0 MiB held by the Metal driver" in line
    assert "tracked peak 10.0 MiB" in line


def test_a_cpu_step_has_no_mps_readings_and_says_why() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    report = measure_step(model, torch.randn(2, 4), torch.tensor([0, 1]), time_step=False)
    assert report.mps is None
    assert "not Apple's GPU" in report.missing["mps"]
