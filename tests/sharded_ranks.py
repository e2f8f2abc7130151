"""Notebook 05's four setups on real gloo ranks, each rank's forward+backward peak in bytes, and
the same model in mixed precision: FSDP2 with ``MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)`` and DDP with its forward under ``torch.autocast("cpu", bfloat16)``.

    torchrun --standalone --nproc-per-node 2 tests/sharded_ranks.py --width 32 --depth 4 --batch 512

The same steps as ``examples/ddp_fsdp_checkpointing.py`` (its ``setup``, ``train_step`` and
``forward_backward``, the third step's forward and backward measured with its
``peak_with_resizes_bytes`` and with ``tools.peak_bytes``), printed by rank 0 as JSON in bytes
rather than MiB, for ``tests/test_sharded.py`` to hold the prediction to.
"""

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import ddp_fsdp_checkpointing as rank_file  # noqa: E402

from tutorial_utils.tools import peak_bytes  # noqa: E402

NAMES = ("DDP", "DDP + checkpointing", "FSDP", "FSDP + checkpointing")
MIXED = ("FSDP bf16 policy", "DDP autocast + checkpointing")  # two more setups: a few s each
POLICY = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def setup_mixed(name, args):
    """The rank file's setup of the same model, FSDP2 given ``POLICY`` (torchtitan's way)."""
    checkpointed = " + checkpointing" if name.endswith("+ checkpointing") else ""
    if name.startswith("DDP"):
        return rank_file.setup("DDP" + checkpointed, args, torch.device("cpu"))
    torch.manual_seed(0)
    model = rank_file.Net(args.width, args.depth)
    if checkpointed:
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            ),
            check_fn=lambda module: isinstance(module, rank_file.Block),
        )
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=POLICY)
    fully_shard(model, mesh=mesh, mp_policy=POLICY)
    return model


def forward_backward(name, model, x, y):
    """The rank file's forward and backward; DDP's forward and loss under CPU autocast."""
    if not name.startswith("DDP autocast"):
        return rank_file.forward_backward(model, x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()


def train_step(name, model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    forward_backward(name, model, x, y)
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--width", "--depth", "--batch"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(1)
    whole_x = torch.randn(args.batch, args.width, generator=generator)
    whole_y = torch.randint(0, 10, (args.batch,), generator=generator)
    rows = slice(rank * args.batch // world_size, (rank + 1) * args.batch // world_size)
    x, y = whole_x[rows].clone(), whole_y[rows].clone()
    peaks = {}
    for name in NAMES + MIXED:
        if name in MIXED:
            model = setup_mixed(name, args)
        else:
            model = rank_file.setup(name, args, torch.device("cpu"))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(2):  # as the rank file: DDP rebuilds its buckets in the second step
            train_step(name, model, optimizer, x, y)
        peaks[name] = {}
        for measure in (rank_file.peak_with_resizes_bytes, peak_bytes):
            optimizer.zero_grad(set_to_none=True)
            step = partial(forward_backward, name, model, x, y)
            peaks[name][measure.__name__] = measure(step, torch.device("cpu"))
    everything = [None] * world_size
    dist.all_gather_object(everything, peaks)
    if rank == 0:
        print(json.dumps(everything))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()  # then leave at once, as the rank file does: gloo's threads can abort
    os._exit(0)  # Python's own shutdown


if __name__ == "__main__":
    main()
