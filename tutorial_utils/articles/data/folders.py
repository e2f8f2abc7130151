"""Where the tutorial's data lives, and in what layout: the folder, the real sets' file names.

Every other data module reads its paths from here: ``data_root`` decides the one folder, and a
set counts as real only where no generator's manifest sits beside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = [
    "CIFAR_DIRNAME",
    "CIFAR_FULL_SIZES",
    "CIFAR_LABEL_NAMES",
    "CIFAR_META_FILE",
    "cifar_missing",
    "CIFAR_TEST_FILE",
    "CIFAR_TRAIN_FILES",
    "DATA_DIR_ENV",
    "data_root",
    "default_dogcat_root",
    "DOGCAT_CLASSES",
    "DOGCAT_DIRNAME",
    "has_imagefolder_splits",
    "MANIFEST_NAME",
    "read_manifest",
    "real_cifar10_present",
    "real_dogcat_present",
    "synthetic_banner",
]

DATA_DIR_ENV = "TUTORIAL_DATA_DIR"
MANIFEST_NAME = "synthetic-manifest.json"  # what a generated set carries, and a real one lacks

DOGCAT_DIRNAME = "dog-cat-full-dataset"
DOGCAT_CLASSES = ("cats", "dogs")

CIFAR_DIRNAME = "cifar-10-batches-py"
CIFAR_TRAIN_FILES = tuple(f"data_batch_{number}" for number in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
CIFAR_META_FILE = "batches.meta"
CIFAR_LABEL_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR_FULL_SIZES = (50000, 10000)


def data_root() -> Path:
    """The one folder all data goes to: ``$TUTORIAL_DATA_DIR``, else ``data/`` of the project.

    Resolved from the package's location, never from the working directory, so a notebook in
    ``notebooks/`` and a test run from the root find the same files. A copy installed outside a
    checkout (``pip install git+...`` on Colab) has no project folder and uses a user cache instead.
    """
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    project = Path(__file__).resolve().parents[3]  # tutorial_utils/articles/data/folders.py
    if (project / "pyproject.toml").is_file():
        return project / "data"
    return Path.home() / ".cache" / "checkpointing-tutorial" / "data"


def synthetic_banner(dataset: str) -> str:
    """The line a notebook shows when it fell back to generated data."""
    return (
        f"SYNTHETIC {dataset} DATA: generated offline in the real file format, so memory and speed "
        f"are measured faithfully, but accuracies are not the article's. Put the real dataset under "
        f"{data_root()} to use it (see data/README.md)."
    )


def read_manifest(folder: Path) -> dict | None:
    """The manifest of a generated set in ``folder``; None for real data or nothing."""
    try:
        return json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def default_dogcat_root() -> Path:
    """Where ``download_dogcat`` puts the real images: ``<data root>/dog-cat-full-dataset/data``."""
    return data_root() / DOGCAT_DIRNAME / "data"


def has_imagefolder_splits(root: Path) -> bool:
    """``root/train`` and ``root/test`` each hold class folders, as ImageFolder reads them."""
    return all(
        (root / split).is_dir() and any(child.is_dir() for child in (root / split).iterdir())
        for split in ("train", "test")
    )


def real_dogcat_present() -> bool:
    """Whether the real images (not a generated set) are in ``default_dogcat_root()``."""
    real = default_dogcat_root()
    return has_imagefolder_splits(real) and read_manifest(real) is None


def cifar_missing(folder: Path, names: tuple[str, ...]) -> list[str]:
    """Which of the CIFAR-10 files ``names`` are not in ``folder``."""
    return [name for name in names if not (folder / name).is_file()]


def real_cifar10_present() -> bool:
    """Whether the real CIFAR-10 batches (not a generated set) are in the data folder."""
    folder = data_root() / CIFAR_DIRNAME
    return (
        not cifar_missing(folder, (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE))
        and read_manifest(folder) is None
    )
