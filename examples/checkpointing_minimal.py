"""The least a rank needs: activation checkpointing under DDP, then under FSDP2.

    torchrun --standalone --nproc-per-node 2 checkpointing_minimal.py

Each rank trains on its own batch, on the CPU over gloo (on GPUs: "nccl", and "cuda" tensors).
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, width=64, depth=4, checkpointed=False):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head, self.checkpointed = nn.Linear(width, 10), checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(x)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)  # each rank its own batch
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

torch.manual_seed(0)  # every rank starts from the same weights
ddp_model = DistributedDataParallel(Net(checkpointed=True))  # checkpoint inside forward
F.cross_entropy(ddp_model(x), y).backward()  # gradients all-reduced: equal on every rank
print(f"rank {rank}: DDP + checkpoint, step done\n", end="")  # one write: ranks share stdout

torch.manual_seed(0)
model = Net()
apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))  # first
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for block in model.blocks:
    fully_shard(block, mesh=mesh, mp_policy=bf16)  # then shard each checkpointed block
fully_shard(model, mesh=mesh, mp_policy=bf16)  # and the rest
F.cross_entropy(model(x), y).backward()
grad = model.head.weight.grad  # this rank's shard, reduced in fp32
done = "FSDP2 + apply_activation_checkpointing, step done"
print(f"rank {rank}: {done}, {grad.dtype} gradients\n", end="")
dist.destroy_process_group()
