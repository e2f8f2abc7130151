"""scripts/setup.py's platform decisions with the platform faked: torch pins per OS and machine,
the torch source, the interpreter, the paths, the stamp, and a whole dry run per OS.

Only Linux x86_64 runs for real here; the macOS and Windows answers are checked as decisions,
never run on a Mac or a Windows machine.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import setup as setup_script  # noqa: E402
from setup import (  # noqa: E402
    CPU_INDEX,
    DRY_RUN_ENV,
    PIP_ONLY_ENV,
    Runner,
    SetupError,
    choose_interpreter,
    lab_command,
    stamp,
    torch_choice,
    torch_source,
    venv_executable,
)


def _floor(requirement: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.search(r">=([\d.]+)", requirement).group(1).split("."))


def _pinned(pins: tuple[str, ...], name: str) -> tuple[int, ...]:
    version = next(p.split("==")[1] for p in pins if p.startswith(f"{name}=="))
    return tuple(int(part) for part in version.split("."))


@pytest.mark.parametrize(
    "system,machine,torch_pin",
    [
        ("Linux", "x86_64", "torch==2.15.0"),
        ("Linux", "aarch64", "torch==2.9.1"),
        ("Linux", "arm64", "torch==2.9.1"),  # some distributions say arm64
        ("Darwin", "arm64", "torch==2.9.1"),  # runs on macOS 11+; 2.12 onwards need macOS 14
        ("Windows", "AMD64", "torch==2.15.0"),
    ],
)
def test_each_supported_platform_gets_pins_within_pyproject(system, machine, torch_pin) -> None:
    choice = torch_choice(system, machine)
    assert choice.pins[0] == torch_pin and len(choice.pins) == 2
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in ("torch", "torchvision"):
        floor = _floor(next(d for d in dependencies if d.startswith(f"{name}>=")))
        assert _pinned(choice.pins, name) >= floor, (system, machine, name)


def test_untested_platforms_say_so_in_their_note() -> None:
    for system, machine in [("Darwin", "arm64"), ("Windows", "AMD64")]:
        assert "never run on" in torch_choice(system, machine).note
    assert "never run" not in torch_choice("Linux", "x86_64").note


@pytest.mark.parametrize(
    "system,machine,message",
    [("Darwin", "x86_64", "Intel Macs"), ("Windows", "ARM64", "Windows on Arm")],
)
def test_platforms_without_a_usable_torch_wheel_stop_with_one_line(system, machine, message):
    with pytest.raises(SetupError, match=message) as error:
        torch_choice(system, machine)
    assert "Colab" in str(error.value) and "\n" not in str(error.value)


def test_an_unknown_machine_takes_pip_s_newest_and_says_untested() -> None:
    choice = torch_choice("Linux", "riscv64")
    assert choice.pins == ("torch", "torchvision") and "untested" in choice.note


def test_no_driver_and_a_reachable_cpu_index_takes_the_cpu_build() -> None:
    asked = []
    options, reason = torch_source("Linux", lambda: False, lambda url: asked.append(url) or True)
    assert options[:2] == ["--index-url", CPU_INDEX] and "--extra-index-url" in options
    assert asked == [f"{CPU_INDEX}/torch/"] and "CPU build" in reason


def test_an_unreachable_cpu_index_falls_back_and_says_so() -> None:
    options, reason = torch_source("Linux", lambda: False, lambda url: False)
    assert options == [] and "unreachable" in reason and "CUDA build" in reason


def test_an_nvidia_driver_keeps_the_cuda_build_without_asking_the_cpu_index() -> None:
    options, reason = torch_source("Linux", lambda: True, lambda url: 1 / 0)
    assert options == [] and "NVIDIA driver is present" in reason


@pytest.mark.parametrize("system,word", [("Darwin", "mps"), ("Windows", "CPU only")])
def test_macos_and_windows_take_pypi_s_build_without_probing(system, word) -> None:
    options, reason = torch_source(system, lambda: 1 / 0, lambda url: 1 / 0)
    assert options == [] and word in reason


def _which(present: set[str]):
    return lambda name: f"/usr/bin/{name}" if name in present else None


def test_the_interpreter_is_python_3_11_first_and_never_older() -> None:
    versions = {"python3.11": (3, 11), "python3.12": (3, 12), "python3": (3, 9)}
    version_of = lambda command: versions.get(command[0])  # noqa: E731
    both = _which({"python3.11", "python3.12", "python3"})
    assert choose_interpreter("Linux", {}, both, version_of) == ["python3.11"]
    assert choose_interpreter("Darwin", {}, _which({"python3.12"}), version_of) == ["python3.12"]
    with pytest.raises(SetupError, match=r"python3 is 3\.9.*brew install python@3\.11"):
        old_only = _which({"python3"})
        choose_interpreter("Darwin", {}, old_only, lambda c: versions.get(c[0], (3, 9)))


def test_python_from_the_environment_wins_and_is_checked() -> None:
    environ = {"PYTHON": "/opt/py/bin/python3.13"}
    which = lambda name: name  # noqa: E731
    assert choose_interpreter("Linux", environ, which, lambda c: (3, 13)) == [environ["PYTHON"]]
    with pytest.raises(SetupError, match="3.10"):
        choose_interpreter("Linux", environ, which, lambda c: (3, 10))


def test_windows_asks_the_py_launcher_for_3_11() -> None:
    asked = []
    version_of = lambda command: asked.append(command) or (3, 11)  # noqa: E731
    assert choose_interpreter("Windows", {}, _which({"py"}), version_of) == ["py", "-3.11"]
    assert asked == [["py", "-3.11"]]


def test_a_broken_interpreter_is_skipped() -> None:
    # pyenv's shims exist on PATH for versions that are not installed, and fail when run
    version_of = lambda command: None if command[0] == "python3.11" else (3, 12)  # noqa: E731
    chosen = choose_interpreter("Linux", {}, _which({"python3.11", "python3"}), version_of)
    assert chosen == ["python3"]


def test_venv_paths_and_the_lab_line_per_os(tmp_path) -> None:
    assert venv_executable(tmp_path, "python", "Windows") == tmp_path / "Scripts" / "python.exe"
    assert venv_executable(tmp_path, "jupyter", "Darwin") == tmp_path / "bin" / "jupyter"
    assert lab_command("Windows") == r".\.venv\Scripts\jupyter lab --notebook-dir=notebooks"


def _fake_root(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    for name in setup_script.STAMPED_FILES:
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_a.ipynb").write_text("{}")
    return tmp_path


def test_the_stamp_follows_files_extras_and_pins_without_sha256sum(tmp_path) -> None:
    root = _fake_root(tmp_path)
    first = stamp(root, "lab", ("torch==2.9.1",))
    assert first == stamp(root, "lab", ("torch==2.9.1",))
    assert first != stamp(root, "test,browser", ("torch==2.9.1",))
    assert first != stamp(root, "lab", ("torch==2.15.0",))
    (root / "constraints.txt").write_text("numpy==2.0.0\n")
    assert first != stamp(root, "lab", ("torch==2.9.1",))


def _dry_run(
    monkeypatch, capsys, root: Path, system: str, machine: str, extras: str, pip_only=False
) -> str:
    monkeypatch.setattr(setup_script.platform, "system", lambda: system)
    monkeypatch.setattr(setup_script.platform, "machine", lambda: machine)
    monkeypatch.setattr(setup_script, "choose_interpreter", lambda system, environ: ["python3.11"])
    offline = lambda system: torch_source(system, lambda: False, lambda url: False)  # noqa: E731
    monkeypatch.setattr(setup_script, "torch_source", offline)
    setup_script.setup(
        extras, root, {DRY_RUN_ENV: "1", **({PIP_ONLY_ENV: "1"} if pip_only else {})}
    )
    return capsys.readouterr().out


def test_a_mac_dry_run_installs_the_macos_pins_from_pypi(tmp_path, monkeypatch, capsys) -> None:
    out = _dry_run(monkeypatch, capsys, _fake_root(tmp_path), "Darwin", "arm64", "lab")
    commands = [line for line in out.splitlines() if line.startswith("would run: ")]
    assert "python3.11 -m venv" in commands[0]
    assert any("pip install -q torch==2.9.1 torchvision==0.24.1 -c" in c for c in commands)
    assert "--index-url" not in out and "jupyter lab" not in out  # ./scripts/lab opens it
    assert not (tmp_path / ".venv").exists()  # a dry run installs nothing


def test_a_windows_dry_run_uses_scripts_and_prints_the_lab_line(tmp_path, monkeypatch, capsys):
    out = _dry_run(monkeypatch, capsys, _fake_root(tmp_path), "Windows", "AMD64", "lab")
    venv_python = str(tmp_path / ".venv" / "Scripts" / "python.exe")
    assert f"would run: {venv_python} -m pip install -q --no-compile" in out  # uv, with pip
    uv = str(tmp_path / ".venv" / "Scripts" / "uv.exe")
    assert f"would run: {uv} pip install -q torch==2.15.0 torchvision==0.29.2 -c" in out
    assert f"--python {venv_python} " in out
    assert "trust" in out and "01_a.ipynb" in out
    assert out.rstrip().endswith(lab_command("Windows"))


def test_a_fresh_stamp_installs_nothing(tmp_path, monkeypatch, capsys) -> None:
    root = _fake_root(tmp_path)
    python = venv_executable(root / ".venv", "python", "Linux")
    python.parent.mkdir(parents=True)
    python.write_text("")
    pins = torch_choice("Linux", "x86_64").pins
    (root / ".venv" / ".setup-stamp").write_text(stamp(root, "test,browser", pins) + "\n")
    assert _dry_run(monkeypatch, capsys, root, "Linux", "x86_64", "test,browser") == ""
    out = _dry_run(monkeypatch, capsys, root, "Linux", "x86_64", "lab")  # other extras: install
    assert "-m venv" not in out and f"-e {root}[lab]" in out


@pytest.mark.parametrize("pip_only", [False, True], ids=["uv", "pip"])
def test_every_install_is_within_the_constraints_and_compiles_nothing(
    tmp_path, monkeypatch, capsys, pip_only
) -> None:
    """torch's own dependencies too: installed unconstrained, they were reinstalled at the
    constraints' versions by the package's step. Python compiles what a session imports (uv
    compiles nothing unless asked). pip installs uv, and uv the rest, unless told otherwise."""
    root = _fake_root(tmp_path)
    out = _dry_run(monkeypatch, capsys, root, "Linux", "x86_64", "test,browser", pip_only)
    installs = [line for line in out.splitlines() if " pip install " in line]
    assert len(installs) == 3 + (not pip_only) and "--upgrade pip" in installs[0]  # pip unknown
    by_pip = [line for line in installs if " -m pip install " in line]
    assert len(by_pip) == (3 if pip_only else 2)
    if not pip_only:
        assert setup_script.UV_PIN in by_pip[1]
    for line in by_pip:
        assert "--no-compile" in line and "--disable-pip-version-check" in line
    for line in installs[-2:]:
        assert f"-c {root / 'constraints.txt'}" in line and "--compile-bytecode" not in line
        assert ("--index-strategy unsafe-best-match" in line) == (not pip_only)


PIP_CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/other.crt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/ignored'
install.index_url='https://mirror.example/simple'
global.index-url='https://ignored.example/simple'
"""


def test_uv_gets_the_sources_pip_is_configured_with() -> None:
    """uv reads no pip.conf and no PIP_* variable: each index and wheel folder is passed on,
    the environment's value over a file's, [install]'s over [global]'s."""
    options, cert = setup_script.pip_sources(PIP_CONFIG_LIST)
    assert options == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/pypi/simple",
        "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",
    ]  # fmt: skip
    assert cert == "/etc/ssl/certs/ca-certificates.crt"
    assert setup_script.pip_sources("") == ([], None)
    assert setup_script.pip_sources("global.no-index='true'\n")[0] == ["--no-index"]


class _Recorder(Runner):
    """Records each command; fails those that hold a word in ``failing``."""

    def __init__(self, failing: set[str]) -> None:
        super().__init__(dry_run=False)
        self.commands: list[list[str]] = []
        self.failing = failing

    def run(self, command, env=None) -> None:
        self.commands.append(list(command))
        if self.failing & set(command):
            raise SetupError(f"this command failed (exit 1): {command[0]}")


def test_pip_installs_where_uv_cannot_be_installed_or_fails(tmp_path, monkeypatch) -> None:
    pip = [str(tmp_path / "python"), "-m", "pip", "install", "-q"]
    runner = _Recorder(failing={setup_script.UV_PIN})
    assert setup_script.uv_installer(runner, tmp_path, pip, "Linux", {}) is None
    assert runner.commands[-1][-1] == setup_script.UV_PIN
    listed = "global.extra-index-url='file:///opt/pypi/simple'\n"
    done = subprocess.CompletedProcess([], 0, stdout=listed)
    monkeypatch.setattr(setup_script.subprocess, "run", lambda *args, **kwargs: done)
    uv = setup_script.uv_installer(_Recorder(set()), tmp_path, pip, "Linux", {})
    assert uv is not None and uv[1][-2:] == ["--extra-index-url", "file:///opt/pypi/simple"]
    runner = _Recorder(failing={str(tmp_path / "bin" / "uv")})
    setup_script.install_with(runner, uv, pip, ["-e", "pkg"])
    assert [command[0] for command in runner.commands] == [uv[0][0], pip[0]]
    assert runner.commands[-1] == [*pip, "-e", "pkg", *setup_script.PIP_OPTIONS]
    assert setup_script.uv_installer(runner, tmp_path, pip, "Linux", {PIP_ONLY_ENV: "1"}) is None


def test_a_recent_pip_is_not_upgraded(tmp_path) -> None:
    venv = tmp_path / ".venv"
    assert setup_script.pip_is_older_than(venv, (23, 0))  # none found
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "pip-22.3.1.dist-info").mkdir(parents=True)
    assert setup_script.pip_is_older_than(venv, (23, 0))
    (site / "pip-22.3.1.dist-info").rmdir()
    (site / "pip-23.2.1.dist-info").mkdir()
    assert not setup_script.pip_is_older_than(venv, (23, 0))
    windows_site = tmp_path / "win" / "Lib" / "site-packages"
    (windows_site / "pip-24.0.dist-info").mkdir(parents=True)
    assert not setup_script.pip_is_older_than(tmp_path / "win", (23, 0))


def test_every_step_announces_itself_before_it_runs(tmp_path, monkeypatch, capsys) -> None:
    out = _dry_run(monkeypatch, capsys, _fake_root(tmp_path), "Linux", "x86_64", "lab")
    lines = out.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("would run: "):
            assert lines[index - 1].startswith("setup ["), line


def test_the_runner_drops_pip_mirror_noise_and_reports_a_failure(capsys) -> None:
    noisy = (
        "import sys; sys.stderr.write(\"Location 'x' is ignored: it is neither a file\\nreal\\n\")"
    )
    Runner(dry_run=False).run([sys.executable, "-c", noisy])
    assert capsys.readouterr().err == "real\n"
    with pytest.raises(SetupError, match="exit 3"):
        Runner(dry_run=False).run([sys.executable, "-c", "raise SystemExit(3)"])


def test_setup_py_is_python_3_9_syntax_and_stdlib_only() -> None:
    """macOS's /usr/bin/python3 is 3.9 and has nothing installed: setup.py must run there."""
    source = (ROOT / "scripts" / "setup.py").read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
    assert not any(isinstance(node, ast.Match) for node in ast.walk(tree))


def _python_3_9() -> str | None:
    found = glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9"))
    return found[0] if found else None


@pytest.mark.skipif(_python_3_9() is None, reason="no Python 3.9 on this machine")
def test_setup_py_runs_under_python_3_9(tmp_path) -> None:
    root = _fake_root(tmp_path)
    (root / "scripts" / "setup.py").write_bytes((ROOT / "scripts" / "setup.py").read_bytes())
    result = subprocess.run(
        [_python_3_9(), str(root / "scripts" / "setup.py"), "lab"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, DRY_RUN_ENV: "1", "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stderr
    assert "would run: " in result.stdout and "]: done" in result.stdout
