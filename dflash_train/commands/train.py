"""`dflash-train train`: train a DFlash drafter in the foreground (the process `launch`
starts). Arguments are checked here, before anything heavy is imported."""

from __future__ import annotations

import argparse
import sys

from dflash_train import protocol


def device_list(text: str) -> list[str]:
    """`cpu`, `cpu,cpu`, `0,1`, `cuda:0` → torch device strings ("cpu", "cuda:N")."""
    devices = []
    for part in (p.strip() for p in text.split(",")):
        if part == "cpu":
            devices.append("cpu")
        elif part.isdigit():
            devices.append(f"cuda:{int(part)}")
        elif part.startswith("cuda:") and part[5:].isdigit():
            devices.append(f"cuda:{int(part[5:])}")
        else:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a device (use cpu, a GPU index, or a comma-separated list)"
            )
    return devices


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    req = parser.add_argument_group("what to train")
    req.add_argument("--target-model", required=True, help="HF dir, smollm2, or random:<preset>")
    req.add_argument("--data-dir", required=True, help="dataset written by `prepare`")
    req.add_argument("--output-dir", required=True, help="the run directory")
    run = parser.add_argument_group("run")
    run.add_argument("--run-id", default=None, help="default: $DFLASH_RUN_ID or a fresh id")
    run.add_argument("--resume-from", default=None, metavar="PATH|latest")
    run.add_argument("--pipeline", choices=("sync", "async"), default="async")
    run.add_argument(
        "--target-gpus",
        type=device_list,
        default=None,
        metavar="cpu|0,1,...",
        help="one target replica and worker per entry (default: the drafter devices)",
    )
    run.add_argument(
        "--drafter-gpus",
        type=device_list,
        default=None,
        metavar="cpu|5,6,...",
        help="one rank per entry, DDP when several (default: GPU 0, else cpu)",
    )
    run.add_argument(
        "--hs-queue-depth", type=_positive, default=None, help="default 8 (live setting)"
    )
    run.add_argument("--hs-min-ready", type=_positive, default=None, help="default 2 (live)")
    run.add_argument("--save-every", type=_non_negative, default=500, help="0: epoch ends only")
    run.add_argument("--keep-checkpoints", type=_positive, default=3)
    run.add_argument("--max-bad-steps", type=_positive, default=20)
    run.add_argument("--wandb-project", default=None)
    run.add_argument("--log-every", type=_positive, default=1)
    opt = parser.add_argument_group("optimisation")
    opt.add_argument("--epochs", type=_positive, default=6)
    opt.add_argument("--max-steps", type=_positive, default=None)
    opt.add_argument("--lr", type=float, default=6e-4)
    opt.add_argument("--warmup-ratio", type=float, default=0.04)
    opt.add_argument("--weight-decay", type=float, default=0.01)
    opt.add_argument("--grad-clip", type=float, default=1.0)
    opt.add_argument("--seed", type=int, default=0)
    model = parser.add_argument_group("drafter and data")
    model.add_argument("--block-size", type=_positive, default=16)
    model.add_argument("--num-anchors", type=_positive, default=512)
    model.add_argument("--draft-layers", type=_positive, default=5)
    model.add_argument(
        "--target-layers",
        type=_positive,
        default=None,
        help="k context layers (default 5, fewer when the target is too shallow)",
    )
    model.add_argument("--max-length", type=_positive, default=2048)
    model.add_argument("--tokens-per-batch", type=_positive, default=16384)
    model.add_argument("--num-buckets", type=_positive, default=8)


def check_args(args: argparse.Namespace) -> str | None:
    """The cross-field checks argparse cannot do; a one-line reason or None."""
    if args.block_size < 2:
        return "--block-size: must be at least 2 (slot 0 is the anchor)"
    if not 0.0 <= args.warmup_ratio < 1.0:
        return f"--warmup-ratio: {args.warmup_ratio} is outside 0..1"
    if args.lr <= 0:
        return f"--lr: must be positive, got {args.lr}"
    try:
        protocol.validate_settings(settings_from_args(args), {})
    except protocol.SettingError as exc:
        return str(exc)
    return None


def settings_from_args(args: argparse.Namespace) -> dict[str, int]:
    given = {"hs_queue_depth": args.hs_queue_depth, "hs_min_ready": args.hs_min_ready}
    return {**protocol.DEFAULT_SETTINGS, **{k: v for k, v in given.items() if v is not None}}


def run(args: argparse.Namespace) -> int:
    problem = check_args(args)
    if problem is not None:
        print(f"dflash-train train: {problem}", file=sys.stderr)
        return 2
    from dflash_train.trainer import train

    return train(args)
