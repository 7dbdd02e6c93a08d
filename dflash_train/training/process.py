"""The life of one `train` process around its training run: lock the run dir, install the
signal handlers, start the other ranks, open the stream, and end with exactly one run_end
whatever happens (completed, signal, error)."""

from __future__ import annotations

import faulthandler
import signal
import subprocess
import sys
import traceback
import uuid
from typing import Any

from dflash_train.config import TrainConfig
from dflash_train.pipeline.distributed import (
    RankInfo,
    RankPrefixedStream,
    rank_from_env,
    spawn_other_ranks,
)
from dflash_train.rundir import LockHeld, RunDir, RunLock, lock_is_held
from dflash_train.stream.summary_cache import KEPT_POINTS
from dflash_train.stream.writer import StatusWriter
from dflash_train.training.stop_flag import ORPHANED, StopDuringWarmUp, StopFlag

EXIT_LOCK_HELD = 3
EXIT_ORPHANED = 4


def _install_signal_handlers(stop: StopFlag) -> None:
    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        then = (
            "stopping the compile warm-up now (no step has run)"
            if stop.in_warm_up
            else "finishing the current step, then checkpoint"
        )
        print(f"{name} received: {then}", file=sys.stderr)
        stop.on_signal(name)  # raises StopDuringWarmUp while compiling before step one

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _install_crash_reports() -> None:
    """A native crash (a segfault or an abort inside a C extension) ends the process before
    any run_end: faulthandler then writes the crashing thread's Python stack to stderr, which
    is train.log under `launch`, and `status` shows it of the crashed run. SIGUSR1 writes
    every thread's stack there and the run goes on (a stalled run's where, without stopping
    it). A faulthandler already on (PYTHONFAULTHANDLER, pytest) keeps its own file."""
    try:
        if not faulthandler.is_enabled():
            faulthandler.enable(file=sys.stderr, all_threads=False)
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (OSError, ValueError, AttributeError):
        pass  # a stderr without a file descriptor: no report, the run itself is unchanged


def _train_argv() -> list[str]:
    """This process's train arguments, to start the other ranks with the same ones."""
    argv = sys.argv[1:]
    return argv[argv.index("train") + 1 :] if "train" in argv else argv


def train(config: TrainConfig) -> int:
    stop = StopFlag()
    _install_signal_handlers(stop)
    _install_crash_reports()
    rank = rank_from_env()
    run_dir = RunDir.at(config.train.output_dir)
    lock = RunLock(run_dir.lock)
    if rank is None or rank.is_main:
        try:
            lock.acquire()
        except LockHeld:
            print(
                f"dflash-train train: {run_dir.lock} is held: a trainer is running", file=sys.stderr
            )
            return EXIT_LOCK_HELD
    children: list[subprocess.Popen[bytes]] = []
    drafter_devices = config.pipeline.drafter_gpus or _default_devices()
    if rank is None and len(drafter_devices) > 1:
        # Started plainly with several drafter devices: this process becomes rank 0.
        children = spawn_other_ranks(_train_argv(), len(drafter_devices))
        rank = rank_from_env()
    rank = rank or RankInfo(0, 1, 0)
    if rank.world_size > 1:
        sys.stderr = RankPrefixedStream(sys.stderr, rank.rank)  # type: ignore[assignment]
    # The loader already took $DFLASH_RUN_ID (launch sets it) when no --run-id was given.
    run_id = config.run.run_id or uuid.uuid4().hex[:12]
    # The writer keeps the history summary current beside the stream: a console's first
    # attach to a days-old run reads only the stream's tail.
    writer = (
        StatusWriter(run_dir.status, run_id, summary_points=KEPT_POINTS) if rank.is_main else None
    )
    try:
        return _run_and_report(config, run_dir, run_id, writer, rank, stop)
    finally:
        _reap(children)
        if writer is not None:
            writer.close()
        # The lock is not released here: the kernel drops it when this process is gone, after
        # the interpreter and its CUDA contexts are torn down (seconds for a big drafter).
        # A run that reads "finished" has left its GPUs, so a launch right after it does not
        # find them busy.


def _reap(children: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    """The other ranks end at the same step as this one; one that hangs is killed."""
    for child in children:
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"rank process {child.pid} did not exit; killing it", file=sys.stderr)
            child.kill()
            child.wait()


def _default_devices() -> tuple[str, ...]:
    import torch

    return ("cuda:0",) if torch.cuda.is_available() else ("cpu",)


def _run_and_report(
    config: TrainConfig,
    run_dir: RunDir,
    run_id: str,
    writer: StatusWriter | None,
    rank: RankInfo,
    stop: StopFlag,
) -> int:
    from dflash_train.training.run import TrainingRun

    run: TrainingRun | None = None
    setting_up = True
    try:
        run = TrainingRun(config, run_dir, run_id, writer, rank, stop)
        run.setup()
        setting_up = False
        reason = run.loop()
    except StopDuringWarmUp:
        # Stopped while compiling, before any step: nothing to checkpoint, so it ends now.
        print("stopped before the first step, during the compile warm-up", file=sys.stderr)
        assert run is not None
        run.shutdown()
        reason = "signal"
    except BaseException as exc:
        tail = traceback.format_exc().strip().splitlines()[-20:]
        if setting_up and isinstance(exc, ValueError):
            # Bad input found while setting up (a data dir, the target, a resume point, the
            # held-out set): its one line names it, as for a refused argument; the traceback
            # stays in the run_end's error_tail.
            print(f"dflash-train train: {exc}", file=sys.stderr)
        else:
            print("\n".join(tail), file=sys.stderr)
        if run is not None:
            run.shutdown()
        if stop.reason == ORPHANED:  # e.g. the checkpoint in flight lost its folder
            print(f"exiting: {stop.message}; no run_end written", file=sys.stderr)
            return EXIT_ORPHANED
        if writer is not None:
            writer.write(
                "run_end",
                reason="error",
                exit_code=1,
                error_tail="\n".join(tail),
                error=f"{type(exc).__name__}: {exc}"[:500],
            )
        return 1
    if reason == ORPHANED:
        print(f"exiting: {stop.message}; no checkpoint and no run_end written", file=sys.stderr)
        return EXIT_ORPHANED
    code = 1 if reason == "error" else 0
    if writer is not None:
        fields: dict[str, Any] = {"reason": reason, "exit_code": code, "step": run.progress.step}
        if reason == "error":
            fields["error_tail"] = stop.message
        elif reason == "signal" and lock_is_held(run_dir.restart_lock):
            fields["restarting"] = True  # stopped by a restart: its next trainer follows
        writer.write("run_end", **fields)
    print(f"run_end: {reason} at step {run.progress.step}", file=sys.stderr)
    return code
