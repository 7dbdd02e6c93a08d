"""A trainer that dies inside native code writes no run_end: its train.log must then say
where. Session 32 saw a GPU trainer end at its timeout's SIGTERM with no run_end, no
checkpoint and nothing in its log. The training process installs faulthandler, so a native
crash leaves the crashing thread's Python stack, which `status` shows of the crashed run,
and SIGUSR1 writes every thread's stack while the run goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from train_process import (
    start_train,
    status_lines,
    train_argv,
    train_env,
    trainer_with_warm_up,
    wait_for,
)

from dflash_train.control.run_status import log_tail
from tests.control.control_harness import cli

# A native crash mid-run: a read of address 0 from the compile warm-up, after run_start.
SEGFAULT_IN_WARM_UP = trainer_with_warm_up("""
def compile(**kwargs):
    import ctypes
    time.sleep(0.5)  # the warm-up's beat has run: the run has started
    ctypes.string_at(0)
""")


def _wait_for_text(log: Path, text: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def test_a_native_crash_leaves_its_stack_in_train_log_and_status_shows_it(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = run_dir / "train.log"  # where `launch` sends a trainer's output
    argv = train_argv(smollm2_spec, prepared_data_dir, run_dir, "--max-steps", "2")
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", SEGFAULT_IN_WARM_UP, str(run_dir), *argv[3:]],
            env=train_env(), stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    assert proc.wait(timeout=240) == -signal.SIGSEGV, log.read_text()[-3000:]
    assert status_lines(run_dir)[0].kind == "run_start"
    assert not [line for line in status_lines(run_dir) if line.kind == "run_end"]
    text = log.read_text(errors="replace")
    assert "Fatal Python error: Segmentation fault" in text, text[-3000:]
    _, reply = cli("status", str(run_dir))
    status = reply.data
    assert status["state"] == "crashed", status
    tail = status["log_tail"]
    assert isinstance(tail, list)
    # The report's head and its innermost frames, not its last lines (the outer frames).
    assert tail[0] == "Fatal Python error: Segmentation fault", tail
    assert any(line.strip().endswith("in compile") for line in tail), tail


def test_sigusr1_writes_every_threads_stack_and_the_run_goes_on(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = run_dir / "train.log"
    argv = train_argv(
        smollm2_spec, prepared_data_dir, run_dir, "--max-steps", "100000", "--log-every", "1"
    )
    proc = start_train(argv, log)
    try:
        wait_for(run_dir, lambda line: line.kind == "step", proc, log)
        proc.send_signal(signal.SIGUSR1)
        _wait_for_text(log, "(most recent call first)", proc)
        dumped_at = max(line["step"] for line in status_lines(run_dir) if line.kind == "step")
        wait_for(run_dir, lambda line: line.kind == "step" and line["step"] > dumped_at, proc, log)
        assert proc.poll() is None  # the dump stopped nothing
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert text.count("(most recent call first)") > 1, text[-3000:]  # more than one thread
    assert "Fatal Python error" not in text
    assert status_lines(run_dir)[-1].fields["reason"] == "signal"


def test_the_tail_reads_a_crash_report_from_its_head_only_when_it_ends_the_log(
    tmp_path: Path,
) -> None:
    report = [
        "step 3/10  loss 5.1",
        "Fatal Python error: Segmentation fault",
        "",
        "Current thread 0x00007f (most recent call first):",
        *[f'  File "layer{i}.py", line {i} in frame{i}' for i in range(60)],
        "",
        "Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)",
    ]
    log = tmp_path / "train.log"
    log.write_text("\n".join(report) + "\n")
    assert log_tail(log, 5) == report[1:6]
    # The same report followed by a later trainer's lines: the newest lines, as before.
    later = ["resumed from step 3", "Traceback (most recent call last):", "ValueError: bad"]
    log.write_text("\n".join(report + later) + "\n")
    assert log_tail(log, 3) == later
    assert os.path.getsize(log) < 512 * 30  # all of it inside the window log_tail reads
