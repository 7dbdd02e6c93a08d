"""A stop while the trainer compiles before its first step ends the run at once. On an H100
an fp8 launch compiled for minutes; `stop` sent SIGTERM to its process group, which killed the
compiler's `ptxas` child, and the trainer then fell back to eager layers and went on setting up
while `stop` waited out its timeout for SIGKILL. The real trainer runs here in its own process
group with its compile held as a GPU's would hold it: one compiler child after another, each
of which the group's SIGTERM kills too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from train_process import status_lines, train_argv, train_env, trainer_with_warm_up, wait_for

# The warm-up runs compiler children until it is stopped.
ENDLESS_COMPILE = trainer_with_warm_up("""
def compile(**kwargs):
    print("warm-up: compiling", file=sys.stderr, flush=True)
    while True:  # a kernel at a time, as inductor runs ptxas; killed ones are retried
        subprocess.run(["sleep", "600"])
""")


def test_a_stop_during_the_compile_warm_up_ends_the_run_at_once(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str
) -> None:
    run_dir = tmp_path / "run"
    argv = train_argv(smollm2_spec, prepared_data_dir, run_dir, "--max-steps", "2")
    log = tmp_path / "train.log"
    with log.open("ab") as fh:
        # Its own process group, as `launch` starts a trainer; `stop` signals the group.
        proc = subprocess.Popen(
            [sys.executable, "-c", ENDLESS_COMPILE, str(run_dir), *argv[3:]],
            env=train_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(run_dir, lambda line: line.kind == "heartbeat", proc, log)
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=120)  # without the fix it never ends: the compile goes on
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "SIGTERM received: stopping the compile warm-up now (no step has run)" in text
    assert "stopped before the first step, during the compile warm-up" in text
    lines = status_lines(run_dir)
    assert not [line for line in lines if line.kind == "step"]
    assert not [line for line in lines if line.fields.get("code") == "compile_failed"]
    end = lines[-1]
    assert end.kind == "run_end", [line.kind for line in lines]
    assert (end.fields["reason"], end.fields["exit_code"], end.fields["step"]) == ("signal", 0, 0)
    assert not (run_dir / "checkpoints").exists() or not any(
        (run_dir / "checkpoints").rglob("step_*")
    )


def test_the_stop_flag_raises_only_in_the_warm_up_and_never_inside_a_write() -> None:
    from dflash_train.training.stop_flag import StopDuringWarmUp, StopFlag

    outside = StopFlag()
    outside.on_signal("SIGTERM")  # in the loop: asks, the step finishes
    assert outside.is_set() and outside.reason == "signal"
    # Asked before the warm-up: it ends on entry.
    with pytest.raises(StopDuringWarmUp), outside.interruptible():
        pass

    stop = StopFlag()
    with pytest.raises(StopDuringWarmUp), stop.interruptible():
        assert stop.in_warm_up
        with stop.uninterruptible():
            stop.on_signal("SIGTERM")  # mid-write: the line lands first
            assert not stop.in_warm_up
        pytest.fail("the stop should have been raised when the write ended")
    assert not stop.in_warm_up
    stop.on_signal("SIGTERM")  # a second signal while it unwinds only asks

    errored = StopFlag()
    errored.request("error", "the monitor found a fatal problem")
    with errored.interruptible():
        errored.on_signal("SIGTERM")  # the earlier reason keeps its course
    assert errored.reason == "error"
