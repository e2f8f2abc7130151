"""./scripts/lab and ./scripts/test as a Mac runs them: bash 3.2 and BSD/POSIX tools only.

macOS ships bash 3.2 as /bin/bash and, before recent releases, no sha256sum. Bash 3.2 is not on
this machine, so the bash-4 features are checked statically; the scripts then run for real under
this bash with a PATH holding only tools a Mac has (no sha256sum, no apt-get), the install
stubbed by setup.py's dry run and the virtual environment's programs faked. Never run on a Mac.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHELL_SCRIPTS = ["scripts/lab", "scripts/test", "scripts/ensure-chromium.sh"]
# Tools in macOS's /bin and /usr/bin that the scripts (or bash itself) may call.
MAC_TOOLS = [
    "bash", "sh", "env", "cat", "dirname", "basename", "id", "uname", "ls", "mkdir", "rm", "cp",
    "mv", "chmod", "grep", "sed", "tr", "cut", "head", "tail", "sort", "wc", "date", "sudo",
]  # fmt: skip
# Bash 4+ features and GNU-only tools, each with what to use instead.
FORBIDDEN = {
    r"\bmapfile\b|\breadarray\b": "a while-read loop (bash 4)",
    r"\bdeclare -[A-Za-z]*A|\blocal -n\b|\bdeclare -n\b": "no associative arrays or namerefs (bash 4)",
    r"\$\{[^}]*(,,|\^\^)\}": "tr for case changes (bash 4)",
    r"\|&|&>>|\bcoproc\b": "2>&1 | (bash 4)",
    r"\[@\]|\b[A-Za-z_]+=\(": "no arrays: an empty one is unbound under set -u before bash 4.4",
    r"\bsha256sum\b|\bmd5sum\b": "hashlib inside setup.py (GNU coreutils)",
    r"\breadlink -f\b|\brealpath\b|\bstat -c\b|\bdate -d\b|\bsed -i\b|\bgrep -P\b": "POSIX forms",
    r"\btimeout\b|\bnproc\b": "nothing: macOS has neither",
}


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_scripts_use_nothing_beyond_bash_3_2_and_posix_tools(script) -> None:
    text = (ROOT / script).read_text()
    code = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.startswith("#"))
    for pattern, instead in FORBIDDEN.items():
        assert not re.search(pattern, code), f"{script} matches {pattern}: use {instead}"
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0


def _mac_path(tmp_path: Path) -> Path:
    """A bin folder with only tools a Mac has, and python3 (macOS's is a 3.9; this one is real)."""
    bin_dir = tmp_path / "mac-bin"
    bin_dir.mkdir()
    for tool in MAC_TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))
    assert not (bin_dir / "sha256sum").exists() and not (bin_dir / "apt-get").exists()
    return bin_dir


def _fake_checkout(tmp_path: Path, with_venv_python: bool) -> tuple[Path, Path]:
    """The scripts and what setup.py reads, plus .venv programs that log their arguments."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in [*SHELL_SCRIPTS, "scripts/setup.py", "pyproject.toml", "constraints.txt"]:
        shutil.copy2(ROOT / name, root / name)
    (root / "notebooks").mkdir()
    (root / "notebooks" / "01_a.ipynb").write_text("{}")
    log = tmp_path / "calls.log"
    (root / ".venv" / "bin").mkdir(parents=True)
    programs = ["jupyter", "ruff", "lint-imports", "mypy"] + (
        ["python"] if with_venv_python else []
    )
    for program in programs:
        fake = root / ".venv" / "bin" / program
        fake.write_text(f'#!/bin/sh\necho "{program} $*" >> "{log}"\n')
        fake.chmod(0o755)
    return root, log


def _run(root: Path, bin_dir: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    environ = {"PATH": str(bin_dir), "HOME": str(root), "TUTORIAL_SETUP_DRY_RUN": "1"}
    return subprocess.run(
        [str(root / script), *args], capture_output=True, text=True, env=environ, timeout=120
    )


def test_lab_runs_with_only_mac_tools_chooses_python_and_opens_jupyter(tmp_path) -> None:
    root, log = _fake_checkout(tmp_path, with_venv_python=False)
    result = _run(root, _mac_path(tmp_path), "scripts/lab", "--port=9999")
    assert result.returncode == 0, result.stderr
    assert f"would run: python3 -m venv {root / '.venv'}" in result.stdout  # python3 was chosen
    assert "command not found" not in result.stderr
    trust, lab = log.read_text().splitlines()
    assert trust == f"jupyter trust {root / 'notebooks' / '01_a.ipynb'}"
    as_root = " --allow-root" if os.getuid() == 0 else ""
    assert lab == f"jupyter lab --notebook-dir={root / 'notebooks'}{as_root} --port=9999"


def test_lab_without_arguments_survives_set_u(tmp_path) -> None:
    """No arguments and not root: what bash 3.2 failed on with the old empty array."""
    root, log = _fake_checkout(tmp_path, with_venv_python=True)
    result = _run(root, _mac_path(tmp_path), "scripts/lab")
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines()[-1].startswith("jupyter lab --notebook-dir=")


def test_test_runs_with_only_mac_tools_up_to_pytest(tmp_path) -> None:
    root, log = _fake_checkout(tmp_path, with_venv_python=True)
    result = _run(root, _mac_path(tmp_path), "scripts/test", "-k", "x")
    assert result.returncode == 0, result.stderr
    assert "torch==" in result.stdout and "-m venv" not in result.stdout  # .venv exists
    assert "browser test will be skipped" in result.stderr  # no chromium, no apt-get on a Mac
    calls = log.read_text().splitlines()
    assert [call.split()[0] for call in calls] == ["ruff", "ruff", "lint-imports", "python"]
    assert calls[-1].startswith("python -m pytest") and calls[-1].endswith("notebooks -k x")
    assert "--beside .venv/bin/mypy" in calls[-1]  # mypy runs beside the tests
    assert "--nbval-lax" in calls[-1]  # without chromium nbval runs the notebooks
    assert "the notebooks run under nbval instead" in result.stderr


def test_test_with_chromium_leaves_the_notebooks_to_the_browser_test(tmp_path) -> None:
    root, log = _fake_checkout(tmp_path, with_venv_python=True)
    bin_dir = _mac_path(tmp_path)
    chromium = bin_dir / "chromium"
    chromium.write_text("#!/bin/sh\nexit 0\n")
    chromium.chmod(0o755)
    result = _run(root, bin_dir, "scripts/test", "-k", "x")
    assert result.returncode == 0, result.stderr
    pytest_call = log.read_text().splitlines()[-1]
    assert pytest_call.endswith("--beside .venv/bin/mypy tests -k x")  # each notebook once, in Lab
    assert "nbval" not in pytest_call
