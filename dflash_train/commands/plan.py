"""`dflash-train plan`: the best targets:drafters split of N GPUs, from the two stage rates of
one GPU each, which come from one of three places: measured on this box by a short
calibration run of the recipe after `--` (`--measure`, pipeline/stage_calibration.py), a
run's stream (`--from RUN_DIR`), or given (`--target-ktok-s`, `--drafter-ktok-s`). One JSON
reply with the predicted Ktok/s and each stage's utilisation per split, and the run's own
placement predicted (devices shared or not); `--table` prints the same as a table."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from dflash_train import protocol
from dflash_train.pipeline import split_plan


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, required=True, help="GPUs to split (2 or more)")
    parser.add_argument("--target-model", default=None, help="the target the rates are for")
    parser.add_argument("--from", dest="run_dir", default=None, help="read rates from RUN_DIR")
    parser.add_argument("--target-ktok-s", type=float, default=None, help="one target replica")
    parser.add_argument("--drafter-ktok-s", type=float, default=None, help="one drafter rank")
    parser.add_argument(
        "--measure",
        action="store_true",
        help="measure both rates here: a short calibration run of the train args after --",
    )
    parser.add_argument(
        "--measure-seconds",
        type=float,
        default=90.0,
        help="seconds of steady training the calibration times, after its compile (default 90)",
    )
    parser.add_argument(
        "--measure-dir",
        default=None,
        metavar="DIR",
        help="keep the calibration run here (default: a temporary dir, removed after)",
    )
    parser.add_argument("--table", action="store_true", help="a table instead of JSON")
    parser.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="-- TRAIN_ARGS", help="with --measure: train's"
    )


def _refuse(message: str, code: str = "bad_argument") -> int:
    from dflash_train.commands.launch import print_reply

    print_reply(protocol.reply_error("plan", code, message))
    return 2


def _train_args(args: argparse.Namespace) -> list[str]:
    rest = list(args.rest)
    if rest and rest[0] == "--":
        rest = rest[1:]
    given = {word.split("=", 1)[0] for word in rest}
    if args.target_model is not None and "--target-model" not in given:
        rest += ["--target-model", args.target_model]
    return rest


def _measured(args: argparse.Namespace) -> tuple[split_plan.StageRates, dict[str, object]]:
    """The rates a calibration run measured and its record; raises CalibrationError."""
    import torch

    from dflash_train.pipeline import stage_calibration as calibration

    train_args = _train_args(args)
    if not train_args:
        raise calibration.CalibrationError(
            "measure: give the recipe to time after -- (train's arguments)", "bad_argument"
        )
    if args.measure_seconds <= 0:
        raise calibration.CalibrationError(
            f"measure_seconds: {args.measure_seconds:g} must be above 0", "bad_argument"
        )
    where = calibration.placement(train_args, torch.cuda.device_count())
    keep = args.measure_dir is not None
    if keep and Path(args.measure_dir).exists() and any(Path(args.measure_dir).iterdir()):
        raise calibration.CalibrationError(
            f"measure_dir: {args.measure_dir} is not empty (a calibration writes a new run)",
            "bad_argument",
        )
    run_dir = Path(args.measure_dir) if keep else Path(tempfile.mkdtemp(prefix="dflash-plan-"))
    try:
        done = calibration.measure(
            train_args, run_dir, where, measure_seconds=args.measure_seconds,
            say=lambda text: print(f"plan: {text}", file=sys.stderr, flush=True),
        )  # fmt: skip
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    return done.rates, done.record() | ({"run_dir": str(run_dir)} if keep else {})


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.rundir import RunDir

    given = (args.target_ktok_s, args.drafter_ktok_s)
    if args.gpus < 2:
        return _refuse(f"gpus: {args.gpus} leaves no GPU for one of the two stages (need 2+)")
    sources = [args.measure, args.run_dir is not None, any(v is not None for v in given)]
    if sum(sources) > 1:
        return _refuse("rates: give one of --measure, --from RUN_DIR or the two rates")
    if args.rest and not args.measure:
        given = shlex.join(args.rest[1:] if args.rest[:1] == ["--"] else args.rest)
        return _refuse(f"measure: train args after -- ({given}) are for --measure only")
    current = None
    measured = None
    if args.measure:
        from dflash_train.pipeline.stage_calibration import CalibrationError

        try:
            rates, measured = _measured(args)
        except CalibrationError as exc:
            return _refuse(str(exc), exc.code)
    elif args.run_dir is not None:
        status = RunDir.at(args.run_dir).status
        if not Path(status).is_file():
            return _refuse(f"from: {status} does not exist")
        lines = split_plan.read_stream(Path(status))
        try:
            rates = split_plan.rates_from_lines(lines)
        except ValueError as exc:
            return _refuse(f"from: {exc}")
        start = [line for line in lines if line.kind == "run_start"][-1]
        topology = start["topology"]
        current = (topology["target"], topology["drafter"])
        model = start["config"].get("target_model")
        if args.target_model is not None and model != args.target_model:
            note = f"the run trained {model}, not {args.target_model}"
            rates = split_plan.StageRates(
                rates.target_ktok_s, rates.drafter_ktok_s, rates.source, (*rates.notes, note)
            )
    elif all(v is not None for v in given):
        for name, value in (
            ("target_ktok_s", args.target_ktok_s),
            ("drafter_ktok_s", args.drafter_ktok_s),
        ):
            if value <= 0:
                return _refuse(f"{name}: {value:g} must be above 0")
        rates = split_plan.StageRates(args.target_ktok_s, args.drafter_ktok_s, "given")
    else:
        return _refuse(
            "rates: give --measure -- TRAIN_ARGS, --from RUN_DIR or both --target-ktok-s and "
            "--drafter-ktok-s (one GPU each)"
        )
    record = split_plan.plan_record(rates, args.gpus, current)
    if measured is not None:
        record["measured"] = measured
    if args.target_model is not None:
        record["target_model"] = args.target_model
    if args.table:
        print(split_plan.table(record))
        return 0
    print_reply(protocol.reply_ok("plan", **record))
    return 0
