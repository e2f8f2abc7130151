"""One rank of notebook 05: activation checkpointing under DDP and under FSDP2.

    torchrun --standalone --nproc-per-node 2 ddp_fsdp_checkpointing.py --width 128 --batch 1024

torchrun starts one process per rank and gives each RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, which init_process_group reads (--standalone: on this machine, at a free port).
The ranks run on the CPU and talk over gloo, or one per GPU over NCCL where there are enough
GPUs. Rank 0 writes what every rank measured to --report (default: stdout); a file keeps the
report apart from what gloo itself prints on stdout in some torch versions.
"""

import argparse
import os
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from tutorial_utils.tools import LiveBytes, MiB, compare_times, peak_bytes, time_turns


class Block(nn.Module):
    """x + fc2(relu(fc1(x))): a transformer's MLP block, the unit people checkpoint."""

    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.relu(self.fc1(x)))


class Net(nn.Module):
    """An input layer, `depth` blocks, then a 10-class head. shared=True applies ONE block `depth` times (tied
    weights, as in ALBERT). use_reentrant=None: no checkpointing; True or False: every block
    application goes through checkpoint(..., use_reentrant=use_reentrant)."""

    def __init__(self, width, depth, shared=False, use_reentrant=None):
        super().__init__()
        self.depth, self.shared, self.use_reentrant = depth, shared, use_reentrant
        self.inp = nn.Linear(width, width)  # reentrant checkpoint needs an input that requires grad
        self.blocks = nn.ModuleList(Block(width) for _ in range(1 if shared else depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        x = self.inp(x)
        for i in range(self.depth):
            block = self.blocks[0 if self.shared else i]
            if self.use_reentrant is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.use_reentrant)
        return self.head(x)


def ddp_case(args, use_reentrant, static_graph, batch, device):
    """One forward and backward of the shared-block model, checkpointed, under DDP: whether the
    gradients equal one process's on the whole batch, or the first sentence of DDP's error."""
    x, y, whole_x, whole_y = batch
    torch.manual_seed(0)
    model = Net(args.width, args.depth, shared=True, use_reentrant=use_reentrant).to(device)
    ddp_model = DistributedDataParallel(model, static_graph=static_graph)
    try:
        F.cross_entropy(ddp_model(x), y).backward()
    except RuntimeError as error:
        return "FAILED: " + str(error).split(".")[0]
    finally:
        dist.barrier()  # every rank ends this case before the next one wraps a model
    torch.manual_seed(0)
    alone = Net(args.width, args.depth, shared=True)  # one process, no checkpointing
    F.cross_entropy(alone(whole_x), whole_y).backward()
    pairs = zip(model.parameters(), alone.parameters(), strict=True)
    same = all(torch.allclose(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6) for p, q in pairs)
    return f"ok, gradients equal one process's on the whole batch: {same}"


def setup(name, args, device):
    """The model as `name` trains it. Checkpointing wraps every block first; FSDP then shards
    every (wrapped) block, then the root, so each FSDP unit is one checkpointed block."""
    torch.manual_seed(0)
    model = Net(args.width, args.depth).to(device)
    if name.endswith("+ checkpointing"):
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            ),
            check_fn=lambda module: isinstance(module, Block),
        )
    if name.startswith("FSDP"):
        # the ranks' devices, named: by default FSDP takes the GPU whenever there is one
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)  # all-gathered just before it runs, freed after
        fully_shard(model, mesh=mesh)  # the rest: input layer and head
        return model
    return DistributedDataParallel(model)


def forward_backward(model, x, y):
    F.cross_entropy(model(x), y).backward()


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    forward_backward(model, x, y)
    optimizer.step()


def peak_with_resizes_bytes(step, device):
    """peak_bytes, seeing also the storage resizes FSDP2 frees and restores all-gathered
    parameters with (untyped_storage().resize_ reaches no dispatch mode, so LiveBytes alone misses
    them; PyTorch's own memory trackers follow resize_ the same way). CUDA's counter sees them.
    On a CPU, measure after FSDP2's first step, which creates the storages it resizes."""
    if device.type == "cuda":
        return peak_bytes(step, device)
    resize = torch.UntypedStorage.resize_

    def followed_resize(storage, nbytes):
        if storage.data_ptr() in counter.live:  # LiveBytes knows storages by address
            raise RuntimeError(
                "a storage created during the step was resized: measure a later step"
            )
        counter.now_bytes += nbytes - storage.nbytes()
        counter.peak_bytes = max(counter.peak_bytes, counter.now_bytes)
        return resize(storage, nbytes)

    with LiveBytes() as counter:
        torch.UntypedStorage.resize_ = followed_resize
        try:
            step()
        finally:
            torch.UntypedStorage.resize_ = resize
    return counter.peak_bytes


def state_mib(model, optimizer):
    """Parameters and Adam's state that this rank keeps between steps (its shard, under FSDP)."""
    kept = [*model.parameters(), *(t for s in optimizer.state.values() for t in s.values())]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in kept]
    return sum(t.nbytes for t in local) / MiB


class Collectives(TorchDispatchMode):
    """Counts the collectives this rank calls inside it, by name: all-gathers, reduce-scatters."""

    def __init__(self):
        super().__init__()
        self.counts = {"all-gathers": 0, "reduce-scatters": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if "c10d" in name and "allgather" in name:
            self.counts["all-gathers"] += 1
        elif "c10d" in name and "reduce_scatter" in name:
            self.counts["reduce-scatters"] += 1
        return func(*args, **(kwargs or {}))


ORDERS = (
    "checkpoint, then fully_shard",
    "fully_shard, then checkpoint",
    "fully_shard, then reentrant checkpoint",
    "FSDP1, checkpoint inside each unit",
    "FSDP1, reentrant checkpoint around each unit",
)


def fsdp1(model, device):
    """FSDP1, the wrapper transformers' Trainer runs by default: one unit per Block, in bf16."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = ModuleWrapPolicy({Block})
    return FullyShardedDataParallel(
        model, auto_wrap_policy=policy, mixed_precision=bf16, device_id=device
    )


def collectives_per_step(order, args, x, y, device):
    """FSDP in bf16 (parameters gathered in bf16, gradients reduced in fp32), every block
    checkpointed in `order`: the collectives of the third step's forward and backward."""
    torch.manual_seed(0)
    model = Net(args.width, args.depth, use_reentrant=True if "reentrant" in order else None)
    model = model.to(device)

    def wrap():
        apply_activation_checkpointing(model, check_fn=lambda module: isinstance(module, Block))

    if order.startswith("FSDP1"):
        model = fsdp1(model, device)
        if order == "FSDP1, checkpoint inside each unit":
            wrap()  # what fsdp_config={"activation_checkpointing": True} does
    if order == "checkpoint, then fully_shard":
        wrap()  # each FSDP unit is one checkpointed block
    if not order.startswith("FSDP1"):
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=bf16)
        fully_shard(model, mesh=mesh, mp_policy=bf16)
    if order == "fully_shard, then checkpoint":
        wrap()  # the checkpoint wraps each FSDP unit
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        forward_backward(model, x, y)
    model.zero_grad(set_to_none=True)
    with Collectives() as counted:
        forward_backward(model, x, y)
    gradient = next(p.grad for p in model.parameters() if p.grad is not None)
    return {**counted.counts, "gradients": str(gradient.dtype).removeprefix("torch.")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1024, help="global: split over the ranks")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--report", help="file rank 0 writes its report to (default: stdout)")
    args = parser.parse_args()
    world_size = int(os.environ["WORLD_SIZE"])
    on_gpus = torch.cuda.device_count() >= world_size
    if on_gpus:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if on_gpus else "gloo")
    rank = dist.get_rank()

    # every rank builds the same seeded global batch and takes its own share of the rows
    generator = torch.Generator().manual_seed(1)
    whole_x = torch.randn(args.batch, args.width, generator=generator)
    whole_y = torch.randint(0, 10, (args.batch,), generator=generator)
    rows = slice(rank * args.batch // world_size, (rank + 1) * args.batch // world_size)
    x, y = whole_x[rows].to(device), whole_y[rows].to(device)

    batch = (x, y, whole_x, whole_y)
    ddp = {
        "use_reentrant=True": ddp_case(args, True, False, batch, device),
        "use_reentrant=True, static_graph=True": ddp_case(args, True, True, batch, device),
        "use_reentrant=False": ddp_case(args, False, False, batch, device),
    }
    collectives = {order: collectives_per_step(order, args, x, y, device) for order in ORDERS}

    names = ("DDP", "DDP + checkpointing", "FSDP", "FSDP + checkpointing")
    steps, memory = {}, {}
    for name in names:
        model = setup(name, args, device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        # Adam's state exists from the first step on; DDP rebuilds its buckets in the second
        for _ in range(2):
            train_step(model, optimizer, x, y)
        peaks = []
        for measure in (peak_with_resizes_bytes, peak_bytes):  # the third step's forward+backward
            optimizer.zero_grad(set_to_none=True)
            peaks.append(measure(partial(forward_backward, model, x, y), device) / MiB)
        memory[name] = (state_mib(model, optimizer), *peaks)
        steps[name] = partial(train_step, model, optimizer, x, y)
    times = time_turns(steps, turns=args.turns, device=device)  # one thread per rank

    everything = [None] * world_size
    dist.all_gather_object(everything, (ddp, memory, times, collectives))
    if rank == 0:
        report(args, everything, names, device)
    dist.barrier()  # no rank leaves while another still talks to it
    dist.destroy_process_group()
    # gloo's worker threads can abort Python's own shutdown ("terminate called without an active
    # exception") about once in ten runs: everything is done and written, so leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def report(args, everything, names, device):
    """Rank 0's report of every rank: DDP cases, memory, step times, FSDP's collectives."""
    world_size, lines = len(everything), []
    lines.append(
        f"{world_size} ranks on {device.type} ({dist.get_backend()}); {args.depth} blocks of "
        f"width {args.width}; global batch {args.batch} = {args.batch // world_size} per rank"
    )
    lines.append(f"\nDDP, the block shared by all {args.depth} applications, each checkpointed:")
    for case in everything[0][0]:
        for r, (ddp_r, *_) in enumerate(everything):
            lines.append(f"  rank {r}  {case:<38} {ddp_r[case]}")
    lines.append(
        "\nMiB per rank, third step: kept between steps (parameters + Adam) | forward + "
        "backward peak | the same by peak_bytes"
    )
    for name in names:
        for r, (_, memory_r, *_) in enumerate(everything):
            kept, peak, ops_peak = memory_r[name]
            lines.append(f"  rank {r}  {name:<21} {kept:7.2f} | {peak:7.2f} | {ops_peak:7.2f}")
    lines.append(f"\nstep time per rank, one thread each, {args.turns} interleaved turns:")
    for r, (_, _, times_r, _) in enumerate(everything):
        for plain in ("DDP", "FSDP"):
            pair = {"plain": times_r[plain], "checkpointed": times_r[plain + " + checkpointing"]}
            lines.append(f"rank {r}, {plain}:")
            lines.append(compare_times(pair, reference="plain"))
    lines.append("\nFSDP in bf16, collectives in one step's forward and backward, per rank:")
    for order in ORDERS:
        for r, (*_, collectives_r) in enumerate(everything):
            counts = collectives_r[order]
            lines.append(
                f"  rank {r}  {order:<44} {counts['all-gathers']:3d} all-gathers | "
                f"{counts['reduce-scatters']:3d} reduce-scatters | {counts['gradients']} gradients"
            )
    text = "\n".join(lines) + "\n"
    if args.report:
        Path(args.report).write_text(text, encoding="utf-8")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
