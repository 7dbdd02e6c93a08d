"""`dflash-train plan`: the best targets:drafters split of N GPUs, from the stage rates a
run's stream holds (`--from RUN_DIR`) or from rates given (`--target-ktok-s`,
`--drafter-ktok-s`, one GPU each: bench/target_stage.py and bench/speed_suite.py measure
them). One JSON reply with the predicted Ktok/s and each stage's utilisation per split;
`--table` prints the same as a table."""

from __future__ import annotations

import argparse
from pathlib import Path

from dflash_train import protocol


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, required=True, help="GPUs to split (2 or more)")
    parser.add_argument("--target-model", default=None, help="the target the rates are for")
    parser.add_argument("--from", dest="run_dir", default=None, help="read rates from RUN_DIR")
    parser.add_argument("--target-ktok-s", type=float, default=None, help="one target replica")
    parser.add_argument("--drafter-ktok-s", type=float, default=None, help="one drafter rank")
    parser.add_argument("--table", action="store_true", help="a table instead of JSON")


def _refuse(message: str) -> int:
    from dflash_train.commands.launch import print_reply

    print_reply(protocol.reply_error("plan", "bad_argument", message))
    return 2


def run(args: argparse.Namespace) -> int:
    from dflash_train.commands.launch import print_reply
    from dflash_train.pipeline import split_plan
    from dflash_train.rundir import RunDir

    given = (args.target_ktok_s, args.drafter_ktok_s)
    if args.gpus < 2:
        return _refuse(f"gpus: {args.gpus} leaves no GPU for one of the two stages (need 2+)")
    current = None
    if args.run_dir is not None:
        if any(v is not None for v in given):
            return _refuse("rates: give --from RUN_DIR or the two rates, not both")
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
        current = (len(topology["target"]), len(topology["drafter"]))
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
            "rates: give --from RUN_DIR or both --target-ktok-s and --drafter-ktok-s (one GPU "
            "each; bench/target_stage.py and bench/speed_suite.py measure them)"
        )
    record = split_plan.plan_record(rates, args.gpus, current)
    if args.target_model is not None:
        record["target_model"] = args.target_model
    if args.table:
        print(split_plan.table(record))
        return 0
    print_reply(protocol.reply_ok("plan", **record))
    return 0
