"""Notebook 05's four setups on real gloo ranks, each rank's forward+backward peak in bytes.

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

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import ddp_fsdp_checkpointing as rank_file  # noqa: E402

from tutorial_utils.tools import peak_bytes  # noqa: E402

NAMES = ("DDP", "DDP + checkpointing", "FSDP", "FSDP + checkpointing")


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
    for name in NAMES:
        model = rank_file.setup(name, args, torch.device("cpu"))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(2):  # as the rank file: DDP rebuilds its buckets in the second step
            rank_file.train_step(model, optimizer, x, y)
        peaks[name] = {}
        for measure in (rank_file.peak_with_resizes_bytes, peak_bytes):
            optimizer.zero_grad(set_to_none=True)
            step = partial(rank_file.forward_backward, model, x, y)
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
