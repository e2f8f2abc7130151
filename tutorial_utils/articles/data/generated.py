"""Generated stand-ins in the real sets' formats: JPEGs in the ImageFolder layout, CIFAR-10
pickle batches, so the loading code that runs offline is the code that runs on the real data.

Each set is built once per size and seed (``build_once``) and carries a manifest, by which it is
told apart from a real set in the same place.
"""

from __future__ import annotations

import json
import math
import pickle
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from tutorial_utils.articles.data.folders import (
    CIFAR_DIRNAME,
    CIFAR_FULL_SIZES,
    CIFAR_LABEL_NAMES,
    CIFAR_META_FILE,
    CIFAR_TEST_FILE,
    DOGCAT_CLASSES,
    MANIFEST_NAME,
    data_root,
    read_manifest,
)
from tutorial_utils.articles.profiles import Profile, get_profile

__all__ = [
    "make_synthetic_cifar10",
    "make_synthetic_dogcat",
    "synthetic_cifar10",
    "synthetic_dogcat",
]


def build_once(target: Path, manifest: dict, write: Callable[[Path], None]) -> Path:
    """Reuse ``target`` if it holds exactly this generated set, else build it aside and move it in.

    Why aside: an interrupted run never leaves a half-written set that looks complete, and two
    processes generating the same set at once end up sharing one complete copy.
    """
    found = read_manifest(target)
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
        current = read_manifest(target)
        if current == manifest:  # another process finished the same set meanwhile: share it
            return target
        if current is not None:  # a stale set of other sizes
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:
            if read_manifest(target) != manifest:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- dog-cat (article 1)


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

    return build_once(Path(root), manifest, write)


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


# --------------------------------------------------------------------------- CIFAR-10 (article 2)


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


def _cifar_batch(
    labels: np.ndarray, rng: np.random.Generator, batch_label: str
) -> dict[bytes, Any]:
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

    build_once(root / CIFAR_DIRNAME, manifest, write)
    return root


def synthetic_cifar10(profile: Profile | None = None) -> Path:
    """The generated CIFAR-10 set sized by the profile (article profile: the full 50000/10000)."""
    profile = profile or get_profile()
    n_train = profile.cifar_train_samples or CIFAR_FULL_SIZES[0]
    n_test = profile.cifar_test_samples or CIFAR_FULL_SIZES[1]
    return make_synthetic_cifar10(
        data_root() / f"synthetic-cifar10-{profile.name}", n_train, n_test
    )
