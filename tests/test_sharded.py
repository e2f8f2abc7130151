"""``estimate --gpus N --shard fsdp2|ddp``: one rank predicted on fake tensors over the fake
process group, held to hand-worked shard sizes, to PyTorch's ``FSDPMemTracker`` and, to the byte,
to notebook 05's steps on 2 real gloo ranks."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from tutorial_utils.__main__ import main
from tutorial_utils.estimate.estimator import Workload, batch_for, build_model, make_optimizer
from tutorial_utils.estimate.models import repeated_blocks
from tutorial_utils.estimate.sharded import (
    RankReport,
    Sharding,
    ddp_bucket_sizes,
    estimate_rank,
    rank_step,
)
from tutorial_utils.estimate.strategies import parse_strategy
from tutorial_utils.measurement.autocast import CPU_POLICY, EmulatedAutocast
from tutorial_utils.measurement.fake_ranks import fake_ranks
from tutorial_utils.measurement.step import next_token_loss

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import ddp_fsdp_checkpointing as rank_file  # noqa: E402

WIDTH, DEPTH, BATCH = 32, 4, 512  # global batch: 256 rows per rank on 2 ranks
ADAM_STEP_BYTES = 4  # Adam's step counter: one float32 per parameter tensor


pytestmark = pytest.mark.usefixtures("one_thread")


def build(checkpointed: bool, context_fn=None):
    """Notebook 05's model on meta, its blocks wrapped as the rank file wraps them
    (``context_fn``: the checkpoints' recompute context, an emulated autocast's)."""
    extra = {} if context_fn is None else {"context_fn": context_fn}

    def make():
        with torch.device("meta"):
            model = rank_file.Net(WIDTH, DEPTH)
        if checkpointed:
            apply_activation_checkpointing(
                model,
                checkpoint_wrapper_fn=partial(
                    checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra
                ),
                check_fn=lambda module: isinstance(module, rank_file.Block),
            )
        return model

    return make


def predict(shard: str, checkpointed: bool, world_size: int = 2, **options) -> RankReport:
    rows = BATCH // world_size
    autocast = options.get("autocast")
    return rank_step(
        build(checkpointed, autocast.checkpoint_context_fn() if autocast else None),
        lambda model: list(model.blocks),
        lambda model: (torch.randn(rows, WIDTH), torch.randint(0, 10, (rows,))),
        F.cross_entropy,
        lambda model: torch.optim.Adam(model.parameters(), lr=1e-3),
        world_size=world_size,
        shard=shard,
        **options,
    )


def parameter_shapes() -> list[tuple[int, ...]]:
    with torch.device("meta"):
        return [tuple(p.shape) for p in rank_file.Net(WIDTH, DEPTH).parameters()]


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_keeps_each_parameters_padded_shard(world_size):
    """FSDP2 splits every parameter's first dimension in N, the last shard padded: a rank keeps
    ceil(rows / N) rows of each, in float32; Adam keeps two of those and a step counter."""
    shard_bytes = sum(
        4 * math.ceil(shape[0] / world_size) * math.prod(shape[1:]) for shape in parameter_shapes()
    )
    report = predict("fsdp2", checkpointed=True, world_size=world_size)
    assert report.breakdown["parameters"] == shard_bytes
    steps = ADAM_STEP_BYTES * len(parameter_shapes())
    assert report.breakdown["optimizer_state"] == 2 * shard_bytes + steps
    assert report.breakdown["all_gather"] > 0 and report.breakdown["buckets"] == 0
    # the head's 10 rows: 5 a rank on 2, 3 (padded from 2.5) on 4
    if world_size == 4:
        assert shard_bytes > sum(4 * math.prod(s) for s in parameter_shapes()) / 4


def test_ddp_replicates_the_model_and_adds_its_buckets():
    whole = sum(4 * math.prod(shape) for shape in parameter_shapes())
    report = predict("ddp", checkpointed=False)
    assert report.breakdown["parameters"] == whole
    assert report.breakdown["buckets"] == whole  # one bucket: the model is under 1 MiB
    assert report.ddp_buckets == 1
    with torch.device("meta"):
        big = [torch.empty(2**20, dtype=torch.float32) for _ in range(30)]  # 30 x 4 MiB
    sizes = ddp_bucket_sizes(big)
    # backward order; the first bucket closes past 1 MiB, the others past 25 MiB
    assert sizes == [4 * 2**20] + [28 * 2**20] * 4 + [4 * 2**20]


@pytest.fixture(scope="module")
def real_peaks() -> list[dict[str, dict[str, int]]]:
    """Each rank's third forward+backward peak in bytes, on 2 real gloo ranks (a few s), as the
    rank file measures it (``peak_with_resizes_bytes``) and as ``peak_bytes`` alone does."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(ROOT / "tests" / "sharded_ranks.py"),
               "--width", str(WIDTH), "--depth", str(DEPTH), "--batch", str(BATCH)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("checkpointed", [False, True])
def test_fsdp2_prediction_equals_the_real_gloo_ranks_to_the_byte(real_peaks, checkpointed):
    """Seen as LiveBytes sees it (ops only), the prediction is ``peak_bytes``'s; that misses the
    unsharded (all-gathered) parameters: at least one block's, all of them at most. Following
    FSDP2's storage resizes, it is the rank file's peak. Both hold to the byte when gloo's threads
    free their communication buffers promptly; on a loaded machine a rank was seen holding one a
    moment longer (with checkpointing, +16,064 B, in both measures, about 1 run in 10), so the
    real peaks may exceed the predictions by at most the communication buffers."""
    name = "FSDP + checkpointing" if checkpointed else "FSDP"
    truth = predict("fsdp2", checkpointed)
    as_livebytes = predict("fsdp2", checkpointed, follow_resizes=False)
    buffers = truth.breakdown["all_gather"] + truth.breakdown["reduce_scatter"]
    for real in real_peaks:  # both ranks: same shard sizes, same share of the batch
        late_ops = real[name]["peak_bytes"] - as_livebytes.forward_backward_above_start_bytes
        late = real[name]["peak_with_resizes_bytes"] - truth.forward_backward_above_start_bytes
        # peak_bytes counts frees of tensors alive before the step, as CUDA's counter does
        # (issue 41); the ops-only prediction does not model those frees yet, so that measure
        # may read below it (by 5,544 B with checkpointing here)
        assert late_ops <= buffers and 0 <= late <= buffers, (late_ops, late)
    missed = truth.forward_backward_peak_bytes - as_livebytes.forward_backward_peak_bytes
    block = 4 * (2 * 4 * WIDTH * WIDTH + 5 * WIDTH)
    assert block <= missed <= sum(4 * math.prod(s) for s in parameter_shapes())


@pytest.mark.parametrize("checkpointed", [False, True])
def test_ddp_prediction_equals_the_real_gloo_ranks_to_the_byte(real_peaks, checkpointed):
    """The real step measured is DDP's third: its reducer rebuilt the buckets in the second, so
    they are held before it, as in the prediction; DDP resizes no storage, so both measures agree."""
    name = "DDP + checkpointing" if checkpointed else "DDP"
    predicted = predict("ddp", checkpointed).forward_backward_above_start_bytes
    for real in real_peaks:
        assert real[name] == {"peak_with_resizes_bytes": predicted, "peak_bytes": predicted}


def mixed_precision_policy(reduce_dtype=torch.float32):
    """``tests/sharded_ranks.py``'s FSDP2 policy (torchtitan's): bf16 compute, fp32 reduce."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)


def test_fsdp2_mixed_precision_equals_the_real_gloo_ranks_to_the_byte(real_peaks):
    """FSDP2 with ``MixedPrecisionPolicy(bf16, fp32)`` on 2 real gloo ranks: its forward+backward
    peak, both measures, within the communication buffers as above (to the byte when gloo frees
    them promptly)."""
    truth = predict("fsdp2", False, mp_policy=mixed_precision_policy())
    as_livebytes = predict("fsdp2", False, mp_policy=mixed_precision_policy(), follow_resizes=False)
    buffers = truth.breakdown["all_gather"] + truth.breakdown["reduce_scatter"]
    for real in real_peaks:
        late = real["FSDP bf16 policy"]["peak_with_resizes_bytes"]
        late -= truth.forward_backward_above_start_bytes
        late_ops = real["FSDP bf16 policy"]["peak_bytes"]
        late_ops -= as_livebytes.forward_backward_above_start_bytes
        assert 0 <= late <= buffers and late_ops <= buffers, (late, late_ops)


def test_fsdp2_policy_keeps_fp32_shards_and_gathers_in_param_dtype():
    """The policy leaves what a rank keeps in fp32 (its parameter shard, Adam's state) and
    lowers what it gathers and computes with; a bf16 reduce holds smaller reduce-scatter buffers."""
    plain = predict("fsdp2", True)
    mixed = predict("fsdp2", True, mp_policy=mixed_precision_policy())
    low_reduce = predict("fsdp2", True, mp_policy=mixed_precision_policy(torch.bfloat16))
    for kept in ("parameters", "optimizer_state"):
        assert mixed.breakdown[kept] == plain.breakdown[kept]
    assert mixed.breakdown["all_gather"] < plain.breakdown["all_gather"]
    assert mixed.forward_backward_peak_bytes < plain.forward_backward_peak_bytes
    assert low_reduce.breakdown["reduce_scatter"] < mixed.breakdown["reduce_scatter"]


def test_ddp_under_autocast_equals_the_real_gloo_ranks_to_the_byte(real_peaks):
    """DDP with its forward under ``torch.autocast("cpu", bfloat16)``, blocks checkpointed (the
    recomputation under autocast too), against the CPU policy's emulation on fake tensors: fp32
    parameters, gradients and buckets, the bf16 copies autocast caches."""
    autocast = EmulatedAutocast(torch.bfloat16, CPU_POLICY)
    report = predict("ddp", True, autocast=autocast)
    whole = sum(4 * math.prod(shape) for shape in parameter_shapes())
    assert report.breakdown["parameters"] == report.breakdown["buckets"] == whole
    predicted = report.forward_backward_above_start_bytes
    for real in real_peaks:
        peaks = real["DDP autocast + checkpointing"]
        assert peaks == {"peak_with_resizes_bytes": predicted, "peak_bytes": predicted}


@pytest.mark.parametrize("checkpointed", [False, True])
def test_ddp_prediction_equals_real_ddps_later_steps(checkpointed):
    """Real DistributedDataParallel over the fake group on real CPU tensors (its comm hook a
    no-op: the fake group's all-reduce returns no tensor): its second step rebuilds the buckets,
    from the third on they are held before the step, as predicted."""
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

    from tutorial_utils.tools import peak_bytes

    rows = BATCH // 2
    with fake_ranks(2):
        torch.manual_seed(0)
        model = rank_file.setup(
            "DDP + checkpointing" if checkpointed else "DDP",
            SimpleNamespace(width=WIDTH, depth=DEPTH),
            torch.device("cpu"),
        )
        model.register_comm_hook(None, noop_hook)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(rows, WIDTH), torch.randint(0, 10, (rows,))
        peaks = []
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            peaks.append(peak_bytes(partial(rank_file.train_step, model, optimizer, x, y)))
        optimizer.zero_grad(set_to_none=True)
        later = peak_bytes(partial(rank_file.forward_backward, model, x, y))
    report = predict("ddp", checkpointed)
    assert later == report.forward_backward_above_start_bytes
    # the second step rebuilds the buckets: it frees the old ones as it allocates the new, and
    # peak_bytes counts the frees, as CUDA's counter does, so its peak is not above the third's
    assert peaks[1] >= peaks[2]


def fsdp_mem_tracker_peak(model, blocks, batch, loss_fn, optimizer_factory, checkpointing):
    """torch.distributed._tools' FSDPMemTracker around the forward and backward of a step after
    one untracked step: its peak, on fake tensors over the fake process group."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tutorial_utils.estimate.sharded import _to_fake_cpu
    from tutorial_utils.measurement.meta_attention import unpacked_dry_run_batches

    # an unpacked batch, as on a GPU (transformers takes fake position ids for tracing)
    with fake_ranks(2), unpacked_dry_run_batches():
        mesh = init_device_mesh("cpu", (2,))
        with FakeTensorMode(allow_non_fake_inputs=True):
            _to_fake_cpu(model)
            with checkpointing(model):
                for block in blocks(model):
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
                optimizer = optimizer_factory(model)
                inputs, targets = batch(model)
                loss_fn(model(inputs), targets).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                tracker = FSDPMemTracker(model, optimizer)
                tracker.track_inputs((inputs, targets))
                with tracker:
                    loss_fn(model(inputs), targets).backward()
    assert not dist.is_initialized()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def test_fsdp2_prediction_equals_pytorchs_fsdp_mem_tracker():
    rows = BATCH // 2
    theirs = fsdp_mem_tracker_peak(
        build(checkpointed=False)(),
        lambda model: list(model.blocks),
        lambda model: (torch.randn(rows, WIDTH), torch.randint(0, 10, (rows,))),
        F.cross_entropy,
        lambda model: torch.optim.Adam(model.parameters(), lr=1e-3),
        lambda model: contextlib.nullcontext(),
    )
    assert predict("fsdp2", checkpointed=False).forward_backward_peak_bytes == theirs


@pytest.mark.parametrize("strategy", [parse_strategy("none"), parse_strategy("every-block")])
def test_a_transformers_models_prediction_equals_fsdp_mem_tracker(tmp_path, strategy):
    """A Llama from its config through the command's path (its own checkpointing call, its
    decoder layers sharded one by one): FSDPMemTracker's peak to the byte."""
    workload = Workload(f"hf:{tiny_llama(tmp_path)}", batch=2, size=64, precision="fp32")
    theirs = fsdp_mem_tracker_peak(
        build_model(workload),
        repeated_blocks,
        lambda model: batch_for(workload, model, "cpu"),
        next_token_loss,
        partial(make_optimizer, workload),
        strategy.applied,
    )
    assert estimate_rank(workload, strategy, 2, "fsdp2").forward_backward_peak_bytes == theirs


def test_an_existing_process_group_is_left_alone():
    with fake_ranks(2):
        with pytest.raises(RuntimeError, match="already initialized"):
            with fake_ranks(2):
                pass
        assert dist.get_world_size() == 2
    assert not dist.is_initialized()


def tiny_llama(folder: Path) -> str:
    """A Llama's config.json at a CPU's size, as a user's file."""
    config = {"model_type": "llama", "vocab_size": 500, "bos_token_id": 0, "eos_token_id": 0,
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256}  # fmt: skip
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_the_command_prints_a_ranks_row_as_one_gpus(tmp_path, capsys):
    """The single-GPU table, one row per strategy for rank 0: the GPU's attention kernel, the
    replay, the margin, the largest-fit search and the predicted rate; then the last table."""
    arguments = ["estimate", "--hf-config", tiny_llama(tmp_path), "--seq", "64", "--precision", "fp32",
                 "--strategies", "none,offload", "--gpu", "a100-80gb", "--jobs", "1"]  # fmt: skip
    assert main([*arguments, "--gpus", "2", "--shard", "fsdp2"]) == 0
    out = capsys.readouterr().out  # two tables: before the search and after it (the rows kept)
    assert "2 GPUs, FSDP2 (torch" in out and "each row is rank 0 of 2" in out
    header = next(line for line in out.splitlines() if line.startswith("strategy"))
    assert header.split()[1:] == ["attention", "params", "grads", "optim", "activ", "comm", "alloc",
                                  "reserved", "smi", "margin", "FLOPs", "longest", "tok/s"]  # fmt: skip
    assert max(len(line) for line in out.splitlines()) <= 120
    rows = {line[:24].strip(): line[24:].split() for line in out.splitlines()}
    assert rows["every block, offloaded"][0] == "GPU-only:"
    kernel, *figures, flops, longest, rate = rows["none"]
    assert not kernel.startswith("cpu")  # the A100's kernel, not this CPU's
    cells = [float(figure.replace(",", "")) for figure in figures]
    params, grads, optim, activ, comm, allocated, reserved, smi, margin = cells
    assert params + grads + optim + activ + comm <= allocated <= reserved < smi and margin > 0
    assert float(flops) == 1.0 and int(longest.replace(",", "")) > 0 and rate != "-"
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("shard", "mixed"), [("fsdp2", "fsdp2_param_dtype"), ("ddp", "ddp_autocast")]
)
def test_json_carries_the_ranks_figures_and_how_it_casts(tmp_path, capsys, shard, mixed):
    arguments = ["estimate", "--hf-config", tiny_llama(tmp_path), "--seq", "64", "--precision",
                 "amp-bf16", "--strategies", "every-block", "--no-search", "--json", "--jobs", "1"]  # fmt: skip
    assert main([*arguments, "--gpus", "2", "--shard", shard]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["sharding"]["gpus"] == 2 and record["sharding"][mixed] in ("bfloat16", True)
    row = record["strategies"][0]
    comm = row["all_gather_bytes"] + row["reduce_scatter_bytes"] + row["buckets_bytes"]
    assert comm > 0 and row["predicted_max_reserved_bytes"] >= row["predicted_max_allocated_bytes"]
    assert row["margin_bytes"] > 0 and row["attention_kernel"] != "-"


def test_the_pipeline_equals_the_rank_step_it_runs(tmp_path):
    """One pipeline: ``estimate(..., sharding=...)``'s row is ``estimate_rank``'s step."""
    from tutorial_utils.estimate.card import parse_card
    from tutorial_utils.estimate.estimator import estimate

    workload = Workload(f"hf:{tiny_llama(tmp_path)}", batch=2, size=64, precision="amp-bf16")
    strategy = parse_strategy("every-block")
    sharding = Sharding(2, "fsdp2")
    result = estimate(workload, [strategy], parse_card("24GB"), search=False, sharding=sharding)
    report = result.rows[0].report
    rank = estimate_rank(workload, strategy, 2, "fsdp2")
    assert report is not None and report.peak_bytes == rank.peak_bytes
    assert report.breakdown == rank.breakdown and result.rows[0].allocator is not None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--gpus", "2"], "--gpus and --shard go together"),
        (["--shard", "ddp"], "--gpus and --shard go together"),
        (["--gpus", "2", "--shard", "ddp", "--reduce-dtype", "bf16"], "--reduce-dtype is for"),
        (["--reduce-dtype", "bf16"], "--reduce-dtype is for"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(arguments, message, capsys):
    assert main(["estimate", "--hf-preset", "gpt2", *arguments]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_torch_without_distributed_is_told_in_one_line(monkeypatch):
    monkeypatch.setattr(dist, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="^this torch was built without torch.distributed"):
        with fake_ranks(2):
            pass


@pytest.mark.parametrize(
    ("shard", "precision", "one_gpu_precision"),
    [("ddp", "amp-bf16", "amp-bf16"), ("fsdp2", "amp-bf16", "bf16")],
)
def test_rank_0s_kept_activations_split_as_one_gpus(tmp_path, shard, precision, one_gpu_precision):
    """The table's and --json's blocks / logits and loss / the rest, for rank 0: to the byte one
    GPU's at the same batch per GPU (DDP's forward is one GPU's under autocast; FSDP2's
    MixedPrecisionPolicy computes in the all-gathered bf16 weights, as a bf16 model does)."""
    from tutorial_utils.estimate.breakdown import REGIONS, KeptForBackward
    from tutorial_utils.estimate.card import parse_card
    from tutorial_utils.estimate.estimator import estimate, train_step
    from tutorial_utils.estimate.record import estimate_record
    from tutorial_utils.estimate.report import estimate_table

    workload = Workload(f"hf:{tiny_llama(tmp_path)}", batch=2, size=64, precision=precision,
                        loop="plain")  # fmt: skip
    strategy = parse_strategy("every-block")
    result = estimate(
        workload, [strategy], parse_card("8GB"), search=False, sharding=Sharding(2, shard)
    )
    one_gpu = dataclasses.replace(workload, precision=one_gpu_precision)
    expected = KeptForBackward()
    train_step(build_model(one_gpu), one_gpu, strategy, kept=expected)
    assert all(expected.bytes_by_region.values())
    assert result.rows[0].kept == expected
    (row,) = estimate_record(result)["strategies"]
    assert {r: row[f"kept_at_loss_{r}_bytes"] for r in REGIONS} == expected.bytes_by_region
    assert "rank 0's activations kept at the loss" in estimate_table(result)
