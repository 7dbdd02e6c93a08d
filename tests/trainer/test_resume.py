"""Exact resume: a run stopped by a real SIGTERM and resumed from its checkpoint produces
the same per-step losses as an unbroken run. The unbroken run uses the sync pipeline and the
broken one the async pipeline (one worker, depth 1), so this also pins that both pipelines
feed the drafter the same batches. The broken run also evaluates on held-out prompts every 3
steps and is stopped after its first evaluation: an evaluation must leave the training (its
batches, its anchors, its weights) as if it had not run, before and across the resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import datasets
from train_process import (
    losses_by_step,
    lrs_by_step,
    run_train,
    start_train,
    status_lines,
    train_argv,
    wait_for,
)

from dflash_train.checkpoint.store import is_complete

# A randomly initialised tiny target (seeded, so identical in every process) keeps the three
# processes quick; the lifecycle under test does not depend on the target's weights.
TARGET = "random:tiny"
STEPS = 12


def _argv(data: Path, run_dir: Path, *extra: str) -> list[str]:
    return train_argv(
        TARGET, data, run_dir, "--max-steps", str(STEPS), "--epochs", "20", "--seed", "7", *extra
    )


def test_sigterm_then_resume_matches_an_unbroken_run(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    # The unbroken run trains beside the broken one: two one-thread processes, two cores.
    whole_dir = tmp_path / "whole"
    whole_log = tmp_path / "whole.log"
    whole = start_train(
        _argv(prepared_data_dir, whole_dir, "--pipeline", "sync", "--save-every", "0"),
        whole_log,
    )
    try:
        _interrupt_and_resume(tmp_path, prepared_data_dir, whole_dir, whole, whole_log)
    finally:
        if whole.poll() is None:
            whole.kill()


def _heldout_file(data: Path, tmp_path: Path) -> Path:
    """A held-out file of two prompts with answers (rows of the data: what matters here is
    that the evaluation's teacher-forced pass runs)."""
    table = datasets.load_from_disk(str(data))
    records = [
        {"prompt": f"Held-out prompt {i}.", "input_ids": ids, "loss_mask": mask}
        for i, (ids, mask) in enumerate(
            zip(table["input_ids"][:2], table["loss_mask"][:2], strict=True)
        )
    ]
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _interrupt_and_resume(
    tmp_path: Path,
    prepared_data_dir: Path,
    whole_dir: Path,
    whole: subprocess.Popen[bytes],
    whole_log: Path,
) -> None:
    run_dir = tmp_path / "broken"
    log = tmp_path / "broken.log"
    async_one = (
        "--pipeline", "async",
        "--target-gpus", "cpu",
        "--hs-queue-depth", "1",
        "--hs-min-ready", "1",
        "--save-every", "0",
        "--run-id", "resumed",
        # 1 prompt x 4 tokens, and the teacher-forced pass over 2 answers, which draws
        # anchors too (training's come from a generator seeded per batch; the check is
        # that nothing of the evaluation reaches the losses, before or across the resume).
        "--eval-every", "3", "--eval-data", str(_heldout_file(prepared_data_dir, tmp_path)),
        "--eval-prompts", "1", "--eval-tokens", "4",
    )  # fmt: skip
    proc = start_train(_argv(prepared_data_dir, run_dir, *async_one), log)
    try:
        wait_for(run_dir, lambda line: line.kind == "event" and line["code"] == "eval", proc, log)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    first = status_lines(run_dir)
    end = first[-1]
    assert end.kind == "run_end" and end["reason"] == "signal"
    stopped_at = end["step"]
    assert 3 <= stopped_at < STEPS, "the signal must land mid-run for this test to mean anything"

    resumed = run_train(_argv(prepared_data_dir, run_dir, *async_one, "--resume-from", "latest"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert whole.wait(timeout=240) == 0, whole_log.read_text()[-3000:]
    expected = losses_by_step(status_lines(whole_dir))
    assert sorted(expected) == list(range(1, STEPS + 1))
    lines = status_lines(run_dir)
    second = lines[len(first) :]
    start = second[0]
    assert start.kind == "run_start" and start.run == "resumed"
    assert start["start_step"] == stopped_at
    assert start["resumed_from"].endswith(f"step_{stopped_at:07d}")
    assert start.seq == end.seq + 1  # same run id: the cursor continues
    got = losses_by_step(lines)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert math.isclose(got[step], expected[step], rel_tol=1e-6), (step, got, expected)
    assert second[-1]["reason"] == "completed"
    evals = [ln for ln in lines if ln.kind == "event" and ln["code"] == "eval"]
    assert [e["step"] for e in evals][:: len(evals) - 1] == [3, STEPS], evals
    assert all(e["tau_tf"] is not None for e in evals), "the teacher-forced pass ran"


def test_a_resume_with_more_max_steps_follows_the_longer_schedule(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    # How a device session sizes one schedule over several calls (bench/README.md): the
    # first call's steps/s decides the steps, and the next call resumes with that
    # --max-steps. From the resumed step the learning rate is the longer cosine's, as for a
    # run planned that long from the start, not the shorter one's, which has ended.
    short, longer = 4, 8
    common = ("--pipeline", "sync", "--save-every", "0", "--epochs", "20", "--seed", "7")
    grown = tmp_path / "grown"
    argv = train_argv(TARGET, prepared_data_dir, grown, "--run-id", "grown", *common)
    done = run_train([*argv, "--max-steps", str(short)])
    assert done.returncode == 0, done.stderr[-3000:]
    first = status_lines(grown)
    assert first[-1]["reason"] == "completed" and first[-1]["step"] == short
    more = run_train([*argv, "--max-steps", str(longer), "--resume-from", "latest"])
    assert more.returncode == 0, more.stderr[-3000:]
    second = status_lines(grown)[len(first) :]
    start = second[0]
    assert start.kind == "run_start" and start["start_step"] == short
    assert start["total_steps"] == longer
    assert second[-1]["reason"] == "completed" and second[-1]["step"] == longer

    whole = tmp_path / "whole"
    planned = train_argv(TARGET, prepared_data_dir, whole, "--max-steps", str(longer), *common)
    done = run_train(planned)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = lrs_by_step(status_lines(whole))
    got = lrs_by_step(second)
    assert sorted(got) == list(range(short + 1, longer + 1))
    for step in got:
        assert math.isclose(got[step], expected[step], rel_tol=1e-9), (step, got, expected)
    # The short cosine only fell, to its end at step 4; the longer one is higher there.
    assert got[short + 1] > lrs_by_step(first)[short], (first, got)


def test_a_resume_at_its_max_steps_is_refused_before_anything_loads(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    # A checkpoint at the end of its schedule resumed with the same --max-steps used to load
    # the target and drafter, write run_start and end `completed` at once, with no checkpoint
    # or export of its own: a forgotten --max-steps, now told at once as a bad argument.
    common = ("--pipeline", "sync", "--save-every", "0", "--epochs", "20", "--seed", "7")
    first = tmp_path / "first"
    mine = train_argv(TARGET, prepared_data_dir, first, "--run-id", "first", *common)
    done = run_train([*mine, "--max-steps", "3"])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = status_lines(first)
    assert lines[-1]["reason"] == "completed" and lines[-1]["step"] == 3
    end = first / "checkpoints" / "first" / "step_0000003"
    assert is_complete(end)

    again = tmp_path / "again"
    argv = train_argv(TARGET, prepared_data_dir, again, "--run-id", "again", *common)
    refused = run_train([*argv, "--resume-from", str(end), "--max-steps", "3"])
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.splitlines() == [
        f"dflash-train train: resume_from: checkpoint {end} is at step 3, already at "
        "--max-steps 3: nothing to train (raise --max-steps to train on, or export it: "
        f"dflash-train export {end} --out DIR)"
    ], refused.stderr[-3000:]
    # Refused before the run dir was taken: no lock, no stream, no run_start, no model.
    assert not again.exists()
    # The same through `latest` in the run's own dir: its stream keeps its last word.
    refused = run_train([*mine, "--resume-from", "latest", "--max-steps", "2"])
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1].startswith(
        f"dflash-train train: resume_from: checkpoint {end} is at step 3, already past "
        "--max-steps 2: nothing to train"
    ), refused.stderr[-3000:]
    assert status_lines(first) == lines

    # One step more from the same checkpoint trains exactly that step and saves it.
    more = run_train([*argv, "--resume-from", str(end), "--max-steps", "4"])
    assert more.returncode == 0, more.stderr[-3000:]
    resumed = status_lines(again)
    start = next(line for line in resumed if line.kind == "run_start")
    assert start["start_step"] == 3 and start["resumed_from"] == str(end)
    assert [line["step"] for line in resumed if line.kind == "step"] == [4]
    assert resumed[-1].kind == "run_end"
    assert (resumed[-1]["reason"], resumed[-1]["step"]) == ("completed", 4)
    assert is_complete(again / "checkpoints" / "again" / "step_0000004")
