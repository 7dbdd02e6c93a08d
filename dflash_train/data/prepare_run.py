"""A prepare under the control plane (`--run-dir`, set by `launch --prepare`): it holds the run
dir's lock, writes `run_start` (mode "prepare"), `prepare` progress lines and `gpu` lines
(per-GPU load) to the status stream, and ends with exactly one `run_end` whatever happens,
so `status`, `stop`, `tail` and the console treat it as they treat a training run."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash_train.config.environment import run_id_override
from dflash_train.config.prepare_config import PrepareConfig, PrepareError, PrepareStopped
from dflash_train.rundir import LockHeld, RunDir, RunLock
from dflash_train.stream.beat import Beat
from dflash_train.stream.writer import StatusWriter

MODE = "prepare"
GPU_EVERY_S = 5.0


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT: a `stop`. The finished chunks stay."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum: int, _frame: Any) -> None:
    raise Stopped(signum)


def stoppable(body: Callable[[], dict[str, Any]], work_root: Path) -> dict[str, Any]:
    """A plain `dflash-train prepare` answers SIGTERM and SIGINT as a launched one does: the
    workers are ended, the finished chunks stay, and the reply says how to go on (it used to
    die without a reply). Signal handlers only exist in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return body()
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return body()
    except Stopped as exc:
        raise PrepareStopped(
            f"prepare stopped by {exc.args[0]}; the finished chunks stay in {work_root}: "
            "run it again with the same arguments to resume",
            exc.signum,
        ) from None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_under_control(
    config: PrepareConfig,
    devices: tuple[str, ...],
    body: Callable[[StatusWriter], dict[str, Any]],
) -> dict[str, Any]:
    assert config.run_dir is not None
    run_dir = RunDir.at(config.run_dir)
    lock = RunLock(run_dir.lock)
    try:
        lock.acquire()
    except LockHeld:
        raise PrepareError(f"run-dir: {run_dir.lock} is held: a run is in progress") from None
    run_id = run_id_override() or uuid.uuid4().hex[:12]
    writer = StatusWriter(run_dir.status, run_id)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    # Every GPU_EVERY_S the GPUs' load, and a heartbeat when nothing else was written for
    # that long (a CPU batch can take minutes between progress lines).
    roles = {int(d.split(":")[1]): "prepare" for d in devices if d.startswith("cuda:")}
    beat = Beat(writer, roles, GPU_EVERY_S, name="prepare-beat")
    try:
        writer.write(
            "run_start",
            mode=MODE,
            config=config.to_record(),
            topology={"devices": list(devices)},
            dataset={"out": str(config.out.absolute()), "prompts": list(config.prompt_specs)},
            batches_per_epoch=0,
            total_steps=0,
            pid=os.getpid(),
            host=socket.gethostname(),
        )
        beat.start()
        try:
            info = body(writer)
        except Stopped as exc:
            print(f"{exc.args[0]} received: the finished chunks stay for a resume", file=sys.stderr)
            writer.write("run_end", reason="signal", exit_code=0, mode=MODE)
            raise PrepareStopped(
                f"prepare stopped by {exc.args[0]}; run it again to resume", exc.signum
            ) from None
        except BaseException as exc:
            tail = traceback.format_exc().strip().splitlines()[-20:]
            writer.write(
                "run_end",
                reason="error",
                exit_code=1,
                mode=MODE,
                error=f"{type(exc).__name__}: {exc}"[:500],
                error_tail="\n".join(tail),
            )
            raise
        writer.write(
            "run_end",
            reason="completed",
            exit_code=0,
            mode=MODE,
            samples=info["stats"]["samples"],
            # A prepare cut by --max-seconds also completes: what it left is said here.
            unanswered=info["unanswered"],
            answer_tokens_per_s=info["answer_tokens_per_s"],
        )
    finally:
        beat.stop()
        writer.close()
    if config.then_train:
        _become_the_trainer(run_dir)
    return info


def _become_the_trainer(run_dir: RunDir) -> None:
    """The data is complete: this process (run.json's pid, its process group, $DFLASH_RUN_ID)
    becomes the trainer of the config launch recorded. The run lock's descriptor closes on
    exec; the trainer takes the lock again as it starts."""
    argv = [sys.executable, "-m", "dflash_train", "train", "--output-dir", str(run_dir.root)]
    argv += ["--config", str(run_dir.config)]
    print("prepare complete: starting the training run", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(sys.executable, argv)
