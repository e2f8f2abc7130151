"""Notebook 05's model: residual MLP blocks, the same on every rank, and the batch each rank takes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tutorial_utils.articles.profiles import Profile
from tutorial_utils.measurement.gradients import named_gradients
from tutorial_utils.training.distributed import DeviceType

NUM_CLASSES = 10
HIDDEN_FACTOR = 4
REENTRANT_DDP_ERROR = "Expected to mark a variable ready only once"


@dataclass(frozen=True)
class BlockNetConfig:
    """Size of the deep block model and of the global batch all ranks share."""

    width: int = 128
    depth: int = 8
    global_batch: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("width", "depth", "global_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def check_splits(self, world_size: int) -> None:
        """Every rank must get an equal share, or DDP's average is not the global mean."""
        if self.global_batch % world_size:
            raise ValueError(
                f"global batch {self.global_batch} does not split evenly over {world_size} ranks: "
                f"use a multiple of {world_size}"
            )


# Activations per rank ~ the parameter state (weights, gradients, two Adam moments), so both
# what sharding saves and what checkpointing saves are visible side by side.
DISTRIBUTED_SIZES = {
    "ci": BlockNetConfig(width=128, depth=8, global_batch=1024),
    "cpu": BlockNetConfig(width=256, depth=16, global_batch=2048),
    "gpu": BlockNetConfig(width=512, depth=16, global_batch=4096),
    "article": BlockNetConfig(width=1024, depth=24, global_batch=8192),
}


def sizes_for(profile: Profile, **overrides: int) -> BlockNetConfig:
    """The block model of a profile, with e.g. ``depth=`` or ``global_batch=`` changed."""
    try:
        base = DISTRIBUTED_SIZES[profile.name]
    except KeyError:
        known = ", ".join(DISTRIBUTED_SIZES)
        raise ValueError(
            f"no notebook-05 sizes for profile {profile.name!r}: add it to DISTRIBUTED_SIZES "
            f"(known: {known})"
        ) from None
    return replace(base, **overrides)


def distributed_device_type(profile: Profile) -> DeviceType:
    """``cuda`` (NCCL, every visible GPU) in the GPU profiles where CUDA exists, else ``cpu`` (gloo)."""
    return "cuda" if profile.name in ("gpu", "article") and torch.cuda.is_available() else "cpu"


class ResidualBlock(nn.Module):
    """``x + fc2(relu(fc1(x)))``: a transformer-MLP-like block, the unit people checkpoint."""

    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, HIDDEN_FACTOR * width)
        self.fc2 = nn.Linear(HIDDEN_FACTOR * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.relu(self.fc1(x)))


class BlockNet(nn.Module):
    """Input layer, ``depth`` residual blocks, classifier head.

    ``tied_blocks=True`` applies ONE block ``depth`` times (weight sharing, as in ALBERT or a
    recurrent step), so its parameters are used several times in one forward: the case that
    breaks reentrant checkpointing under DDP. ``checkpoint_blocks`` checkpoints every block
    application with ``torch.utils.checkpoint`` and the given ``use_reentrant``.
    """

    def __init__(
        self,
        config: BlockNetConfig,
        tied_blocks: bool = False,
        checkpoint_blocks: bool = False,
        use_reentrant: bool = False,
    ):
        super().__init__()
        self.depth = config.depth
        self.tied_blocks = tied_blocks
        self.checkpoint_blocks = checkpoint_blocks
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(config.width, config.width)
        n_blocks = 1 if tied_blocks else config.depth
        self.blocks = nn.ModuleList(ResidualBlock(config.width) for _ in range(n_blocks))
        self.head = nn.Linear(config.width, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for step in range(self.depth):
            block = self.blocks[0 if self.tied_blocks else step]
            if self.checkpoint_blocks:
                h = checkpoint(block, h, use_reentrant=self.use_reentrant)
            else:
                h = block(h)
        return self.head(h)


def build_model(config: BlockNetConfig, **options: bool) -> BlockNet:
    """The same initial weights on every rank and in the caller: seeded construction."""
    torch.manual_seed(config.seed)
    return BlockNet(config, **options)


def global_batch(config: BlockNetConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """One seeded batch of inputs and labels; every rank builds the same one."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    inputs = torch.randn(config.global_batch, config.width, generator=generator)
    labels = torch.randint(0, NUM_CLASSES, (config.global_batch,), generator=generator)
    return inputs, labels


def rank_slice(
    batch: tuple[torch.Tensor, torch.Tensor], rank: int, world_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous, equal share of the global batch (what a DistributedSampler gives)."""
    size = batch[0].shape[0]
    if size % world_size:
        raise ValueError(f"a batch of {size} does not split evenly over {world_size} ranks")
    share = size // world_size
    inputs, labels = batch
    rows = slice(rank * share, (rank + 1) * share)
    return inputs[rows], labels[rows]


def single_process_gradients(
    config: BlockNetConfig, tied_blocks: bool = False
) -> dict[str, torch.Tensor]:
    """The reference: gradients of one un-checkpointed model on the whole global batch."""
    model = build_model(config, tied_blocks=tied_blocks)
    inputs, labels = global_batch(config)
    F.cross_entropy(model(inputs), labels).backward()
    gradients: dict[str, torch.Tensor] = {}
    for name, grad in named_gradients(model).items():
        assert grad is not None  # every BlockNet parameter feeds the loss, so backward set it
        gradients[name] = grad
    return gradients
