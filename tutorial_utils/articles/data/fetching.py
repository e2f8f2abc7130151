"""Fetching the real sets, where the internet is: failing in seconds, never hanging, offline.

``fetch_real_data`` is the notebooks' optional fetch cell: it always returns one line, so a
notebook goes on with the generated stand-in whatever happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from torchvision import datasets

from tutorial_utils.articles.data.folders import (
    CIFAR_DIRNAME,
    CIFAR_TEST_FILE,
    CIFAR_TRAIN_FILES,
    DOGCAT_DIRNAME,
    cifar_missing,
    data_root,
    default_dogcat_root,
    has_imagefolder_splits,
    real_cifar10_present,
    real_dogcat_present,
)
from tutorial_utils.articles.profiles import Profile, get_profile
from tutorial_utils.network import reachable

__all__ = [
    "CIFAR_HOST",
    "DOGCAT_REPO_URL",
    "download_cifar10",
    "download_dogcat",
    "fetch_real_data",
    "REAL_DATASETS",
]

DOGCAT_REPO_URL = "https://github.com/laxmimerit/dog-cat-full-dataset.git"
GIT_CLONE_TIMEOUT_S = 1800
CIFAR_HOST = "www.cs.toronto.edu"
OFFLINE_CHECK_TIMEOUT_S = 3.0


def require_online(host: str, what_to_do: str) -> None:
    """A ``ConnectionError`` saying what to do, in seconds, where ``host`` is unreachable."""
    if not reachable(host, timeout_s=OFFLINE_CHECK_TIMEOUT_S):
        raise ConnectionError(f"cannot reach {host} (offline?): {what_to_do}")


def download_dogcat(dest: str | Path | None = None) -> Path:
    """Clone the article's dog/cat repository (``git clone --depth 1``); return its image root.

    ``dest`` is the clone folder (default ``<data root>/dog-cat-full-dataset``); the returned
    path is ``dest/data``, what ``dogcat_datasets`` takes. Nothing is fetched if it is there.
    """
    clone_dir = Path(dest) if dest is not None else data_root() / DOGCAT_DIRNAME
    images_root = clone_dir / "data"
    if has_imagefolder_splits(images_root):
        return images_root
    if clone_dir.is_dir() and any(clone_dir.iterdir()):
        raise FileExistsError(
            f"{clone_dir} exists but has no data/train and data/test: remove it or pass another dest"
        )
    require_online(
        "github.com",
        f"copy the dataset to {images_root} (train/<class>/, test/<class>/) or use the generated "
        f"set (`python -m tutorial_utils train --data synthetic`, make_synthetic_dogcat)",
    )
    if shutil.which("git") is None:
        raise RuntimeError(f"git is not installed: install it, or clone {DOGCAT_REPO_URL} yourself")
    clone_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{clone_dir.name}.", dir=clone_dir.parent))
    command = [
        "git",
        "-c",
        "http.lowSpeedLimit=1000",  # abort a stalled transfer after a minute
        "-c",
        "http.lowSpeedTime=60",
        "clone",
        "--depth",
        "1",
        DOGCAT_REPO_URL,
        str(staging),
    ]
    try:
        subprocess.run(
            command,
            check=True,
            timeout=GIT_CLONE_TIMEOUT_S,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
        staging.rename(clone_dir)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"cloning {DOGCAT_REPO_URL} failed ({error}); try again later") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return images_root


def download_cifar10(root: str | Path | None = None) -> Path:
    """Fetch CIFAR-10 with torchvision (as the article does) into ``root``; return ``root``."""
    root = Path(root) if root is not None else data_root()
    if not cifar_missing(root / CIFAR_DIRNAME, (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE)):
        return root
    require_online(
        CIFAR_HOST,
        f"copy cifar-10-batches-py/ into {root} or use the generated set "
        f"(tutorial_utils.articles.data.make_synthetic_cifar10 / ensure_cifar10)",
    )
    datasets.CIFAR10(str(root), train=True, download=True)
    return root


REAL_DATASETS = {
    # name: (what a learner fetches, the host it comes from)
    "dog-cat": (
        "the article's 25 000 JPEGs, a git clone of laxmimerit/dog-cat-full-dataset",
        "github.com",
    ),
    "CIFAR-10": ("the 163 MB python batches from the CIFAR page, via torchvision", CIFAR_HOST),
}


def fetch_real_data(dataset: str, profile: Profile | None = None, fetch: bool = True) -> str:
    """The notebooks' optional fetch cell: the real ``dataset`` into the data folder where the
    internet is. Returns one line for the notebook to print, whatever happened.

    Why never raise: offline, or when the download fails, the notebook goes on with the generated
    stand-in, and the line says so. The profile then trains on a sample of the real set.
    """
    if dataset not in REAL_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}: use one of {', '.join(REAL_DATASETS)}")
    what, host = REAL_DATASETS[dataset]
    profile = profile or get_profile()
    present = real_dogcat_present() if dataset == "dog-cat" else real_cifar10_present()
    where = default_dogcat_root() if dataset == "dog-cat" else data_root() / CIFAR_DIRNAME
    if not profile.use_real_data:
        return (
            f"profile {profile.name} always uses the generated {dataset} stand-in: nothing fetched"
        )
    if present:
        return f"the real {dataset} is already in {where}: nothing fetched"
    if not fetch:
        return f"real {dataset} not fetched: set FETCH_REAL_DATA = True in this cell for {what}"
    if not reachable(host, timeout_s=OFFLINE_CHECK_TIMEOUT_S):
        return f"offline ({host} unreachable): going on with the generated {dataset} stand-in"
    try:
        download_dogcat() if dataset == "dog-cat" else download_cifar10()
    except (OSError, RuntimeError) as error:  # ConnectionError is an OSError
        return f"fetching the real {dataset} failed ({error}); going on with the generated stand-in"
    return f"fetched the real {dataset} into {where}"
