"""Colab's situation, rehearsed: the package's wheel alone, ipywidgets 7.7.1, every notebook.

Colab serves its own Jupyter with ipywidgets 7.7.1, so the setup cell installs this package
without extras. This test builds the wheel, installs it (not editable, no extras) into a fresh
virtual environment with ipywidgets 7.7.1 and only the tools nbval needs, checks that no
JupyterLab came with it, and runs every notebook there under nbval in the ``ci`` profile.
It runs twice: with the interpreter and torch running the tests (Python 3.11, torch 2.14.1 here),
and as Colab's runtime is, Python 3.12 with an older torch (``torch==2.9.1 torchvision==0.24.1``,
a CUDA build of several GB that runs on the CPU); the oldest torch that passes is the package's
floor in ``pyproject.toml``. ``TUTORIAL_COLAB_PYTHON`` names the 3.12 interpreter (default
``python3.12`` on PATH) and ``TUTORIAL_WHEELHOUSE`` an optional folder of downloaded wheels.

It takes minutes (a new environment, then every notebook), so it has its own marker and runs
only when asked: ``TUTORIAL_COLAB_TEST=1 .venv/bin/pytest -m colab -s tests/test_colab_like.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What Colab's runtime brings itself (its classic notebook 6.5 serves ipywidgets 7.7.1)
COLAB_PROVIDED = (
    "ipywidgets==7.7.1",
    "widgetsnbextension==3.6.10",
    "jupyterlab_widgets==1.1.11",
    "notebook==6.5.7",
)
NBVAL_TOOLS = ("pytest", "nbval", "ipykernel", "nbformat", "nbclient")
COLAB_OWNED = ("ipywidgets", "widgetsnbextension", "jupyterlab_widgets", "notebook")
COLAB_TORCH = ("torch==2.9.1", "torchvision==0.24.1")  # an older release, as Colab's runtime has

pytestmark = [
    pytest.mark.colab,
    pytest.mark.skipif(
        os.environ.get("TUTORIAL_COLAB_TEST") != "1",
        reason="minutes long: set TUTORIAL_COLAB_TEST=1 to rehearse a Colab install",
    ),
]


def run(*command: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 1800):
    print("$", " ".join(command), flush=True)
    return subprocess.run(command, cwd=cwd, env=env, check=True, timeout=timeout)


def constraints_without_colab_packages(target: Path) -> Path:
    """The project's pins, minus the packages Colab brings in its own versions."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    kept = [
        line
        for line in lines
        if line.split("==")[0].lower().replace("_", "-")
        not in {name.replace("_", "-") for name in COLAB_OWNED}
    ]
    target.write_text("\n".join(kept) + "\n")
    return target


def this_runtime() -> tuple[str, tuple[str, ...]]:
    """The interpreter and torch running the tests."""
    return sys.executable, (
        f"torch=={_version('torch')}",
        f"torchvision=={_version('torchvision')}",
    )


def colab_runtime() -> tuple[str, tuple[str, ...]]:
    """Python 3.12 with an older torch, as Colab's runtime has; skipped where 3.12 is missing."""
    python = os.environ.get("TUTORIAL_COLAB_PYTHON") or shutil.which("python3.12")
    if not python:
        pytest.skip("no Python 3.12: set TUTORIAL_COLAB_PYTHON to a 3.12 interpreter")
    return python, COLAB_TORCH


@pytest.mark.parametrize("runtime", [this_runtime, colab_runtime], ids=["this-python", "py312"])
def test_the_wheel_alone_runs_every_notebook_with_ipywidgets_7(tmp_path: Path, runtime) -> None:
    started = time.monotonic()
    interpreter, torch_pins = runtime()
    dist = tmp_path / "dist"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(dist),
        str(ROOT),
    )
    wheel = next(dist.glob("tutorial_utils-*.whl"))
    venv = tmp_path / "venv"
    run(interpreter, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    pins = constraints_without_colab_packages(tmp_path / "constraints.txt")
    wheelhouse = os.environ.get("TUTORIAL_WHEELHOUSE")
    find_links = ("--find-links", wheelhouse) if wheelhouse else ()
    run(python, "-m", "pip", "install", "-q", *find_links, *torch_pins)
    pip = (python, "-m", "pip", "install", "-q", "-c", str(pins))
    run(*pip, str(wheel))
    alone = _installed(python)
    frontends = [name for name in ("jupyterlab", "notebook", "jupyter-server") if name in alone]
    assert not frontends, f"installing the package alone pulled in {frontends}"
    # Colab's Jupyter stack keeps its own (older) pins: resolved without the project's
    run(python, "-m", "pip", "install", "-q", *COLAB_PROVIDED, *NBVAL_TOOLS)
    assert _installed(python)["ipywidgets"] == "7.7.1"
    notebooks = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", notebooks, ignore=shutil.ignore_patterns(".*"))
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),  # generated data under ~/.cache, as on Colab
        "TUTORIAL_PROFILE": "ci",
        "TUTORIAL_CHECK_FIGURES": "1",
        "MPLBACKEND": "Agg",
    }
    run(
        python, "-m", "pytest", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
        "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg"), "-q", str(notebooks),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    versions = _installed(python)
    print(
        f"Colab rehearsal with {interpreter} (torch {versions['torch']}): "
        f"{time.monotonic() - started:.0f} s in all"
    )


def _installed(python: str) -> dict[str, str]:
    """Package name -> version in the environment of ``python``."""
    listing = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    pairs = (line.split("==", 1) for line in listing.splitlines() if "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in pairs}


def _version(package: str) -> str:
    """The base version of ``package`` in this environment (local labels such as +cu130 dropped)."""
    from importlib.metadata import version

    return version(package).split("+")[0]
