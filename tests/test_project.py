"""The project's own promises: profiles, conda/pip agreement, the command line."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tutorial_utils.articles.profiles import PROFILES, get_profile

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch"}


def requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0].strip().lower()


def test_environment_yml_is_the_runtime_packages_and_jupyterlab():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lab = pyproject["project"]["optional-dependencies"]["lab"]
    pip_names = {requirement_name(s) for s in pyproject["project"]["dependencies"] + lab}
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_specs = [d for d in environment["dependencies"] if isinstance(d, str)]
    conda_names = {CONDA_TO_PIP.get(n, n) for n in map(requirement_name, conda_specs)}
    conda_names -= {"python", "pip"}
    assert conda_names == pip_names
    assert "conda-forge" in environment["channels"]
    assert any(d.startswith("python=3.11") for d in conda_specs)
    pip_section = next(d["pip"] for d in environment["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip_section


# What conda accepts in an environment file, and a dependency as conda's MatchSpec writes it.
CONDA_KEYS = {"name", "channels", "dependencies", "prefix", "variables"}
MATCH_SPEC = re.compile(
    r"^[a-z0-9][a-z0-9_.-]*(=[\d.*]+|(==|>=|<=|>|<|!=)[\w.]+(,(>=|<=|>|<|!=)[\w.]+)*)?$"
)


def test_environment_yml_reads_as_conda_reads_it_with_pyproject_s_bounds():
    """Conda reads the file as YAML and each string dependency as a MatchSpec; every version
    bound must be pyproject's own. Never created here: no conda channel is reachable."""
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert set(environment) <= CONDA_KEYS and isinstance(environment["name"], str)
    assert all(isinstance(channel, str) for channel in environment["channels"])
    strings = [d for d in environment["dependencies"] if isinstance(d, str)]
    sections = [d for d in environment["dependencies"] if not isinstance(d, str)]
    assert len(sections) == 1 and list(sections[0]) == ["pip"]  # the one nested form conda takes
    assert all(isinstance(line, str) for line in sections[0]["pip"])
    for spec in strings:
        assert MATCH_SPEC.match(spec), f"{spec!r} is not a conda MatchSpec"
    conda_bounds = {
        CONDA_TO_PIP.get(requirement_name(s), requirement_name(s)): s[len(requirement_name(s)) :]
        for s in strings
    }
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in pyproject["dependencies"] + pyproject["optional-dependencies"]["lab"]:
        name = requirement_name(spec)
        assert conda_bounds[name] == spec[len(name) :].replace(" ", ""), name
    assert pyproject["requires-python"] == ">=3.11" and conda_bounds["python"] == "=3.11"


def test_installing_the_package_alone_installs_no_jupyter_frontend():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = {requirement_name(s) for s in pyproject["project"]["dependencies"]}
    assert not runtime & {"jupyterlab", "notebook", "jupyter-server", "jupyter", "ipykernel"}
    assert "ipywidgets" in runtime  # the panels: imported by the notebooks, served by any Jupyter
    lab_script = (ROOT / "scripts" / "lab").read_text()
    assert 'setup.py" "lab"' in lab_script  # ./scripts/lab installs JupyterLab, not test tools


def test_profile_from_environment_and_unknown_name(monkeypatch):
    monkeypatch.setenv("TUTORIAL_PROFILE", "cpu")
    assert get_profile().name == "cpu"
    assert get_profile("ci").name == "ci"
    monkeypatch.setenv("TUTORIAL_PROFILE", "huge")
    with pytest.raises(ValueError, match="one of ci, cpu, gpu, article"):
        get_profile()


def test_default_profile_follows_the_hardware(monkeypatch):
    monkeypatch.delenv("TUTORIAL_PROFILE", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert get_profile().name == "gpu"
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert get_profile().name == "cpu"


def test_profiles_grow_from_ci_to_article():
    ci, cpu, gpu, article = (PROFILES[name] for name in ("ci", "cpu", "gpu", "article"))
    assert ci.image_size < cpu.image_size < article.image_size == 224
    assert article.batch_size == 64 and article.epochs == 10
    # gpu: the articles' regime (image sizes, batches, card) on less data and fewer epochs
    regime = ("image_size", "batch_size", "cifar_image_size", "cifar_batch_size")
    assert all(getattr(gpu, key) == getattr(article, key) for key in regime)
    assert gpu.dogcat_train_images < article.dogcat_train_images and gpu.epochs < article.epochs
    assert gpu.dogcat_train_images % gpu.batch_size == 0  # whole batches only


def run_cli(*args: str, env_profile: str = "ci") -> subprocess.CompletedProcess:
    env = {"TUTORIAL_PROFILE": env_profile, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "tutorial_utils", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["train", "--experiment", "resnet"], "invalid choice"),
        (["train", "--experiment", "vgg16-dogcat", "--epochs", "0"], "positive integer"),
        (
            [
                "train",
                "--experiment",
                "vgg16-dogcat",
                "--strategy",
                "segments-11",
                "--data",
                "synthetic",
            ],
            "out of range",
        ),
        (
            [
                "train",
                "--experiment",
                "neta-cifar10",
                "--strategy",
                "segments-3",
                "--data",
                "synthetic",
            ],
            "use --strategy none",
        ),
        (
            ["train", "--experiment", "vgg16-dogcat", "--data", "/nonexistent/dogcat"],
            "/nonexistent/dogcat",
        ),
        (["train", "--experiment", "vgg16-dogcat", "--image-size", "8"], "at least 32"),
        (["bench", "--image-size", "16"], "at least 32"),
        (["train", "--experiment", "vgg16-dogcat", "--strategy", "every-0"], "unknown strategy"),
        (
            ["estimate", "--hf-preset", "gpt2", "--strategies", "segments-2"],
            "splits an nn.Sequential",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_no_traceback(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


PARSE_ONLY = """
import sys
from tutorial_utils.__main__ import main
try:
    main(["train", "--experiment", "resnet"])
except SystemExit:
    pass
print("torch" in sys.modules)
"""


def test_a_bad_argument_is_answered_before_torch_is_imported():
    """Parse first: a typo costs no torch import (5-9 s on a slow machine)."""
    result = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.stdout.strip() == "False", result.stdout + result.stderr
    assert "invalid choice" in result.stderr
