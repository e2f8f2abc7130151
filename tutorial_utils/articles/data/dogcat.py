"""The first article's dog-cat set: its transforms, ImageFolder datasets and loaders.

Broken JPEGs (the real set has some) are left out as the datasets are built, not met in epoch 7;
``ensure_dogcat`` picks the real set where it is present and the profile uses it, else the
generated stand-in.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
from torchvision.datasets.folder import IMG_EXTENSIONS

from tutorial_utils.articles.data.folders import (
    default_dogcat_root,
    has_imagefolder_splits,
    real_dogcat_present,
)
from tutorial_utils.articles.data.generated import synthetic_dogcat
from tutorial_utils.articles.profiles import Profile, get_profile

__all__ = [
    "dogcat_datasets",
    "dogcat_loaders",
    "dogcat_missing_message",
    "dogcat_train_transform",
    "dogcat_val_transform",
    "ensure_dogcat",
    "image_is_readable",
    "image_subset",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


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
    if not has_imagefolder_splits(root):
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
