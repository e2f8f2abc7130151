"""Where the tutorial's data lives, how the articles load it, and how to make it offline.

The real datasets are used when present. Offline (CI, an air-gapped lab) the generators write the
SAME file formats -- JPEG files in the ImageFolder layout, CIFAR-10 pickle batches -- so the loading
code that runs on generated data is the code that runs on the real data.
"""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader, TensorDataset
from torchvision import datasets, transforms
from torchvision.datasets.folder import IMG_EXTENSIONS

from tutorial_utils.articles.profiles import Profile, get_profile

DATA_DIR_ENV = "TUTORIAL_DATA_DIR"
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

DOGCAT_REPO_URL = "https://github.com/laxmimerit/dog-cat-full-dataset.git"
DOGCAT_DIRNAME = "dog-cat-full-dataset"
DOGCAT_CLASSES = ("cats", "dogs")
GIT_CLONE_TIMEOUT_S = 1800

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
CIFAR_HOST = "www.cs.toronto.edu"

MANIFEST_NAME = "synthetic-manifest.json"
OFFLINE_CHECK_TIMEOUT_S = 3.0


# --------------------------------------------------------------------------- where data lives


def data_root() -> Path:
    """The one folder all data goes to: ``$TUTORIAL_DATA_DIR``, else ``data/`` of the project.

    Resolved from the package's location, never from the working directory, so a notebook in
    ``notebooks/`` and a test run from the root find the same files. A copy installed outside a
    checkout (``pip install git+...`` on Colab) has no project folder and uses a user cache instead.
    """
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    project = Path(__file__).resolve().parents[2]  # tutorial_utils/articles/data.py
    if (project / "pyproject.toml").is_file():
        return project / "data"
    return Path.home() / ".cache" / "checkpointing-tutorial" / "data"


def internet_reachable(
    host: str, port: int = 443, timeout: float = OFFLINE_CHECK_TIMEOUT_S
) -> bool:
    """Whether a TCP connection to ``host`` opens within ``timeout`` seconds, DNS included.

    Why a thread: name resolution has no timeout of its own and can hang for minutes on an
    air-gapped machine; downloads must fail in seconds instead.
    """
    outcome: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(True)
        except OSError:
            outcome.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(outcome) and outcome[0]


def _require_online(host: str, what_to_do: str) -> None:
    if not internet_reachable(host):
        raise ConnectionError(f"cannot reach {host} (offline?): {what_to_do}")


def synthetic_banner(dataset: str) -> str:
    """The line a notebook shows when it fell back to generated data."""
    return (
        f"SYNTHETIC {dataset} DATA: generated offline in the real file format, so memory and speed "
        f"are measured faithfully, but accuracies are not the article's. Put the real dataset under "
        f"{data_root()} to use it (see data/README.md)."
    )


# --------------------------------------------------------------------------- generated sets


def _read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def _build_once(target: Path, manifest: dict, write: Callable[[Path], None]) -> Path:
    """Reuse ``target`` if it holds exactly this generated set, else build it aside and move it in.

    Why aside: an interrupted run never leaves a half-written set that looks complete, and two
    processes generating the same set at once end up sharing one complete copy.
    """
    found = _read_manifest(target)
    if found == manifest:
        return target
    if found is None and target.is_dir() and any(target.iterdir()):
        raise FileExistsError(
            f"{target} holds files that were not generated here: choose an empty or new folder"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        staging.chmod(0o755)
        write(staging)
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        current = _read_manifest(target)
        if current == manifest:  # another process finished the same set meanwhile: share it
            return target
        if current is not None:  # a stale set of other sizes
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:
            if _read_manifest(target) != manifest:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- dog-cat (article 1)


def default_dogcat_root() -> Path:
    """Where ``download_dogcat`` puts the real images: ``<data root>/dog-cat-full-dataset/data``."""
    return data_root() / DOGCAT_DIRNAME / "data"


def _has_imagefolder_splits(root: Path) -> bool:
    return all(
        (root / split).is_dir() and any(child.is_dir() for child in (root / split).iterdir())
        for split in ("train", "test")
    )


def dogcat_missing_message(root: Path) -> str:
    """What to do when the dog-cat images are not where they should be."""
    return (
        f"dog-cat images not found in {root} (need train/<class>/ and test/<class>/): online, run "
        f"tutorial_utils.articles.data.download_dogcat(); offline, use `python -m tutorial_utils train "
        f"--data synthetic` or tutorial_utils.articles.data.make_synthetic_dogcat(root, n_train, n_test, "
        f"image_size)"
    )


def dogcat_train_transform(image_size: int = 224) -> transforms.Compose:
    """The first article's training augmentation, at ``image_size`` instead of 224."""
    return transforms.Compose(
        [
            transforms.RandomRotation(30),
            transforms.RandomHorizontalFlip(),
            transforms.RandomResizedCrop(image_size, scale=(0.96, 1.0), ratio=(0.95, 1.05)),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def dogcat_val_transform(image_size: int = 224) -> transforms.Compose:
    """The first article's validation preprocessing, at ``image_size`` instead of 224."""
    return transforms.Compose(
        [
            transforms.Resize([image_size, image_size]),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def image_is_readable(path: str | Path) -> bool:
    """Whether PIL can decode the image; cheap for intact JPEGs.

    An intact JPEG ends with the EOI marker, so only files without it (truncated, odd) and
    non-JPEGs pay for a full decode. Why at all: the Kaggle dog/cat images include broken files,
    and a crash in epoch 7 of 10 wastes the whole run.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. corrupt EXIF: harmless for training
            with Image.open(path) as image:
                if image.format == "JPEG" and _ends_with_jpeg_eoi(Path(path)):
                    return True
                image.load()
        return True
    except Exception:  # any decoder error means "unreadable", whatever the plugin raises
        return False


def _ends_with_jpeg_eoi(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() < 4:
            return False
        handle.seek(-2, os.SEEK_END)
        return handle.read(2) == b"\xff\xd9"


class _ReadableImageFilter:
    """``is_valid_file`` for ImageFolder: image files PIL can read; remembers the broken ones."""

    def __init__(self) -> None:
        self.rejected: list[str] = []

    def __call__(self, path: str) -> bool:
        if not path.lower().endswith(IMG_EXTENSIONS):
            return False
        if image_is_readable(path):
            return True
        self.rejected.append(path)
        return False


def dogcat_datasets(
    root: str | Path | None = None, image_size: int = 224
) -> tuple[datasets.ImageFolder, datasets.ImageFolder]:
    """The first article's train/val ``ImageFolder`` datasets over ``root/train`` and ``root/test``.

    Broken images are left out when the datasets are built, with one warning that counts them.
    """
    root = Path(root) if root is not None else default_dogcat_root()
    if not _has_imagefolder_splits(root):
        raise FileNotFoundError(dogcat_missing_message(root))
    train_filter, val_filter = _ReadableImageFilter(), _ReadableImageFilter()
    train = datasets.ImageFolder(
        str(root / "train"),
        transform=dogcat_train_transform(image_size),
        is_valid_file=train_filter,
    )
    val = datasets.ImageFolder(
        str(root / "test"), transform=dogcat_val_transform(image_size), is_valid_file=val_filter
    )
    if train.class_to_idx != val.class_to_idx:
        raise ValueError(
            f"train classes {sorted(train.class_to_idx)} differ from test classes "
            f"{sorted(val.class_to_idx)} in {root}: give both splits the same class folders"
        )
    rejected = train_filter.rejected + val_filter.rejected
    if rejected:
        warnings.warn(
            f"skipped {len(rejected)} unreadable image(s) under {root} "
            f"({len(train_filter.rejected)} train, {len(val_filter.rejected)} test), "
            f"e.g. {rejected[0]}",
            stacklevel=2,
        )
    return train, val


def image_subset(dataset: datasets.ImageFolder, count: int, seed: int = 0) -> datasets.ImageFolder:
    """``count`` of the dataset's images drawn by a seeded permutation, still an ``ImageFolder``.

    Why: the real set's 20 000 JPEGs are sorted by class, so the first ``count`` would be cats
    only; a profile's short run needs a small sample of both classes, the same on every run.
    """
    if count < 1:
        raise ValueError(f"an image subset needs at least 1 image, got {count}")
    if count >= len(dataset.samples):
        return dataset
    order = torch.randperm(len(dataset.samples), generator=torch.Generator().manual_seed(seed))
    subset = copy.copy(dataset)
    subset.samples = [dataset.samples[i] for i in sorted(order[:count].tolist())]
    subset.imgs = subset.samples
    subset.targets = [target for _, target in subset.samples]
    return subset


def dogcat_loaders(
    root: str | Path | None = None,
    image_size: int = 224,
    batch_size: int = 64,
    num_workers: int = 2,
    shuffle: bool = True,
    train_images: int | None = None,
    test_images: int | None = None,
) -> tuple[DataLoader, DataLoader]:
    """The article's DataLoaders: batch 64, 2 workers, and (as written there) both shuffled.

    ``train_images`` / ``test_images`` keep a seeded sample of each split (``image_subset``), as
    the ``cpu`` and ``gpu`` profiles do on the real set; None keeps every image.
    """
    train, val = dogcat_datasets(root, image_size)
    if train_images is not None:
        train = image_subset(train, train_images)
    if test_images is not None:
        val = image_subset(val, test_images)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers),
        DataLoader(val, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers),
    )


def download_dogcat(dest: str | Path | None = None) -> Path:
    """Clone the article's dog/cat repository (``git clone --depth 1``); return its image root.

    ``dest`` is the clone folder (default ``<data root>/dog-cat-full-dataset``); the returned
    path is ``dest/data``, what ``dogcat_datasets`` takes. Nothing is fetched if it is there.
    """
    clone_dir = Path(dest) if dest is not None else data_root() / DOGCAT_DIRNAME
    images_root = clone_dir / "data"
    if _has_imagefolder_splits(images_root):
        return images_root
    if clone_dir.is_dir() and any(clone_dir.iterdir()):
        raise FileExistsError(
            f"{clone_dir} exists but has no data/train and data/test: remove it or pass another dest"
        )
    _require_online(
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


def _synthetic_pet_image(label: int, size: int, rng: np.random.Generator) -> Image.Image:
    """A "cat" (warm colours, round spots) or "dog" (cool colours, straight stripes).

    Colour and shape kind survive the article's rotation, flip and crop, so a small CNN separates
    the classes in an epoch or two; per-image jitter and noise keep it from being a constant.
    """
    base = np.array([200, 120, 60] if label == 0 else [70, 110, 190], dtype=np.float32)
    base += rng.uniform(-40, 40, size=3)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (
        np.cos(angle) * np.linspace(-1, 1, size)[None, :]
        + np.sin(angle) * np.linspace(-1, 1, size)[:, None]
    )
    pixels = base[None, None, :] + 30 * ramp[:, :, None]
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 7))):
        shade = tuple(int(v) for v in rng.integers(0, 90, size=3) + (0 if label == 0 else 150))
        x, y = rng.uniform(0, size, size=2)
        if label == 0:
            radius = rng.uniform(0.06, 0.16) * size
            draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=shade)
        else:
            length = rng.uniform(0.3, 0.7) * size
            direction = rng.uniform(0, np.pi)
            end = (x + length * np.cos(direction), y + length * np.sin(direction))
            draw.line([(x, y), end], fill=shade, width=max(1, round(0.06 * size)))
    noisy = np.asarray(image, dtype=np.float32) + 12 * rng.standard_normal(
        (size, size, 3), dtype=np.float32
    )
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def make_synthetic_dogcat(
    root: str | Path, n_train: int, n_test: int, image_size: int, seed: int = 0
) -> Path:
    """Write JPEGs in the dataset's layout (``root/{train,test}/{cats,dogs}/``); return ``root``.

    Deterministic per seed (same bytes), classes alternate so both splits are balanced, and a
    folder that already holds this exact set is reused.
    """
    if n_train < 2 or n_test < 2:
        raise ValueError(
            f"n_train and n_test must be >= 2 (one image per class), got {n_train}, {n_test}"
        )
    if image_size < 8:
        raise ValueError(f"image_size must be >= 8 pixels, got {image_size}")
    manifest = {
        "kind": "synthetic-dogcat",
        "format": 1,
        "n_train": n_train,
        "n_test": n_test,
        "image_size": image_size,
        "seed": seed,
    }

    def write(folder: Path) -> None:
        for split_index, (split, count) in enumerate((("train", n_train), ("test", n_test))):
            for class_name in DOGCAT_CLASSES:
                (folder / split / class_name).mkdir(parents=True)
            for index in range(count):
                label = index % 2
                rng = np.random.default_rng([seed, split_index, index])
                image = _synthetic_pet_image(label, image_size, rng)
                stem = DOGCAT_CLASSES[label][:-1]
                image.save(
                    folder / split / DOGCAT_CLASSES[label] / f"{stem}.{index}.jpg", quality=90
                )

    return _build_once(Path(root), manifest, write)


def synthetic_dogcat(profile: Profile | None = None, image_size: int | None = None) -> Path:
    """The generated dog-cat set sized by the profile (one folder per profile and image size)."""
    profile = profile or get_profile()
    image_size = image_size or profile.image_size
    return make_synthetic_dogcat(
        data_root() / f"synthetic-dogcat-{profile.name}-{image_size}px",
        profile.dogcat_train_images,
        profile.dogcat_test_images,
        image_size,
    )


def real_dogcat_present() -> bool:
    """Whether the real images (not a generated set) are in ``default_dogcat_root()``."""
    real = default_dogcat_root()
    return _has_imagefolder_splits(real) and _read_manifest(real) is None


def ensure_dogcat(profile: Profile | None = None) -> tuple[Path, bool]:
    """The real dog-cat images if present (and the profile uses real data; ``ci`` never does),
    else a generated set sized by the profile.

    Never downloads on its own (run ``download_dogcat()`` for that). Returns ``(root, synthetic)``
    so a notebook can show ``synthetic_banner`` when it fell back.
    """
    profile = profile or get_profile()
    if profile.use_real_data and real_dogcat_present():
        return default_dogcat_root(), False
    return synthetic_dogcat(profile), True


# --------------------------------------------------------------------------- CIFAR-10 (article 2)


def _cifar_missing(folder: Path, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if not (folder / name).is_file()]


def load_cifar10(
    root: str | Path | None = None, train: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(N, 32, 32, 3)`` uint8 and labels int64 from ``root/cifar-10-batches-py/``.

    Reads the official pickle batches (so only point it at files you trust, as with any pickle);
    the same arrays as torchvision's ``CIFAR10(...).data`` / ``.targets`` that the article uses.
    """
    root = Path(root) if root is not None else data_root()
    folder = root / CIFAR_DIRNAME
    names = CIFAR_TRAIN_FILES if train else (CIFAR_TEST_FILE,)
    missing = _cifar_missing(folder, names)
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 not found in {folder} (missing {', '.join(missing)}): online, run "
            f"tutorial_utils.articles.data.download_cifar10(); offline, use "
            f"tutorial_utils.articles.data.make_synthetic_cifar10(root, n_train, n_test) or ensure_cifar10()"
        )
    images, labels = [], []
    for name in names:
        with open(folder / name, "rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        rows = np.asarray(batch[b"data"], dtype=np.uint8)
        if rows.ndim != 2 or rows.shape[1] != 3 * 32 * 32 or len(batch[b"labels"]) != len(rows):
            raise ValueError(f"{folder / name} is not a CIFAR-10 batch (data shape {rows.shape})")
        images.append(rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.extend(batch[b"labels"])
    return np.ascontiguousarray(np.concatenate(images)), np.asarray(labels, dtype=np.int64)


def cifar10_label_names(root: str | Path | None = None) -> list[str]:
    """Class names from ``batches.meta``, index = label."""
    root = Path(root) if root is not None else data_root()
    with open(root / CIFAR_DIRNAME / CIFAR_META_FILE, "rb") as handle:
        meta = pickle.load(handle, encoding="bytes")
    return [name.decode() for name in meta[b"label_names"]]


def download_cifar10(root: str | Path | None = None) -> Path:
    """Fetch CIFAR-10 with torchvision (as the article does) into ``root``; return ``root``."""
    root = Path(root) if root is not None else data_root()
    if not _cifar_missing(root / CIFAR_DIRNAME, (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE)):
        return root
    _require_online(
        CIFAR_HOST,
        f"copy cifar-10-batches-py/ into {root} or use the generated set "
        f"(tutorial_utils.articles.data.make_synthetic_cifar10 / ensure_cifar10)",
    )
    datasets.CIFAR10(str(root), train=True, download=True)
    return root


class _Python2StrPickler(pickle._Pickler):
    """Pickles ``bytes`` the way Python 2 pickled ``str``, as the official CIFAR-10 files were.

    So the generated files load like the real ones: bytes keys with ``encoding="bytes"`` (the
    CIFAR page's recipe) and str keys with ``encoding="latin1"`` (torchvision's reader).
    """

    dispatch = pickle._Pickler.dispatch.copy()

    # self is Any: the pure-Python pickler's write/memoize are not in its type stubs
    def save_python2_str(self: Any, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_python2_str


def _write_cifar_pickle(path: Path, content: dict) -> None:
    with open(path, "wb") as handle:
        _Python2StrPickler(handle, protocol=2).dump(content)


def _synthetic_cifar_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """32x32 images whose class sets both the colour and the stripe orientation, plus noise."""
    palette = np.array(
        [
            [230, 60, 60],
            [60, 200, 60],
            [60, 80, 230],
            [230, 210, 60],
            [200, 60, 210],
            [60, 210, 210],
            [240, 140, 40],
            [140, 80, 40],
            [150, 150, 150],
            [40, 40, 90],
        ],
        dtype=np.float32,
    )
    count = len(labels)
    grid = np.arange(32, dtype=np.float32)
    angle = labels * (np.pi / 10) + rng.normal(0, 0.08, count)
    phase = rng.uniform(0, 2 * np.pi, count)
    along = (
        np.cos(angle)[:, None, None] * grid[None, None, :]
        + np.sin(angle)[:, None, None] * grid[None, :, None]
    )
    stripes = np.sin(2 * np.pi * along / 8 + phase[:, None, None]).astype(np.float32)
    colour = palette[labels] + rng.uniform(-30, 30, (count, 3)).astype(np.float32)
    pixels = colour[:, None, None, :] * (0.7 + 0.3 * stripes[..., None])
    pixels += rng.normal(0, 15, pixels.shape).astype(np.float32)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _cifar_batch(labels: np.ndarray, rng: np.random.Generator, batch_label: str) -> dict:
    images = _synthetic_cifar_images(labels, rng)
    return {
        b"batch_label": batch_label.encode(),
        b"labels": [int(label) for label in labels],
        b"data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),  # channel-major rows
        b"filenames": [
            f"synthetic_{batch_label.split()[0]}_{i:05d}.png".encode() for i in range(len(labels))
        ],
    }


def make_synthetic_cifar10(root: str | Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """Write ``root/cifar-10-batches-py/`` in the official format and naming; return ``root``.

    ``data_batch_1..5`` split ``n_train`` samples, ``test_batch`` holds ``n_test``,
    ``batches.meta`` names the 10 classes; deterministic per seed, reused when already there.
    """
    if n_train < 5 or n_test < 1:
        raise ValueError(
            f"need n_train >= 5 (five batches) and n_test >= 1, got {n_train}, {n_test}"
        )
    root = Path(root)
    manifest = {
        "kind": "synthetic-cifar10",
        "format": 1,
        "n_train": n_train,
        "n_test": n_test,
        "seed": seed,
    }

    def write(folder: Path) -> None:
        rng = np.random.default_rng(seed)
        train_labels = rng.permutation(np.arange(n_train) % 10)
        for number, labels in enumerate(np.array_split(train_labels, 5), start=1):
            content = _cifar_batch(labels, rng, f"training batch {number} of 5")
            _write_cifar_pickle(folder / f"data_batch_{number}", content)
        test_labels = rng.permutation(np.arange(n_test) % 10)
        _write_cifar_pickle(
            folder / CIFAR_TEST_FILE, _cifar_batch(test_labels, rng, "testing batch 1 of 1")
        )
        meta = {
            b"label_names": [name.encode() for name in CIFAR_LABEL_NAMES],
            b"num_cases_per_batch": math.ceil(n_train / 5),
            b"num_vis": 3 * 32 * 32,
        }
        _write_cifar_pickle(folder / CIFAR_META_FILE, meta)

    _build_once(root / CIFAR_DIRNAME, manifest, write)
    return root


def synthetic_cifar10(profile: Profile | None = None) -> Path:
    """The generated CIFAR-10 set sized by the profile (article profile: the full 50000/10000)."""
    profile = profile or get_profile()
    n_train = profile.cifar_train_samples or CIFAR_FULL_SIZES[0]
    n_test = profile.cifar_test_samples or CIFAR_FULL_SIZES[1]
    return make_synthetic_cifar10(
        data_root() / f"synthetic-cifar10-{profile.name}", n_train, n_test
    )


def real_cifar10_present() -> bool:
    """Whether the real CIFAR-10 batches (not a generated set) are in the data folder."""
    folder = data_root() / CIFAR_DIRNAME
    return (
        not _cifar_missing(folder, (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE))
        and _read_manifest(folder) is None
    )


def ensure_cifar10(profile: Profile | None = None) -> tuple[Path, bool]:
    """The real CIFAR-10 if present (and the profile uses real data; ``ci`` never does), else a
    generated set sized by the profile.

    Never downloads on its own.
    """
    profile = profile or get_profile()
    if profile.use_real_data and real_cifar10_present():
        return data_root(), False
    return synthetic_cifar10(profile), True


# --------------------------------------------------------------------------- the fetch cell

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
    if not internet_reachable(host):
        return f"offline ({host} unreachable): going on with the generated {dataset} stand-in"
    try:
        download_dogcat() if dataset == "dog-cat" else download_cifar10()
    except (OSError, RuntimeError) as error:  # ConnectionError is an OSError
        return f"fetching the real {dataset} failed ({error}); going on with the generated stand-in"
    return f"fetched the real {dataset} into {where}"


class CifarBatches:
    """The second article's batching, usable by a training loop like a DataLoader.

    Slices of the uint8 arrays become float tensors in [0, 1], moved to ``device`` and upsampled
    bilinearly to ``image_size`` there (as in the article). The article shuffles its arrays at
    the end of each epoch; here each pass draws a fresh permutation from a seeded numpy
    Generator, so runs repeat exactly.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        batch_size: int,
        image_size: int = 224,
        shuffle: bool = False,
        generator: np.random.Generator | int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        images = np.asarray(images)
        labels = np.asarray(labels, dtype=np.int64)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(
                f"images must be uint8 (N, H, W, 3) as load_cifar10 returns, got {images.dtype} "
                f"{images.shape}"
            )
        if len(labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        if batch_size < 1 or image_size < 1:
            raise ValueError(
                f"batch_size and image_size must be >= 1, got {batch_size}, {image_size}"
            )
        self.images, self.labels = images, labels
        self.batch_size, self.image_size, self.shuffle = batch_size, image_size, shuffle
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.rng = (
            generator
            if isinstance(generator, np.random.Generator)
            else np.random.default_rng(generator or 0)
        )
        self.num_samples = len(images)
        self.dataset = TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self.rng.permutation(self.num_samples) if self.shuffle else None
        for start in range(0, self.num_samples, self.batch_size):
            chosen = (
                slice(start, start + self.batch_size)
                if order is None
                else order[start : start + self.batch_size]
            )
            yield self._to_tensors(self.images[chosen], self.labels[chosen])

    def _to_tensors(
        self, images: np.ndarray, labels: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch_x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
        batch_y = torch.from_numpy(np.ascontiguousarray(labels)).long()
        batch_x, batch_y = batch_x.to(self.device), batch_y.to(self.device)
        if batch_x.shape[-2:] != (self.image_size, self.image_size):
            batch_x = F.interpolate(
                batch_x, (self.image_size, self.image_size), mode="bilinear", align_corners=False
            )
        return batch_x, batch_y


def cifar_batches(
    images: np.ndarray,
    labels: np.ndarray,
    batch_size: int,
    image_size: int = 224,
    shuffle: bool = False,
    generator: np.random.Generator | int | None = None,
    device: torch.device | str | None = None,
) -> CifarBatches:
    """Batches of ``(images float [0,1] upsampled to image_size, labels long)``; see CifarBatches."""
    return CifarBatches(images, labels, batch_size, image_size, shuffle, generator, device)
