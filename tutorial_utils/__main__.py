"""Command line: ``python -m tutorial_utils train|bench``, the notebooks' experiments headless."""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from tutorial_utils.articles.profiles import PROFILES, get_profile

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
        "--segments",
        type=int,
        default=0,
        help="checkpoint segments: vgg16-dogcat 0..10 (0/1 = none, 2 = the article); "
        "neta-cifar10 0 or 5 (the article's five checkpointed segments)",
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
    return parser


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
    runs_vgg16 = args.command == "bench" or args.experiment == "vgg16-dogcat"
    if runs_vgg16 and args.image_size is not None and args.image_size < MIN_VGG16_IMAGE_SIZE:
        parser.error(
            f"--image-size must be at least {MIN_VGG16_IMAGE_SIZE} for VGG16 (it halves the image "
            f"five times), got {args.image_size}"
        )


def run_train(args: argparse.Namespace) -> int:
    # torch comes in with these, after the arguments are known to be good
    from tutorial_utils.articles.experiments import BUILDERS
    from tutorial_utils.measurement.devices import describe_device
    from tutorial_utils.training.loop import train_model

    profile = get_profile()
    experiment = BUILDERS[args.experiment](
        profile, args.segments, args.batch_size, args.image_size, args.data
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
        segments=experiment.segments,
        checkpoint_dir=args.checkpoint_dir,
        keep_every_epoch=args.keep_every_epoch,
        progress=not args.no_progress,
        track_memory=True,
        label=f"{experiment.name} segments={args.segments}",
    )
    summary = {
        "experiment": experiment.name,
        "profile": profile.name,
        "device": describe_device(),
        "segments": args.segments,
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
        from tutorial_utils.bench import bench_main

        return bench_main(image_size=args.image_size, batch_size=args.batch_size)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
