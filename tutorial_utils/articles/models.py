"""The articles' two networks, built the way the articles build them.

Seed faithfulness matters: with ``torch.manual_seed(0)`` first, ``vgg16_classifier()`` draws its
random weights in the same order as the first article's code, and ``NetA`` keeps the second
article's module names, so state_dicts move between our code and theirs.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torchvision import models

__all__ = [
    "conv_bn_relu",
    "count_parameters",
    "deep_tanh_chain",
    "flatten_vgg16",
    "Layout",
    "NetA",
    "neta_as_sequential",
    "NETA_SEGMENTS",
    "vgg16_classifier",
]

Layout = Literal["article", "flat"]  # the article's 10 top-level modules, or 40 of them
VGG_LAYOUTS: tuple[Layout, ...] = get_args(Layout)


def vgg16_classifier(num_classes: int = 2, layout: Layout = "article") -> nn.Sequential:
    """VGG16 as the first article's ``nn.Sequential``.

    ``layout="article"``: ``list(vgg16().children())[:-1]`` + Flatten + a new classifier,
    10 top-level modules, so ``checkpoint_sequential(segments=2)`` puts all 13 convolutions in
    one segment. ``layout="flat"``: the same weights, with the 31 feature layers as top-level
    modules (40 in all) and out-of-place ReLUs, so every segment count means something and no
    in-place op can modify a segment's saved input.
    """
    if layout not in VGG_LAYOUTS:
        raise ValueError(f"layout must be one of {VGG_LAYOUTS}, got {layout!r}")
    vgg16 = models.vgg16(weights=None)  # random init: nothing is downloaded
    layers = list(vgg16.children())[:-1]
    layers.append(nn.Flatten())
    layers.append(nn.Linear(25088, 4096))
    layers.append(nn.ReLU())
    layers.append(nn.Dropout(0.5, inplace=False))
    layers.append(nn.Linear(4096, 4096))
    layers.append(nn.ReLU())
    layers.append(nn.Dropout(0.5, inplace=False))
    layers.append(nn.Linear(4096, num_classes))
    model = nn.Sequential(*layers)
    return model if layout == "article" else flatten_vgg16(model)


def flatten_vgg16(article_model: nn.Sequential) -> nn.Sequential:
    """The article model's modules, its ``features`` block unrolled, ReLUs made out-of-place."""
    features, *rest = list(article_model.children())
    unrolled = [nn.ReLU() if isinstance(m, nn.ReLU) else m for m in features.children()]
    return nn.Sequential(*unrolled, *rest)


def conv_bn_relu(in_ch: int, out_ch: int, ker_sz: int, stride: int, pad: int) -> nn.Sequential:
    """The second article's building block."""
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, ker_sz, stride, pad, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU(),
    )


NETA_SEGMENTS = 5


class NetA(nn.Module):
    """The second article's CIFAR-10 network, names and forward unchanged.

    ``use_checkpoint=True`` checkpoints all five segments as the article does; a set of segment
    indices checkpoints only those. ``use_reentrant`` is passed explicitly (the article relied on
    the old default, reentrant). ``input_requires_grad_trick`` keeps the article's
    ``y + torch.zeros(1, requires_grad=True)`` line, which reentrant checkpointing needs so that
    the first segment's output requires grad; it changes no value.
    """

    def __init__(
        self,
        use_checkpoint: bool | set[int] | frozenset[int] = False,
        use_reentrant: bool = False,
        input_requires_grad_trick: bool = True,
    ):
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.use_reentrant = use_reentrant
        self.input_requires_grad_trick = input_requires_grad_trick
        k = 2
        self.layer1 = conv_bn_relu(3, 32 * k, 3, 1, 1)
        self.layer2 = conv_bn_relu(32 * k, 32 * k, 3, 2, 1)
        self.layer3 = conv_bn_relu(32 * k, 64 * k, 3, 1, 1)
        self.layer4 = conv_bn_relu(64 * k, 64 * k, 3, 2, 1)
        self.layer5 = conv_bn_relu(64 * k, 128 * k, 3, 1, 1)
        self.layer6 = conv_bn_relu(128 * k, 128 * k, 3, 2, 1)
        self.layer7 = conv_bn_relu(128 * k, 256 * k, 3, 1, 1)
        self.layer8 = conv_bn_relu(256 * k, 256 * k, 3, 2, 1)
        self.layer9 = nn.Linear(256 * k, 10)

    @property
    def checkpointed_segments(self) -> frozenset[int]:
        """Indices (0..4) of the segments run under ``checkpoint``."""
        if self.use_checkpoint is True:
            return frozenset(range(NETA_SEGMENTS))
        if not self.use_checkpoint:
            return frozenset()
        chosen = frozenset(self.use_checkpoint)
        if not chosen <= set(range(NETA_SEGMENTS)):
            raise ValueError(f"NetA segments are 0..{NETA_SEGMENTS - 1}, got {sorted(chosen)}")
        return chosen

    def seg0(self, y):
        y = self.layer1(y)
        return y

    def seg1(self, y):
        y = self.layer2(y)
        y = self.layer3(y)
        return y

    def seg2(self, y):
        y = self.layer4(y)
        y = self.layer5(y)
        return y

    def seg3(self, y):
        y = self.layer6(y)
        y = self.layer7(y)
        return y

    def seg4(self, y):
        y = self.layer8(y)
        y = F.adaptive_avg_pool2d(y, 1)
        y = torch.flatten(y, 1)
        y = self.layer9(y)
        return y

    def forward(self, x):
        y = x
        if self.input_requires_grad_trick:
            y = y + torch.zeros(1, dtype=y.dtype, device=y.device, requires_grad=True)
        checkpointed = self.checkpointed_segments
        for index, segment in enumerate((self.seg0, self.seg1, self.seg2, self.seg3, self.seg4)):
            if index in checkpointed:
                y = checkpoint(segment, y, use_reentrant=self.use_reentrant)
            else:
                y = segment(y)
        return y


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def deep_tanh_chain(pairs: int, width: int = 256, classes: int = 10) -> nn.Sequential:
    """``pairs`` x (Linear, Tanh) and a Linear head: a deep chain of equal layers."""
    layers: list[nn.Module] = []
    for _ in range(pairs):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def neta_as_sequential(net: NetA) -> nn.Sequential:
    """NetA's layers, conv/BN/ReLU each a top-level module, so the planner can cut anywhere.

    The modules are shared (same parameters) and the forward computes the same function as
    ``NetA.forward`` without checkpointing: the article's ``+ zeros(1, requires_grad=True)``
    changes no value, and adaptive pooling, flattening and the classifier follow layer 8.
    """
    blocks = [getattr(net, f"layer{k}") for k in range(1, 9)]
    convs = [module for block in blocks for module in block]
    return nn.Sequential(*convs, nn.AdaptiveAvgPool2d(1), nn.Flatten(), net.layer9)
