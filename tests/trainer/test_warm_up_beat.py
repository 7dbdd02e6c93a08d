"""The stream stays alive while the trainer compiles before its first step. The monitor
thread starts with the training loop; on the H200 a warm-up of 135 s wrote nothing after
run_start and `status` called the launch stalled. The real trainer runs here in its own
process, its warm-up held (as a GPU's compile holds it) until the stream has beaten."""

from __future__ import annotations

import sys
from pathlib import Path

from train_process import run_train, status_lines, train_argv, trainer_with_warm_up

from dflash_train.stream.beat import Beat
from dflash_train.stream.writer import StatusWriter

# The warm-up held until a heartbeat is in the stream (60 s at most).
HELD_WARM_UP = trainer_with_warm_up("""
def compile(**kwargs):
    stream = Path(sys.argv[1]) / "status.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if stream.exists() and b'"kind":"heartbeat"' in stream.read_bytes():
            print("warm-up: the stream beat", file=sys.stderr)
            break
        time.sleep(0.05)
    return real_compile(**kwargs)
""")


def test_the_stream_beats_while_the_trainer_compiles_before_its_first_step(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str
) -> None:
    run_dir = tmp_path / "run"
    argv = train_argv(smollm2_spec, prepared_data_dir, run_dir, "--max-steps", "2")
    argv = [sys.executable, "-c", HELD_WARM_UP, str(run_dir), *argv[3:]]  # after "-m dflash_train"
    done = run_train(argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warm-up: the stream beat" in done.stderr
    kinds = [line.kind for line in status_lines(run_dir)]
    assert kinds.index("run_start") < kinds.index("heartbeat") < kinds.index("step")
    assert kinds[-1] == "run_end"


def test_a_beat_falls_silent_after_its_limit(tmp_path: Path) -> None:
    writer = StatusWriter(tmp_path / "status.jsonl", "r1")
    beat = Beat(writer, {}, every=0.05, limit=0.5).start()
    beat._thread.join(timeout=30)  # it ends by itself at its limit
    assert not beat._thread.is_alive()
    beats = [line for line in status_lines(tmp_path) if line.kind == "heartbeat"]
    assert 1 <= len(beats) <= 10  # one a beat at most, none past the limit
    beat.stop()
    writer.close()
