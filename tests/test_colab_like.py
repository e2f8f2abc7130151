"""Colab's situation, rehearsed: the package's wheel alone, ipywidgets 7.7.1, every notebook.

Colab serves its own Jupyter with ipywidgets 7.7.1 and ships its own torch, transformers and
peft, so the setup cell installs this package without extras and must leave those as they are.
This test builds the wheel and, in a fresh virtual environment per runtime, installs what the
runtime ships, then the wheel (not editable, no extras), checks that the wheel changed none of
the runtime's packages and brought no Jupyter frontend, adds ipywidgets 7.7.1 and only the
tools nbval needs, and runs every notebook there under nbval in the ``ci`` profile.

The runtimes:
* ``this-python``: the interpreter and torch running the tests, the project's pins for the rest;
* ``colab-py313``: Colab's runtime today (its manifest, August 2026): Python 3.13, ``torch==2.11.0``,
  and Colab's own transformers 5.15.0, peft 0.20.0 and accelerate 1.14.0;
* ``oldest-torch-py312``: Python 3.12 with ``torch==2.9.1``, the pin of macOS and aarch64 Linux and the
  floor in ``pyproject.toml``.
torch comes from PyPI: a CUDA build of several GB, which runs on the CPU. ``TUTORIAL_PYTHON313``
and ``TUTORIAL_PYTHON312`` name the interpreters (default ``python3.13`` and ``python3.12`` on
PATH; a runtime whose Python is missing is skipped); ``TUTORIAL_WHEELHOUSE`` may name a folder
of downloaded wheels. Where a runtime ships its own transformers, the lines that print its
version, and the deprecation warning 5.23 added, are masked before the outputs are compared.

It takes minutes per runtime (a new environment, then every notebook), so it has its own marker
and runs only when asked: ``TUTORIAL_COLAB_TEST=1 .venv/bin/pytest -m colab -s tests/test_colab_like.py``
(``-k py313`` for Colab's runtime alone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
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
FRONTENDS = ("jupyterlab", "notebook", "jupyter-server")
# Lines whose text depends on the transformers release, masked where the runtime ships its own:
# (what, regex, replacement) in nbval's sanitize format
TRANSFORMERS_RELEASE_MASKS = (
    (
        "transformers and peft versions, the runtime's own",
        r"transformers \d+\.\d+\S*, peft \d+\.\d+\S*",
        "transformers VERSION, peft VERSION",
    ),
    (
        "the deprecation of gradient_checkpointing_enable, added in transformers 5.23",
        r"\n *`gradient_checkpointing_enable` is deprecated[^\n]*",
        "",
    ),
)


@dataclass(frozen=True)
class Runtime:
    """A Python and what the runtime ships before the package is installed."""

    python_version: str | None  # "3.13": found through TUTORIAL_PYTHON313; None: this interpreter
    shipped: tuple[str, ...]  # requirements installed first; the wheel must leave them as they are
    own_transformers: bool = False  # ships transformers and peft instead of taking the pins

    def interpreter(self) -> str:
        """The Python to create the environment with; skips the test where it is missing."""
        if self.python_version is None:
            return sys.executable
        variable = "TUTORIAL_PYTHON" + self.python_version.replace(".", "")
        python = os.environ.get(variable) or shutil.which(f"python{self.python_version}")
        found = python and subprocess.run(
            [python, "-c", f"import sys; assert sys.version.startswith('{self.python_version}.')"],
            capture_output=True,
        )
        if not found or found.returncode != 0:
            pytest.skip(f"no Python {self.python_version}: set {variable} to its interpreter")
        return python


def _version(package: str) -> str:
    """The base version of ``package`` in this environment (local labels such as +cu130 dropped)."""
    from importlib.metadata import version

    return version(package).split("+")[0]


RUNTIMES = {  # the test ids: -k py313 runs Colab's runtime alone
    "this-python": Runtime(
        None, (f"torch=={_version('torch')}", f"torchvision=={_version('torchvision')}")
    ),
    "colab-py313": Runtime(
        "3.13",
        (
            "torch==2.11.0",
            "torchvision==0.26.0",
            "transformers==5.15.0",
            "peft==0.20.0",
            "accelerate==1.14.0",
        ),
        own_transformers=True,
    ),
    "oldest-torch-py312": Runtime("3.12", ("torch==2.9.1", "torchvision==0.24.1")),
}

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


def constraints_without(names: Iterable[str], target: Path) -> Path:
    """The project's pins, minus ``names``: what the runtime has, pip on Colab leaves alone."""
    dropped = {_normalised(name) for name in names}
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    kept = [line for line in lines if _normalised(line.split("==")[0]) not in dropped]
    target.write_text("\n".join(kept) + "\n")
    return target


def sanitize_file(runtime: Runtime, target: Path) -> Path:
    """The project's nbval masks, plus the transformers release's where the runtime ships one."""
    text = (ROOT / "tests" / "nbval_sanitize.cfg").read_text()
    if runtime.own_transformers:
        for what, regex, replace in TRANSFORMERS_RELEASE_MASKS:
            text += f"\n[{what}]\nregex: {regex}\nreplace: {replace}\n"
    target.write_text(text)
    return target


def source_tree(destination: Path) -> Path:
    """The files git would commit (tracked, or new and not ignored), copied: a wheel built in the
    checkout itself would reuse a stale ``build/`` and ship modules deleted since, as
    ``pip install git+...`` from a fresh clone never would."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        if (ROOT / name).is_file():  # a tracked file deleted in the work tree is left out
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)
    return destination


@pytest.mark.parametrize("name", RUNTIMES)
def test_the_wheel_alone_runs_every_notebook_with_ipywidgets_7(tmp_path: Path, name: str) -> None:
    runtime = RUNTIMES[name]
    interpreter = runtime.interpreter()
    started = time.monotonic()
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
        str(source_tree(tmp_path / "source")),
    )
    wheel = next(dist.glob("tutorial_utils-*.whl"))
    venv = tmp_path / "venv"
    run(interpreter, "-m", "venv", str(venv))
    python = str(venv / "bin" / "python")
    wheelhouse = os.environ.get("TUTORIAL_WHEELHOUSE")
    find_links = ("--find-links", wheelhouse) if wheelhouse else ()
    run(python, "-m", "pip", "install", "-q", *find_links, *runtime.shipped)
    shipped = _installed(python)
    pins = constraints_without([*shipped, *COLAB_OWNED], tmp_path / "constraints.txt")
    run(python, "-m", "pip", "install", "-q", "-c", str(pins), str(wheel))
    alone = _installed(python)
    changed = {n: f"{v} -> {alone.get(n)}" for n, v in shipped.items() if alone.get(n) != v}
    assert not changed, f"installing the package changed the runtime's own packages: {changed}"
    frontends = [n for n in FRONTENDS if n in alone]
    assert not frontends, f"installing the package alone pulled in {frontends}"
    # Colab's Jupyter stack keeps its own (older) pins: resolved without the project's
    run(python, "-m", "pip", "install", "-q", *COLAB_PROVIDED, *NBVAL_TOOLS)
    versions = _installed(python)
    assert versions["ipywidgets"] == "7.7.1"
    for requirement in runtime.shipped:
        package, version = requirement.split("==")
        assert versions[_normalised(package)] == version, f"{package} is not {version}"
    notebooks = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", notebooks, ignore=shutil.ignore_patterns(".*"))
    # notebook 05 shows and runs the rank files beside the notebooks' folder, as a clone has them
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),  # generated data under ~/.cache, as on Colab
        "TUTORIAL_PROFILE": "ci",
        "TUTORIAL_CHECK_FIGURES": "1",
        "MPLBACKEND": "Agg",
    }
    masks = sanitize_file(runtime, tmp_path / "nbval_sanitize.cfg")
    notebooks_started = time.monotonic()
    run(
        python, "-m", "pytest", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
        "--nbval-sanitize-with", str(masks), "-q", str(notebooks),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    print(
        f"Colab rehearsal '{name}': Python {_python_version(python)}, "
        f"torch {versions['torch']}, transformers {versions['transformers']}, "
        f"peft {versions['peft']}, ipywidgets {versions['ipywidgets']}: notebooks "
        f"{time.monotonic() - notebooks_started:.0f} s, {time.monotonic() - started:.0f} s in all"
    )


def _normalised(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _python_version(python: str) -> str:
    command = [python, "-c", "import platform; print(platform.python_version())"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def _installed(python: str) -> dict[str, str]:
    """Package name -> version in the environment of ``python``."""
    listing = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    pairs = (line.split("==", 1) for line in listing.splitlines() if "==" in line)
    return {_normalised(name): version.split("+")[0] for name, version in pairs}
