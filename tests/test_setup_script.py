"""The setup script: which torch build it installs and why, and that it parses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from torch_source import CPU_INDEX, torch_source  # noqa: E402


def test_no_driver_and_a_reachable_cpu_index_takes_the_cpu_build() -> None:
    asked = []
    options, reason = torch_source(lambda: False, lambda url: asked.append(url) or True)
    assert options[:2] == ["--index-url", CPU_INDEX] and "--extra-index-url" in options
    assert asked == [f"{CPU_INDEX}/torch/"] and "CPU build" in reason


def test_an_unreachable_cpu_index_falls_back_and_says_so() -> None:
    options, reason = torch_source(lambda: False, lambda url: False)
    assert options == [] and "unreachable" in reason and "CUDA build" in reason


def test_an_nvidia_driver_keeps_the_cuda_build_without_asking_the_cpu_index() -> None:
    options, reason = torch_source(lambda: True, lambda url: 1 / 0)
    assert options == [] and "NVIDIA driver is present" in reason


def test_setup_script_parses_and_prints_its_steps() -> None:
    script = (ROOT / "scripts" / "setup.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "setup.sh")]).returncode == 0
    assert script.count('step "') >= 4  # every install step announces itself
