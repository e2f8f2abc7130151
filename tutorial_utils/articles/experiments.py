"""The two articles' experiments, set up from a profile: shared by the CLI and the notebooks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from tutorial_utils.articles import data
from tutorial_utils.articles.models import NETA_SEGMENTS, NetA, vgg16_classifier
from tutorial_utils.articles.profiles import Profile
from tutorial_utils.checkpointing.strategy import NO_CHECKPOINTING, Strategy, equal_segments

__all__ = ["adam_optimizer", "build_neta_cifar10", "build_vgg16_dogcat", "BUILDERS", "Experiment"]


def adam_optimizer(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The second article's optimizer: Adam, lr 1e-3 (pass it as ``optimizer_factory=`` to
    measure NetA as the article trains it; the measuring tools default to the first's SGD)."""
    return torch.optim.Adam(parameters, lr=1e-3)


@dataclass
class Experiment:
    """Everything ``train_model`` needs, built the way the article builds it."""

    name: str
    model: nn.Module
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    train_loader: Iterable[Any]  # batches of (images, labels)
    val_loader: Iterable[Any]
    strategy: Strategy  # the loop's: NetA checkpoints inside its own forward
    synthetic_data: bool
    data_root: Path


def build_vgg16_dogcat(
    profile: Profile,
    strategy: Strategy,
    batch_size: int | None = None,
    image_size: int | None = None,
    data_path: str | None = None,
    seed: int = 0,
) -> Experiment:
    """First article: VGG16 Sequential, SGD lr 0.001 momentum 0.9, seed 0, ImageFolder loaders."""
    image_size = image_size or profile.image_size
    if data_path == "synthetic":
        root, synthetic = data.synthetic_dogcat(profile, image_size), True
    elif data_path:
        root, synthetic = Path(data_path), False
    else:
        root, synthetic = data.ensure_dogcat(profile)
    train_loader, val_loader = data.dogcat_loaders(
        root,
        image_size=image_size,
        batch_size=batch_size or profile.batch_size,
        num_workers=profile.num_workers,
        train_images=profile.dogcat_train_images,
        test_images=profile.dogcat_test_images,
    )
    torch.manual_seed(seed)
    model = vgg16_classifier(num_classes=2, layout="article")
    strategy.check(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    return Experiment(
        "vgg16-dogcat",
        model,
        nn.CrossEntropyLoss(),
        optimizer,
        train_loader,
        val_loader,
        strategy,
        synthetic,
        root,
    )


def build_neta_cifar10(
    profile: Profile,
    strategy: Strategy,
    batch_size: int | None = None,
    image_size: int | None = None,
    data_path: str | None = None,
    seed: int = 0,
) -> Experiment:
    """Second article: NetA (checkpointing inside its forward), Adam lr 1e-3, upsampled CIFAR.
    ``strategy``: NO_CHECKPOINTING, or ``equal_segments(5)``: NetA's own five segments (the
    training loop then runs it plainly)."""
    own = equal_segments(NETA_SEGMENTS)
    if strategy.kind != "none" and strategy != own:
        raise ValueError(
            f"NetA checkpoints itself in {NETA_SEGMENTS} segments: use --strategy none (off) "
            f"or segments-{NETA_SEGMENTS} (the article's setting), got {strategy.name!r}"
        )
    if data_path == "synthetic":
        root, synthetic = data.synthetic_cifar10(profile), True
    elif data_path:
        root, synthetic = Path(data_path), False
    else:
        root, synthetic = data.ensure_cifar10(profile)
    train_x, train_y = data.load_cifar10(root, train=True)
    test_x, test_y = data.load_cifar10(root, train=False)
    train_x, train_y = (
        train_x[: profile.cifar_train_samples],
        train_y[: profile.cifar_train_samples],
    )
    test_x, test_y = test_x[: profile.cifar_test_samples], test_y[: profile.cifar_test_samples]
    batch_size = batch_size or profile.cifar_batch_size
    image_size = image_size or profile.cifar_image_size
    train_loader = data.cifar_batches(
        train_x,
        train_y,
        batch_size,
        image_size,
        shuffle=True,
        generator=np.random.default_rng(seed),
    )
    val_loader = data.cifar_batches(test_x, test_y, batch_size, image_size)
    torch.manual_seed(seed)
    model = NetA(use_checkpoint=strategy == own)
    optimizer = adam_optimizer(model.parameters())
    return Experiment(
        "neta-cifar10",
        model,
        nn.CrossEntropyLoss(),
        optimizer,
        train_loader,
        val_loader,
        NO_CHECKPOINTING,
        synthetic,
        root,
    )


BUILDERS = {"vgg16-dogcat": build_vgg16_dogcat, "neta-cifar10": build_neta_cifar10}
