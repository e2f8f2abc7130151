"""The second article's CIFAR-10: the official pickle batches read, and batched as it batches them.

``ensure_cifar10`` picks the real batches where present and the profile uses them, else the
generated stand-in; ``cifar_batches`` upsamples on the device, as the article does.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from tutorial_utils.articles.data.folders import (
    CIFAR_DIRNAME,
    CIFAR_META_FILE,
    CIFAR_TEST_FILE,
    CIFAR_TRAIN_FILES,
    cifar_missing,
    data_root,
    real_cifar10_present,
)
from tutorial_utils.articles.data.generated import synthetic_cifar10
from tutorial_utils.articles.profiles import Profile, get_profile

__all__ = [
    "cifar10_label_names",
    "cifar_batches",
    "CifarBatches",
    "ensure_cifar10",
    "load_cifar10",
]


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
    missing = cifar_missing(folder, names)
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


def ensure_cifar10(profile: Profile | None = None) -> tuple[Path, bool]:
    """The real CIFAR-10 if present (and the profile uses real data; ``ci`` never does), else a
    generated set sized by the profile.

    Never downloads on its own.
    """
    profile = profile or get_profile()
    if profile.use_real_data and real_cifar10_present():
        return data_root(), False
    return synthetic_cifar10(profile), True


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
