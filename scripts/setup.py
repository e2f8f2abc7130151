"""Creates .venv and installs the package editable, on Linux, macOS and Windows alike.

One portable setup, standard library only, so that it runs under any Python 3 a machine has
(macOS's /usr/bin/python3 is 3.9) and needs no GNU tool, no bash and no sha256sum. It chooses the
interpreter for .venv (3.11 first: what the suite runs), the torch build for this OS and machine,
and installs the package with the requested extras within constraints.txt. A stamp of what it
installed is kept in .venv, so a re-run that would change nothing returns at once. Every step
prints as it starts.

Usage:   python3 scripts/setup.py [EXTRAS]   (Linux, macOS: ./scripts/lab and ./scripts/test run it)
         py scripts\\setup.py lab             (Windows: then run the jupyter line it prints)
EXTRAS:  comma-separated extras of pyproject.toml: lab, or test,browser
PYTHON:  the interpreter to create .venv with (default: python3.11, 3.12, 3.13, then python3)
TUTORIAL_SETUP_DRY_RUN=1: print the commands instead of running them (nothing is installed)
TUTORIAL_SETUP_PIP=1: install with pip alone (by default pip installs uv, and uv the rest)
"""

from __future__ import annotations

import ast
import glob
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_INDEX = "https://pypi.org/simple"
DRY_RUN_ENV = "TUTORIAL_SETUP_DRY_RUN"
MIN_PYTHON = (3, 11)  # pyproject.toml's requires-python
STAMPED_FILES = ("pyproject.toml", "constraints.txt", "scripts/setup.py")
# The venv's own pip (Python 3.11.7 brings 23.2.1) installs everything here; an older one is
# upgraded first. Upgrading a recent one cost 10 s of a fresh setup for nothing.
MIN_PIP = (23, 0)
# --no-compile: pip byte-compiles every installed module (14,500 files, 3,000 of them torch's),
# and a session imports about 4,300 of them, which Python compiles on first import instead: 20 s
# or so less setup on 2 cores. No version check: one request to the index less per command.
PIP_OPTIONS = ("--no-compile", "--disable-pip-version-check")
# This machine's pip mirrors print a warning per package for absent local folders: drop those.
PIP_NOISE = "is ignored: it is neither"
PIP_ONLY_ENV = "TUTORIAL_SETUP_PIP"
# uv installs what pip would, but downloads and unpacks the wheels in parallel and links them from
# its cache: a fresh .venv of the test extras (torch's CUDA build) took 34 s with uv where pip
# took 82 s here, caches empty, and 7 s once uv's cache held the wheels (2026-12-04, load average
# 2-3). pip installs this one small wheel first, and stays the fallback wherever uv cannot be
# installed or fails.
UV_PIN = "uv==0.13.9"
# uv reads no pip configuration: the package sources pip is configured with are passed on, and
# pip's choice among them (the newest version on any index, not the first index that has one)
UV_CHOICE = ("--index-strategy", "unsafe-best-match")
PIP_SOURCES = {option: f"--{option}" for option in ("index-url", "extra-index-url", "find-links")}
COLAB = "open the notebooks on Colab instead (the badge at the top of each)"


class SetupError(Exception):
    """A reason setup cannot go on, said in one line with what to do."""


class TorchChoice(NamedTuple):
    """The torch and torchvision requirements for one OS and machine, and what to tell the user."""

    pins: tuple[str, ...]
    note: str


# (platform.system(), normalised machine) -> pins. The x86_64 Linux pair is what the suite runs
# here (the newest release it passes on; 2.14.1 and 2.9.1 pass too: docs/TESTING.md); 2.9.1
# is the newest whose macOS arm64 wheel runs on macOS 11 and later (2.12
# onwards are built for macOS 14 only) and the release the aarch64 Linux wheels were chosen at.
TORCH_PINS = {
    ("Linux", "x86_64"): TorchChoice(
        ("torch==2.15.0", "torchvision==0.29.2"), "Linux x86_64: the release the suite runs"
    ),
    ("Linux", "aarch64"): TorchChoice(("torch==2.9.1", "torchvision==0.24.1"), "Linux aarch64"),
    ("Darwin", "arm64"): TorchChoice(
        ("torch==2.9.1", "torchvision==0.24.1"),
        "macOS on Apple Silicon: the newest torch whose wheel runs on macOS 11 and later, "
        "with Apple's GPU as device 'mps' (never run on a Mac here)",
    ),
    ("Windows", "x86_64"): TorchChoice(
        ("torch==2.15.0", "torchvision==0.29.2"),
        "Windows x86_64: PyPI's CPU build (never run on Windows here)",
    ),
}
UNSUPPORTED = {
    ("Darwin", "x86_64"): "PyTorch publishes no wheel for Intel Macs after torch 2.2.2, and this "
    f"package needs torch 2.9 or later: {COLAB}",
    ("Windows", "arm64"): f"PyPI has no torch wheel for Windows on Arm: {COLAB}",
}
MACHINE_ALIASES = {"amd64": "x86_64", "x64": "x86_64"}


def normalised_machine(system: str, machine: str) -> str:
    """One name per architecture: Windows says AMD64/ARM64, Linux aarch64, macOS arm64."""
    name = MACHINE_ALIASES.get(machine.lower(), machine.lower())
    if system == "Linux" and name == "arm64":
        return "aarch64"
    if system != "Linux" and name == "aarch64":
        return "arm64"
    return name


def torch_choice(system: str, machine: str) -> TorchChoice:
    """The torch pins for ``platform.system()`` and ``platform.machine()``; SetupError where
    PyPI has no torch this package can use."""
    key = (system, normalised_machine(system, machine))
    if key in UNSUPPORTED:
        raise SetupError(UNSUPPORTED[key])
    if key in TORCH_PINS:
        return TORCH_PINS[key]
    return TorchChoice(
        ("torch", "torchvision"),
        f"{system} {machine}: no tested pins for this machine, so pip's newest (untested)",
    )


def nvidia_driver_present() -> bool:
    """An NVIDIA driver is loaded (its /proc entry) or its tool is installed."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def reachable(url: str, timeout_s: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except OSError:
        return False


def torch_source(
    system: str,
    driver: Callable[[], bool] = nvidia_driver_present,
    can_reach: Callable[[str], bool] = reachable,
) -> tuple[list[str], str]:
    """pip options for torch and the reason for them.

    PyPI's torch for Linux is the CUDA build: 3.2 GB of ``nvidia-*`` wheels and 0.9 GB of triton
    that a machine without an NVIDIA GPU never uses. PyTorch's own CPU index has the same
    versions without them (about 0.2 GB). PyPI's macOS and Windows builds have no CUDA in them.
    """
    if system == "Darwin":
        return [], "PyPI's macOS build (CPU, and Apple's GPU as 'mps'; about 0.1 GB)"
    if system == "Windows":
        return [], "PyPI's Windows build (CPU only; a CUDA build: see pytorch.org)"
    if driver():
        return [], "an NVIDIA driver is present: the CUDA build from PyPI (about 4 GB with CUDA)"
    if can_reach(f"{CPU_INDEX}/torch/"):
        options = ["--index-url", CPU_INDEX, "--extra-index-url", PYPI_INDEX]
        return options, f"no NVIDIA driver: the CPU build from {CPU_INDEX} (about 0.2 GB)"
    return [], (
        f"no NVIDIA driver, but {CPU_INDEX} is unreachable: the default build from the "
        "configured index (the CUDA build on PyPI, about 4 GB, runs on the CPU too)"
    )


def interpreter_candidates(system: str) -> list[list[str]]:
    """Interpreters to create .venv with, best first: 3.11 is what the suite runs."""
    if system == "Windows":  # the py launcher picks an installed version by number
        return [["py", "-3.11"], ["py", "-3.12"], ["py", "-3.13"], [sys.executable]]
    return [["python3.11"], ["python3.12"], ["python3.13"], ["python3"], [sys.executable]]


def python_version(command: Sequence[str]) -> tuple[int, int] | None:
    """The (major, minor) version ``command`` runs, or None when it does not run."""
    try:
        result = subprocess.run(
            [*command, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    major, minor = result.stdout.split()
    return int(major), int(minor)


def choose_interpreter(
    system: str,
    environ: dict[str, str],
    which: Callable[[str], str | None] = shutil.which,
    version_of: Callable[[Sequence[str]], tuple[int, int] | None] = python_version,
) -> list[str]:
    """The command of the first interpreter that exists and is Python 3.11 or later."""
    if environ.get("PYTHON"):
        candidates = [[environ["PYTHON"]]]
    else:
        candidates = interpreter_candidates(system)
    seen = []
    for command in candidates:
        if which(command[0]) is None:
            continue
        version = version_of(command)
        if version is not None and version >= MIN_PYTHON:
            return command
        seen.append(f"{' '.join(command)} is {'.'.join(map(str, version or ())) or 'broken'}")
    install = {
        "Darwin": "from python.org or with `brew install python@3.11`",
        "Windows": "from python.org (it includes the `py` launcher)",
    }.get(system, "with your package manager (e.g. apt install python3.11 python3.11-venv)")
    found = f" (found: {'; '.join(seen)})" if seen else ""
    raise SetupError(f"no Python 3.11 or later found{found}: install Python 3.11 {install}")


def venv_executable(venv: Path, name: str, system: str) -> Path:
    """A program inside the virtual environment: Scripts\\name.exe on Windows, bin/name elsewhere."""
    if system == "Windows":
        return venv / "Scripts" / f"{name}.exe"
    return venv / "bin" / name


def stamp(root: Path, extras: str, pins: Sequence[str]) -> str:
    """What an installation depends on: the files that define it, the extras and the pins."""
    digest = hashlib.sha256()
    for name in STAMPED_FILES:
        digest.update((root / name).read_bytes())
    return f"{digest.hexdigest()} {extras} {' '.join(pins)}"


def lab_command(system: str) -> str:
    """How to open JupyterLab from the repository's folder once setup is done."""
    if system == "Windows":
        return r".\.venv\Scripts\jupyter lab --notebook-dir=notebooks"
    return "./scripts/lab"


class Runner:
    """Runs the setup's commands (or prints them in a dry run) and says each step as it starts."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.started = time.monotonic()

    def step(self, message: str) -> None:
        print(f"setup [{time.monotonic() - self.started:.0f} s]: {message}", flush=True)

    def run(self, command: Sequence[str], env: dict[str, str] | None = None) -> None:
        if self.dry_run:
            print("would run: " + " ".join(str(part) for part in command), flush=True)
            return
        process = subprocess.Popen(list(command), stderr=subprocess.PIPE, text=True, env=env)
        assert process.stderr is not None
        for line in process.stderr:
            if PIP_NOISE not in line:
                sys.stderr.write(line)
        if process.wait() != 0:
            raise SetupError(
                f"this command failed (exit {process.returncode}): {' '.join(command)}"
            )


def pip_is_older_than(venv: Path, version: tuple[int, int]) -> bool:
    """The virtual environment's pip is older than ``version``, or not found (read from its
    dist-info folder's name: no process to start)."""
    found = glob.glob(str(venv / "*" / "*" / "site-packages" / "pip-*.dist-info")) + glob.glob(
        str(venv / "Lib" / "site-packages" / "pip-*.dist-info")
    )
    if not found:
        return True
    release = Path(found[0]).name[len("pip-") : -len(".dist-info")].split(".")
    try:
        return tuple(int(part) for part in release[:2]) < version
    except ValueError:
        return True


def pip_sources(config_list: str) -> tuple[list[str], str | None]:
    """uv's options for the indexes and wheel folders in ``pip config list``'s output, and pip's
    certificate bundle. An environment variable overrides a file, [install] overrides [global]."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in config_list.splitlines():
        key, equals, quoted = line.partition("=")
        section, _, option = key.strip().rpartition(".")
        option = option.replace("_", "-")
        if not equals or (option not in PIP_SOURCES and option not in ("no-index", "cert")):
            continue
        try:
            value = str(ast.literal_eval(quoted.strip()))
        except (ValueError, SyntaxError):
            value = quoted.strip().strip("'\"")
        rank = {":env:": 2, "install": 1}.get(section, 0)
        if option not in chosen or rank >= chosen[option][0]:
            chosen[option] = (rank, value)
    options = []
    for option, flag in PIP_SOURCES.items():
        for value in chosen.get(option, (0, ""))[1].split():
            options += [flag, value]
    if chosen.get("no-index", (0, ""))[1].lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    return options, chosen["cert"][1] if "cert" in chosen else None


def uv_installer(
    runner: Runner, venv: Path, pip: list[str], system: str, environ: dict[str, str]
) -> tuple[list[str], list[str], dict[str, str]] | None:
    """``uv pip install``, its options for ``venv`` and pip's sources, and its environment; None
    where pip must install instead (asked to, or uv could not be installed)."""
    if environ.get(PIP_ONLY_ENV) == "1":
        return None
    uv = venv_executable(venv, "uv", system)
    if not uv.exists():
        runner.step(f"installing {UV_PIN} (it installs the rest; pip where it cannot)")
        try:
            runner.run([*pip, *PIP_OPTIONS, UV_PIN])
        except SetupError as error:
            runner.step(f"uv is not available ({error}): pip installs everything")
            return None
    python = pip[0]
    options, cert = [], None
    if not runner.dry_run:
        listed = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True
        )
        options, cert = pip_sources(listed.stdout if listed.returncode == 0 else "")
    env = dict(environ)
    if cert and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = cert  # uv's own certificate store otherwise
    return [str(uv), "pip", "install", "-q"], ["--python", python, *UV_CHOICE, *options], env


def trust_notebooks(runner: Runner, root: Path, venv: Path, system: str) -> None:
    """Trust the project's own notebooks, so their saved widget panels render on first open."""
    notebooks = sorted(glob.glob(str(root / "notebooks" / "*.ipynb")))
    runner.run([str(venv_executable(venv, "jupyter", system)), "trust", *notebooks])


def setup(extras: str, root: Path = ROOT, environ: dict[str, str] | None = None) -> None:
    """Bring ``root``/.venv up to date with ``extras``; fast when the stamp says it already is."""
    environ = dict(os.environ) if environ is None else environ
    system = platform.system()
    choice = torch_choice(system, platform.machine())
    venv = root / ".venv"
    python = venv_executable(venv, "python", system)
    stamp_file = venv / ".setup-stamp"
    wanted = stamp(root, extras, choice.pins)
    runner = Runner(dry_run=environ.get(DRY_RUN_ENV) == "1")
    fresh = python.exists() and stamp_file.exists() and stamp_file.read_text().strip() == wanted
    if not fresh:
        install(runner, root, venv, python, system, extras, choice, environ)
        if not runner.dry_run:
            stamp_file.write_text(wanted + "\n")
        runner.step("done")
    if system == "Windows" and "lab" in extras.split(","):
        trust_notebooks(runner, root, venv, system)
        print(f"setup: now open JupyterLab from this folder with:\n  {lab_command(system)}")


def install(
    runner: Runner,
    root: Path,
    venv: Path,
    python: Path,
    system: str,
    extras: str,
    choice: TorchChoice,
    environ: dict[str, str],
) -> None:
    """Create the virtual environment if needed and install torch, then the package."""
    pins = " ".join(choice.pins)
    runner.step(f"preparing {venv} (torch: {pins}, {choice.note}; extras: {extras or 'none'})")
    if not python.exists():
        interpreter = choose_interpreter(system, environ)
        runner.step(f"creating the virtual environment with {' '.join(interpreter)}")
        runner.run([*interpreter, "-m", "venv", str(venv)])
    pip = [str(python), "-m", "pip", "install", "-q"]
    if pip_is_older_than(venv, MIN_PIP):
        runner.step(f"upgrading pip (older than {'.'.join(map(str, MIN_PIP))})")
        runner.run([*pip, *PIP_OPTIONS, "--upgrade", "pip"])
    uv = uv_installer(runner, venv, pip, system, environ)
    constraints = ["-c", str(root / "constraints.txt")]
    options, reason = torch_source(system)
    runner.step(f"installing {pins}: {reason} (the longest step; quiet while it downloads)")
    install_with(runner, uv, pip, [*options, *choice.pins, *constraints])
    spec = f"{root}[{extras}]" if extras else str(root)
    runner.step(
        f"installing the package (editable) with {extras or 'no'} extras within "
        "constraints.txt (about 0.3 GB)"
    )
    install_with(runner, uv, pip, [*constraints, "-e", spec])


def install_with(
    runner: Runner,
    uv: tuple[list[str], list[str], dict[str, str]] | None,
    pip: list[str],
    arguments: list[str],
) -> None:
    """Install ``arguments`` with uv where it is available, and with pip where uv fails."""
    if uv is not None:
        command, options, env = uv
        try:
            runner.run([*command, *arguments, *options], env=env)
            return
        except SetupError as error:
            runner.step(f"uv failed ({error}); pip tries the same")
    runner.run([*pip, *arguments, *PIP_OPTIONS])


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip().split("\n\n")[-1])
        return 0
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(__doc__.strip().split("\n\n")[-1], file=sys.stderr)
        return 2
    try:
        setup(argv[0] if argv else "")
    except SetupError as error:
        print(f"setup: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
