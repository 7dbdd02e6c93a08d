"""`dflash-train plan --measure`: the two stage rates measured on this box by a short
calibration run of the user's own recipe (the real target, data, drafter and compile), not by
a separate benchmark that could drift from what `train` does. The run is `dflash-train train`
with one target replica and one drafter rank; its `profile` lines hold each stage's time per
batch, which split_plan reads as for `plan --from`. It is stopped (SIGTERM: the step ends, its
checkpoint is written) once enough profile lines after the first (compile and warm-up) are in.

Placement: the user's first target and first drafter device when the recipe names them, else
GPUs 0 and 1 when the box has two (each stage alone on its GPU, exactly as a split runs it),
else the one device for both in the sync pipeline, where the stages take turns and each one's
time is still its own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dflash_train import protocol
from dflash_train.config.cli_options import resolve_train_args
from dflash_train.config.environment import inherited_with
from dflash_train.config.train_config import ConfigError
from dflash_train.pipeline import split_plan
from dflash_train.stream.follower import StreamFollower

# What the calibration sets itself, so a recipe that names them is refused in one line.
OWNED = ("--output-dir", "--resume-from", "--run-id")
STOP_WAIT_S = 300.0  # a SIGTERM's checkpoint write, then SIGKILL
POLL_S = 0.5
# What stops plan while it calibrates: Ctrl-C, a `kill`, a dropped SSH session.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CalibrationError(ValueError):
    """One line that names what stopped the measurement; `code` is the reply's error_code:
    bad_train_args before the calibration starts, measure_failed once it ran."""

    def __init__(self, message: str, code: str = "bad_train_args") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Placement:
    target: str
    drafter: str
    pipeline: str
    why: str

    def argv(self) -> list[str]:
        return [
            *("--target-gpus", _flag_device(self.target)),
            *("--drafter-gpus", _flag_device(self.drafter)),
            *("--pipeline", self.pipeline),
        ]


@dataclass(frozen=True)
class Calibration:
    rates: split_plan.StageRates
    placement: Placement
    run_dir: Path
    steps: int
    seconds: float
    exit_code: int | None  # None: the calibration stopped it, as planned

    def record(self) -> dict[str, object]:
        return {
            "target_device": self.placement.target,
            "drafter_device": self.placement.drafter,
            "pipeline": self.placement.pipeline,
            "placement": self.placement.why,
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "train_exit": self.exit_code,
        }


def _flag_device(device: str) -> str:
    return device.removeprefix("cuda:")


def placement(train_args: Sequence[str], cuda_devices: int) -> Placement:
    """Where the calibration runs the two stages; raises CalibrationError for train args
    that `train` would refuse, or that name what the calibration sets itself."""
    for word in train_args:
        if word.split("=", 1)[0] in OWNED:
            raise CalibrationError(
                f"{word.split('=', 1)[0]}: set by plan --measure for its calibration run"
            )
    try:
        config = resolve_train_args(train_args, output_dir="plan-calibration").config
    except ConfigError as exc:
        raise CalibrationError(f"train args: {exc}") from None
    targets, drafters = config.pipeline.target_gpus, config.pipeline.drafter_gpus
    if drafters or targets:
        drafter = (drafters or targets or ("cpu",))[0]
        target = (targets or drafters or ("cpu",))[0]
        why = "the recipe's first target and drafter devices"
    elif cuda_devices >= 2:
        target, drafter, why = "cuda:0", "cuda:1", "one GPU each (the box has two or more)"
    elif cuda_devices == 1:
        target = drafter = "cuda:0"
        why = "the one GPU for both, stages taking turns"
    else:
        target = drafter = "cpu"
        why = "the CPU for both, stages taking turns (no GPU)"
    pipeline = "sync" if target == drafter else config.pipeline.pipeline
    return Placement(target, drafter, pipeline, why)


def calibration_argv(
    train_args: Sequence[str], run_dir: Path, where: Placement, profile_interval: float
) -> list[str]:
    """`train` with the recipe, then what the calibration sets (later flags win): its run
    dir, its placement, no held-out evaluation, checkpoints only at the end."""
    return [
        sys.executable, "-m", "dflash_train", "train", *train_args,
        "--output-dir", str(run_dir), *where.argv(), "--eval-every", "0", "--save-every", "0",
        "--profile-interval", f"{profile_interval:g}",
    ]  # fmt: skip


def _usable(line: protocol.StatusLine) -> bool:
    """A profile line that times both stages (what rates_from_lines reads)."""
    stages = line["stages_ms"] if line.kind == "profile" else {}
    return bool(stages.get(split_plan.TARGET_STAGE) and stages.get(split_plan.DRAFTER_STAGES[0]))


def _wait_for_profiles(
    proc: subprocess.Popen[bytes],
    status: Path,
    profiles: int,
    deadline: float,
    say: Callable[[str], None],
) -> int | None:
    """Until `profiles` usable profile lines follow the first, the trainer ends (its exit
    code) or the deadline passes (None either way but the second)."""
    follower = StreamFollower(status)  # reads only what is new at each look
    usable = 0
    try:
        while True:
            code = proc.poll()
            lines = [protocol.decode_line(raw) for raw in follower.poll()]
            more = sum(isinstance(line, protocol.StatusLine) and _usable(line) for line in lines)
            usable += more
            if more and usable > 1:  # the first (compile, warm-up) is left out
                say(f"calibrating: {usable - 1} of {profiles} profile lines")
            if usable > profiles or code is not None:
                return code
            if time.monotonic() > deadline:
                say("calibrating: its time limit passed, stopping")
                return None
            time.sleep(POLL_S)
    finally:
        follower.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the calibration's process group (the trainer ends its step and writes its
    checkpoint), SIGKILL if it has not ended after STOP_WAIT_S or a second signal asks."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except (subprocess.TimeoutExpired, _Stopped):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class _Stopped(Exception):
    pass


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """STOP_SIGNALS raise _Stopped in the main thread while the calibration runs, so its
    `finally` stops the trainer, which runs in its own session and would otherwise train on
    alone; the old handlers come back after."""

    def raise_stopped(signum: int, _frame: object) -> None:
        raise _Stopped(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, raise_stopped) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _why(lines: Sequence[protocol.StatusLine], exc: ValueError, log: Path) -> str:
    """The trainer's own error (its run_end's), else why its stream gave no rates and the
    last line of its train.log."""
    errors = [line.get("error") for line in lines if line.kind == "run_end"]
    if errors and errors[-1]:
        return str(errors[-1])
    return f"{exc}; its train.log ends: {_last_log_line(log)}"


def _last_log_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no train.log"
    return lines[-1].strip() if lines else "train.log is empty"


def measure(
    train_args: Sequence[str],
    run_dir: Path,
    where: Placement,
    *,
    measure_seconds: float,
    profiles: int = 3,
    timeout: float = 3600.0,
    say: Callable[[str], None] = lambda _: None,
) -> Calibration:
    """Run the calibration until `profiles` profile lines follow the first (each covering
    measure_seconds / profiles of training), the trainer ends, or `timeout` passes; the
    rates of its stream. Raises CalibrationError when it gave no rates."""
    interval = max(0.5, measure_seconds / profiles)
    argv = calibration_argv(train_args, run_dir, where, interval)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "train.log"
    # A calibration is no run to log to W&B (its name would clutter the project).
    env = inherited_with({"WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"})
    status = run_dir / "status.jsonl"
    start = time.monotonic()
    with _stopped_by_signals():
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        say(
            f"calibrating in {run_dir}: starting (the first profile line, compile and "
            "warm-up, is left out)"
        )
        try:
            code = _wait_for_profiles(proc, status, profiles, start + timeout, say)
        except _Stopped as exc:
            raise CalibrationError(
                f"measure: plan was stopped ({exc}), and its calibration run with it",
                "measure_failed",
            ) from None
        finally:
            _stop(proc)
    seconds = time.monotonic() - start
    lines = split_plan.read_stream(status) if status.is_file() else []
    try:
        rates = split_plan.rates_from_lines(lines)
    except ValueError as exc:
        ended = f"exited with code {code}" if code is not None else "was stopped"
        raise CalibrationError(
            f"measure: the calibration run {ended} before its stage rates: {_why(lines, exc, log)}",
            "measure_failed",
        ) from None
    steps = max((int(line["step"]) for line in lines if line.kind == "step"), default=0)
    return Calibration(rates, where, run_dir, steps, seconds, code)
