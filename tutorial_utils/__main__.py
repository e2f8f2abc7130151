"""Command line: ``python -m tutorial_utils train|bench|estimate``: the notebooks' experiments
headless, and the training-memory estimate for your own model."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import NoReturn

from tutorial_utils.articles.profiles import PROFILES, get_profile
from tutorial_utils.checkpointing.kinds import default_spellings, spelled, strategy_spellings
from tutorial_utils.gpus import gpu_choices, gpu_help

__all__ = ["build_parser", "main"]

# VGG16 halves its input five times (max-pooling): below 32 px a feature map vanishes.
MIN_VGG16_IMAGE_SIZE = 32


class CleanArgumentParser(argparse.ArgumentParser):
    """Bad arguments end in one line and exit status 2, never a traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = CleanArgumentParser(
        prog="python -m tutorial_utils",
        description="Run the gradient-checkpointing tutorial's experiments without a notebook.",
        epilog=f"Sizes come from the profile in $TUTORIAL_PROFILE ({', '.join(PROFILES)}).",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=CleanArgumentParser
    )
    train = commands.add_parser(
        "train",
        help="train one article's model, printing its per-epoch log line and a JSON summary",
        description="Train an article's model; unset options take the active profile's sizes.",
    )
    train.add_argument(
        "--experiment",
        required=True,
        choices=("vgg16-dogcat", "neta-cifar10"),
        help="first article (VGG16, dogs vs cats) or second article (NetA, CIFAR-10)",
    )
    train.add_argument(
        "--strategy",
        type=strategy_word,
        default="none",
        help="how to checkpoint: vgg16-dogcat none or segments-N, N in 2..10 (segments-2: the "
        "article); neta-cifar10 none or segments-5 (the article's five segments, inside NetA). "
        f"The spellings: {strategy_spellings()}",
    )
    train.add_argument("--batch-size", type=positive_int, help="training batch size")
    train.add_argument("--epochs", type=positive_int, help="number of epochs")
    train.add_argument("--image-size", type=positive_int, help="input side in pixels")
    train.add_argument(
        "--data",
        help="dataset folder, or 'synthetic' for generated files in the real formats "
        "(default: the downloaded dataset under data/, else generated)",
    )
    train.add_argument(
        "--checkpoint-dir", help="save the latest epoch's state here and resume from it"
    )
    train.add_argument(
        "--keep-every-epoch",
        action="store_true",
        help="keep every epoch's state_dict in --checkpoint-dir, as the article does",
    )
    train.add_argument("--no-progress", action="store_true", help="hide progress bars")
    bench = commands.add_parser(
        "bench",
        help="print peak memory and step time with and without checkpointing (active profile)",
        description="Measure one training step per model and checkpoint setting, side by side.",
    )
    bench.add_argument(
        "--image-size", type=positive_int, help="input side for every model (default: profile's)"
    )
    bench.add_argument("--batch-size", type=positive_int, help="batch (default: profile's)")
    add_estimate_parser(commands)
    return parser


ESTIMATE_EXAMPLE = (
    "example: python -m tutorial_utils estimate --hf-preset llama-3.1-8b --seq 4096 --lora 16 "
    "--card 24GB"
)


def add_estimate_parser(commands: argparse._SubParsersAction) -> None:
    estimate = commands.add_parser(
        "estimate",
        help="will training your model fit your card? dry runs of one step per strategy",
        description="Dry-run one training step of your model on the meta device (no GPU, no "
        "download) for each checkpointing strategy: peak memory by category, FLOPs against no "
        "checkpointing, whether it fits the card, and the largest size that does.",
        epilog=ESTIMATE_EXAMPLE,
    )
    _add_model_arguments(estimate)
    _add_training_arguments(estimate)
    _add_gpu_arguments(estimate)
    _add_run_arguments(estimate)


def _add_model_arguments(estimate: argparse.ArgumentParser) -> None:
    """What model, at what size."""
    model = estimate.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--hf-preset", help="llama-3.2-1b, llama-3.1-8b, qwen2.5-7b, mistral-7b, gpt2"
    )
    model.add_argument("--hf-config", help="a transformers causal LM's config.json (a local file)")
    model.add_argument("--hf-model", help="a Hub model id: its config is fetched with AutoConfig")
    model.add_argument("--torchvision", help="a torchvision classifier, e.g. resnet50, vit_b_16")
    estimate.add_argument("--batch", type=positive_int, help="batch (default 1; classifiers 32)")
    estimate.add_argument(
        "--seq", type=positive_int, help="sequence length in tokens (default 2048)"
    )
    estimate.add_argument("--image-size", type=positive_int, help="image side in px (default 224)")
    estimate.add_argument("--num-classes", type=positive_int, default=1000, help="classifier head")


def _add_training_arguments(estimate: argparse.ArgumentParser) -> None:
    """How it trains: precision, optimizer, LoRA, QLoRA's recipe, the loop, the strategies."""
    estimate.add_argument(
        "--precision",
        choices=("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16", "nf4"),
        help="pure fp32/bf16/fp16, amp-*: fp32 weights under torch.autocast, or nf4: QLoRA, a "
        "bitsandbytes 4-bit base (with --lora RANK) (default: bf16 for language models, fp32 "
        "for classifiers)",
    )
    estimate.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    estimate.add_argument(
        "--lora", type=positive_int, metavar="RANK", help="LoRA rank (default: full fine-tuning)"
    )
    estimate.add_argument(
        "--lora-targets", help="comma-separated module names (default: attention projections)"
    )
    estimate.add_argument(
        "--lora-dropout",
        type=float,
        default=0.0,
        metavar="P",
        help="LoraConfig's lora_dropout (default 0.0; recipes often use 0.05-0.1: each adapted "
        "projection then keeps its own dropped input and a mask)",
    )
    estimate.add_argument(
        "--qlora-recipe",
        choices=("peft", "trl-bf16", "no-upcast"),
        default="peft",
        help="with --precision nf4, how the rest is cast: peft = peft 0.21's "
        "prepare_model_for_kbit_training alone (all else fp32, no autocast; the default); "
        "trl-bf16 = TRL 0.8-0.25's SFTTrainer(bf16=True): that, then "
        "trl.trainer.utils.peft_module_casting_to_bf16 (embeddings, head bf16) under bf16 "
        "autocast; no-upcast = TRL 0.26+'s SFTTrainer(bf16=True): weights and adapters bf16, "
        "under bf16 autocast",
    )
    estimate.add_argument(
        "--strategies",
        default=",".join(default_spellings()),
        help=f"comma-separated, each one of {strategy_spellings(any_model=True)}",
    )


def _add_gpu_arguments(estimate: argparse.ArgumentParser) -> None:
    """Which card: its memory, its model, what is held back, the allocator's mode, N GPUs."""
    estimate.add_argument(
        "--card", help="the GPU's memory, e.g. 24GB, 80GB (default: the --gpu's, else 24GB)"
    )
    estimate.add_argument(
        "--gpu",
        default="any",
        type=str.lower,
        choices=gpu_choices(),
        metavar="NAME",
        help=f"the GPU model: {gpu_help()}; any or cpu: none named, the CPU's attention "
        "kernels. It sets the SDPA kernel the dry run keeps, the card's memory, its quoted peaks "
        "for the predicted step time, its CUDA context and cuBLAS's workspace "
        "(the table in tutorial_utils/gpus.py)",
    )
    estimate.add_argument(
        "--reserve",
        default="0",
        help="held back besides the CUDA context, for what runs outside PyTorch's allocator "
        "(other processes, NCCL): a share of the card (10%%) or a size (1.5GB); default none. "
        "Workspaces and the allocator's slack are in the replay, no longer in here",
    )
    estimate.add_argument(
        "--expandable-segments",
        action="store_true",
        help="replay the allocator as PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True runs it",
    )


def _add_run_arguments(estimate: argparse.ArgumentParser) -> None:
    """The search, the output (--json, --snapshot) and the processes."""
    estimate.add_argument("--no-search", action="store_true", help="skip the largest-fit search")
    estimate.add_argument(
        "--gpus",
        type=positive_int,
        help="with --shard: what each of N GPUs holds, --batch per GPU (rank 0 predicted on "
        "fake tensors over PyTorch's fake process group, then the same replay, margin, search "
        "and time as one GPU)",
    )
    estimate.add_argument(
        "--shard",
        choices=("fsdp2", "ddp"),
        help="with --gpus: fsdp2 = torch's fully_shard on every block, then the root; with "
        "--precision amp-*, fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=the amp "
        "dtype, reduce_dtype=--reduce-dtype)): fp32 sharded weights, low-precision all-gathered "
        "copies, no autocast (torchtitan's parallelize_llama). ddp = torch's "
        "DistributedDataParallel; with amp-*, the forward under torch.autocast: fp32 weights, "
        "gradients and buckets, the cast copies autocast caches",
    )
    estimate.add_argument(
        "--reduce-dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="with --shard fsdp2 and --precision amp-*: MixedPrecisionPolicy's reduce_dtype, the "
        "gradients' reduce-scatter dtype (default fp32, torchtitan's "
        "training.mixed_precision_reduce; accelerate's FSDP plugin sets it to the amp dtype)",
    )
    estimate.add_argument(
        "--loop",
        choices=("trainer", "plain"),
        default="trainer",
        help="the training loop a language model's step follows: trainer = transformers' "
        "Trainer and TRL (the logits are freed before backward; the default), plain = "
        "outputs = model(ids); loss.backward() (the logits live through backward)",
    )
    estimate.add_argument(
        "--loss",
        choices=("transformers", "transformers-4.48", "logits-dtype"),
        default="transformers",
        help="how a language model's loss treats the logits: transformers = ForCausalLMLoss of "
        "transformers 4.49 and later (the logits upcast to fp32; the default); "
        "transformers-4.48 = 4.48's (then the shifted logits copied in fp32 too); "
        "logits-dtype = a custom loop's cross entropy on the bf16 logits, no fp32 upcast",
    )
    estimate.add_argument(
        "--json",
        action="store_true",
        help="print every figure as JSON (units in the field names) instead of the table",
    )
    estimate.add_argument(
        "--snapshot",
        metavar="FILE",
        help="write each strategy's replayed step as a CUDA memory snapshot (the format of "
        "torch.cuda.memory._dump_snapshot) to open at pytorch.org/memory_viz: FILE itself for "
        "one strategy, FILE's name plus -STRATEGY for several; with --gpus, rank 0's step",
    )
    estimate.add_argument(
        "--jobs",
        type=positive_int,
        default=min(2, os.cpu_count() or 1),
        help="processes for the strategies' dry runs (Linux; default: 2 where there are 2 cores)",
    )


def strategy_word(text: str) -> str:
    """A strategy's command-line spelling, checked against the table of kinds (torch-free)."""
    try:
        spelled(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text.strip().lower()


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def check_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Sizes a model cannot take end in one line before anything heavy is imported."""
    if args.command not in ("bench", "train"):
        return
    runs_vgg16 = args.command == "bench" or args.experiment == "vgg16-dogcat"
    if runs_vgg16 and args.image_size is not None and args.image_size < MIN_VGG16_IMAGE_SIZE:
        parser.error(
            f"--image-size must be at least {MIN_VGG16_IMAGE_SIZE} for VGG16 (it halves the image "
            f"five times), got {args.image_size}"
        )


def estimate_workload(args: argparse.Namespace):
    """The ``estimate`` arguments as a ``Workload`` and its strategies (ValueError if bad)."""
    from tutorial_utils.estimate.estimator import Workload
    from tutorial_utils.estimate.strategies import parse_strategy

    language_model = args.torchvision is None
    if language_model and args.image_size is not None:
        raise ValueError("--image-size is for --torchvision models; use --seq for a language model")
    if not language_model and args.seq is not None:
        raise ValueError("--seq is for language models; use --image-size for --torchvision")
    if language_model:
        source = args.hf_preset or args.hf_config or args.hf_model
        model, size = f"hf:{source}", args.seq or 2048
        if size < 2:
            raise ValueError(f"--seq must be at least 2 tokens (one to predict), got {size}")
    else:
        model, size = f"torchvision:{args.torchvision}", args.image_size or 224
    targets = tuple(t.strip() for t in (args.lora_targets or "").split(",") if t.strip())
    if targets and not args.lora:
        raise ValueError("--lora-targets needs --lora RANK")
    workload = Workload(
        model,
        batch=args.batch or (1 if language_model else 32),
        size=size,
        precision=args.precision or ("bf16" if language_model else "fp32"),
        optimizer=args.optimizer,
        lora_rank=args.lora or 0,
        lora_targets=targets,
        num_classes=args.num_classes,
        lora_dropout=args.lora_dropout,
        qlora_recipe=args.qlora_recipe,
        loop=args.loop,
        loss=args.loss,
    )
    strategies = [parse_strategy(s) for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise ValueError("--strategies is empty: e.g. none,every-block")
    return workload, strategies


def run_estimate(args: argparse.Namespace) -> int:
    from tutorial_utils.estimate.card import parse_card

    card = parse_card(  # bad sizes end here, before torch loads
        args.card, args.reserve, args.gpu, args.expandable_segments
    )
    workload, strategies = estimate_workload(args)
    sharding = estimate_sharding(args, workload)
    from tutorial_utils.estimate.estimator import estimate, search_largest
    from tutorial_utils.estimate.report import estimate_table

    def progress(line: str) -> None:  # one write per line: forked searches share stderr
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    from tutorial_utils.estimate.building import import_model_libraries

    import_model_libraries(workload)  # apart from the dry runs' time
    print(f"building {workload.model} on the meta device...", file=sys.stderr, flush=True)
    result = estimate(workload, strategies, card, search=False, jobs=args.jobs, sharding=sharding)
    if not args.json:
        print(estimate_table(result), flush=True)
    if args.snapshot:
        write_snapshots(result, args.snapshot)
    if not args.no_search:
        print("\nsearching the largest size that fits (--no-search skips)...", file=sys.stderr)
        search_largest(result, progress=progress, jobs=args.jobs)
        if not args.json:
            print("\n" + estimate_table(result))
    if args.json:
        from tutorial_utils.estimate.record import estimate_record

        print(json.dumps(estimate_record(result), indent=2))
    return 0


def estimate_sharding(args: argparse.Namespace, workload):
    """``--gpus N --shard fsdp2|ddp`` as a ``sharded.Sharding`` (None: one GPU); ValueError if bad."""
    if not (args.gpus or args.shard):
        if args.reduce_dtype != "fp32":
            raise ValueError("--reduce-dtype is for --gpus N --shard fsdp2 with --precision amp-*")
        return None
    if args.gpus is None or args.shard is None:
        raise ValueError("--gpus and --shard go together: e.g. --gpus 8 --shard fsdp2")
    if args.reduce_dtype != "fp32" and not (
        args.shard == "fsdp2" and workload.precision.startswith("amp-")
    ):
        raise ValueError("--reduce-dtype is for --shard fsdp2 with --precision amp-*")
    from tutorial_utils.estimate.sharded import Sharding

    sharding = Sharding(args.gpus, args.shard, args.reduce_dtype)
    sharding.check(workload)
    print(f"predicting rank 0 of {args.gpus} on fake tensors...", file=sys.stderr, flush=True)
    return sharding


def write_snapshots(result, path: str) -> None:
    """``--snapshot``: each measured strategy's step, replayed, as a memory snapshot."""
    from pathlib import Path

    from tutorial_utils.estimate.snapshot import write_step_snapshot

    rows = [row for row in result.rows if row.report is not None]
    target = Path(path).expanduser()
    for row in rows:
        name = row.strategy.name.replace(" ", "-").replace("/", "-")
        file = target if len(rows) == 1 else target.with_stem(f"{target.stem}-{name}")
        written = write_step_snapshot(
            result.workload,
            row.strategy,
            result.card,
            file,
            model=result.model,
            sharding=result.sharding,
        )
        print(f"wrote {written} (open it at pytorch.org/memory_viz)", file=sys.stderr)


def run_train(args: argparse.Namespace) -> int:
    # torch comes in with these, after the arguments are known to be good
    from tutorial_utils.articles.experiments import BUILDERS
    from tutorial_utils.checkpointing.strategy import parse_strategy
    from tutorial_utils.measurement.devices import describe_device
    from tutorial_utils.training.loop import TrainingOptions, train_model

    profile = get_profile()
    experiment = BUILDERS[args.experiment](
        profile, parse_strategy(args.strategy), args.batch_size, args.image_size, args.data
    )
    print(f"profile={profile.name} device={describe_device()} experiment={experiment.name}")
    if experiment.synthetic_data:
        print(f"NOTE: generated data at {experiment.data_root} (the real dataset is absent)")
    history = train_model(
        experiment.model,
        experiment.loss_fn,
        experiment.optimizer,
        experiment.train_loader,
        experiment.val_loader,
        epochs=args.epochs or profile.epochs,
        strategy=experiment.strategy,
        options=TrainingOptions(
            checkpoint_dir=args.checkpoint_dir,
            keep_every_epoch=args.keep_every_epoch,
            progress=not args.no_progress,
            track_memory=True,
            label=f"{experiment.name} {args.strategy}",
        ),
    )
    summary = {
        "experiment": experiment.name,
        "profile": profile.name,
        "device": describe_device(),
        "strategy": args.strategy,
        "synthetic_data": experiment.synthetic_data,
        "epochs": history.as_rows(),
    }
    print(json.dumps(summary, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_sizes(parser, args)
    try:
        if args.command == "train":
            return run_train(args)
        if args.command == "estimate":
            return run_estimate(args)
        from tutorial_utils.bench import bench_main

        return bench_main(image_size=args.image_size, batch_size=args.batch_size)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
