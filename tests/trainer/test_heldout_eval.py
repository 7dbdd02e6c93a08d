"""Held-out evaluation during the run, on the CPU with the real SmolLM2 target: `eval`
events at the configured steps whose numbers equal a separate `dflash-train eval` of the
same checkpoint; tau per checkpoint in `status`; `export --best`; pruning keeps the best;
an evaluation by hand lands in the stream; a failing evaluation is a warning and the run
goes on; the console plots the held-out series and marks the best checkpoint (Pilot)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from train_process import run_train, start_train, status_lines, train_argv, wait_for

from dflash_train import protocol
from dflash_train.checkpoint.heldout_score import SCORE_FILE, read_score
from dflash_train.data.heldout import HELDOUT_FILE
from dflash_train.targets.frozen_target import Target

EVAL_ARGS = ("--eval-every", "3", "--eval-prompts", "2", "--eval-tokens", "16")
RUN_ID = "evalrun"


def _cli(*args: str) -> protocol.Reply:
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_train", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    reply = protocol.decode_reply(proc.stdout)
    assert isinstance(reply, protocol.Reply), (proc.stdout, proc.stderr[-2000:])
    return reply


@pytest.fixture(scope="module")
def heldout_data(
    tmp_path_factory: pytest.TempPathFactory, prepared_data_dir: Path, smollm2: Target
) -> Path:
    """The session's prepared data with what `prepare --heldout 2` adds: 2 built-in eval
    prompts answered by the target (prepare's own function) in heldout.jsonl."""
    from dflash_train.data.heldout import answer_heldout, split_off_heldout
    from dflash_train.data.prompt_ids import stop_token_ids

    data = tmp_path_factory.mktemp("heldout") / "data"
    shutil.copytree(prepared_data_dir, data)
    held, _, _ = split_off_heldout(["builtin"], [], [], 2, 0)
    text = answer_heldout(
        smollm2, held, max_new_tokens=48, batch_size=2, stop_ids=stop_token_ids(smollm2)
    )
    (data / HELDOUT_FILE).write_text(text, encoding="utf-8")
    return data


@pytest.fixture(scope="module")
def eval_run(
    tmp_path_factory: pytest.TempPathFactory, heldout_data: Path, smollm2_spec: str
) -> Path:
    """Six sync steps, evaluated at 3 and 6, keeping one checkpoint (and the best)."""
    run_dir = tmp_path_factory.mktemp("evalrun") / "run"
    argv = train_argv(
        smollm2_spec, heldout_data, run_dir,
        "--pipeline", "sync", "--max-steps", "6", "--save-every", "0",
        "--keep-checkpoints", "1", "--run-id", RUN_ID, "--wandb-project", "dflash-test",
        *EVAL_ARGS,
    )  # fmt: skip
    done = run_train(argv, timeout=600, WANDB_API_KEY_UNUSED="1")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def _prepare(out: Path, prompts: str, *, heldout: int = 2, **more: Any) -> dict[str, Any]:
    """The real prepare, in this process (a tiny random target: the split is under test)."""
    from dflash_train.data.prepare import PrepareConfig, prepare_dataset

    config = PrepareConfig(
        target="random:tiny", prompts=prompts, out=out, max_new_tokens=6,
        heldout=heldout, devices="cpu", **more,
    )  # fmt: skip
    return prepare_dataset(config)


def _prompt_part(ids: list[int], mask: list[int]) -> tuple[int, ...]:
    return tuple(t for t, m in zip(ids, mask, strict=True) if not m)


def test_prepare_holds_out_the_builtin_eval_split_with_the_targets_answers(
    tmp_path: Path, smollm2: Target
) -> None:
    from dflash_train.data.dataset import load_dataset_dir
    from dflash_train.data.prompts import load_prompts

    out = tmp_path / "data"
    info = _prepare(out, "builtin", samples=6)
    assert info["heldout"] == 2 and info["stats"]["samples"] == 6
    lines = [json.loads(x) for x in (out / HELDOUT_FILE).read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in lines] == load_prompts("builtin", "eval")[:2]
    for record in lines:
        user, answer = record["messages"]
        assert (user["role"], answer["role"]) == ("user", "assistant")
        ids, mask = record["input_ids"], record["loss_mask"]
        answer_ids = [t for t, m in zip(ids, mask, strict=True) if m]
        assert 0 < len(answer_ids) <= 6 and mask == sorted(mask)  # the prompt, then the answer
        assert smollm2.tokenizer.decode(answer_ids).startswith(answer["content"])
    train = load_dataset_dir(str(out))
    seen = {_prompt_part(list(i), list(m)) for i, m in train.rows(range(len(train)))}
    assert not seen & {_prompt_part(r["input_ids"], r["loss_mask"]) for r in lines}


def test_prepare_holds_prompts_of_a_file_out_of_training(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Name a colour, number {i}.\n" for i in range(12)))
    out = tmp_path / "data"
    info = _prepare(out, str(prompts), heldout=3)
    assert info["heldout"] == 3 and info["stats"]["samples"] == 9
    held = [json.loads(x) for x in (out / HELDOUT_FILE).read_text().splitlines()]
    held_prompts = {r["messages"][0]["content"] for r in held}
    assert len(held_prompts) == 3
    from dflash_train.data.dataset import load_dataset_dir

    train = load_dataset_dir(str(out))
    seen = {_prompt_part(list(i), list(m)) for i, m in train.rows(range(len(train)))}
    assert len(seen) == 9 and not seen & {
        _prompt_part(r["input_ids"], r["loss_mask"]) for r in held
    }


def _evals(run_dir: Path) -> list[protocol.StatusLine]:
    return [line for line in status_lines(run_dir) if line.get("code") == "eval"]


def test_eval_events_at_the_configured_steps_and_in_wandb(eval_run: Path) -> None:
    from wandb_records import history_rows

    events = [e for e in _evals(eval_run) if e["source"] == "run"]
    assert [e["step"] for e in events] == [3, 6]
    for event in events:
        assert event["level"] == "info" and event["prompts"] == 2 and event["tokens"] == 16
        assert event["tau"] >= 1.0 and event["tau_tf"] >= 1.0 and event["lossless"] is True
        assert event["mismatched"] == 0
        assert len(event["slot_acc"]) == 3 and event["dtype"] == "float32"
        assert event["seconds"] > 0 and f"held-out tau {event['tau']:.3f}" in event["message"]
        assert set(event["phases_s"]) == {
            "setup", "greedy", "speculative", "teacher_forced", "teacher_forced_seen",
        }  # fmt: skip
        score = read_score(Path(event["checkpoint"]))
        assert score is not None and score["tau"] == event["tau"] and score["step"] == event["step"]
    # Plain greedy decoding of the frozen target is done once, at the first evaluation.
    assert [e["greedy_decoded"] for e in events] == [2, 0]
    rows = {r["_step"]: r for r in history_rows(eval_run) if "eval/tau" in r}
    assert sorted(rows) == [3, 6]
    assert [rows[e["step"]]["eval/tau_tf"] for e in events] == [e["tau_tf"] for e in events]
    assert [rows[e["step"]]["eval/mismatched"] for e in events] == [0, 0]
    seen = [rows[e["step"]]["eval/tau_tf_seen"] for e in events]
    assert seen == [e["tau_tf_seen"] for e in events]
    # The run still exported and ended normally after its evaluations.
    lines = status_lines(eval_run)
    assert lines[-1].kind == "run_end" and lines[-1]["reason"] == "completed"
    assert any(line.get("code") == "exported" for line in lines)


def test_a_separate_eval_of_the_checkpoint_gives_the_same_numbers_and_is_recorded(
    eval_run: Path,
) -> None:
    event = next(e for e in _evals(eval_run) if e["step"] == 3 and e["source"] == "run")
    reply = _cli(
        "eval", "--run-dir", str(eval_run), "--drafter", event["checkpoint"], "--device", "cpu"
    )
    assert reply.ok, reply
    data = reply.data
    assert data["step"] == 3 and data["prompts"] == 2 and data["recorded"] == "stream"
    assert (data["tau"], data["tau_tf"], data["lossless"]) == (
        event["tau"], event["tau_tf"], event["lossless"],
    )  # fmt: skip
    assert len(data["mismatched_prompts"]) == event["mismatched"] == 0
    assert data["slot_acc"] == event["slot_acc"] and data["blocks"] == event["blocks"]
    assert data["round_lengths"] == event["round_lengths"]
    assert sum(event["round_lengths"]) == event["blocks"]
    assert len(event["round_lengths"]) == event["block_size"]
    # Appended to the finished run's stream as the same event, seq continuing.
    lines = status_lines(eval_run)
    assert [line.seq for line in lines] == list(range(len(lines)))
    manual = lines[-1]
    assert manual.get("code") == "eval" and manual["source"] == "manual"
    assert manual.run == RUN_ID and manual["step"] == 3 and manual["tau"] == event["tau"]


def test_each_evaluation_also_scores_training_samples_it_trained_on(
    eval_run: Path, heldout_data: Path, smollm2: Target
) -> None:
    """Beside the held-out answers, as many training samples, cut to the held-out answers'
    length and teacher-forced the same way: seen against unseen."""
    from dflash_train.checkpoint.export import load_any_drafter
    from dflash_train.data.dataset import load_dataset_dir
    from dflash_train.data.heldout import answer_length, load_heldout, seen_sample
    from dflash_train.decode.heldout_figures import teacher_forced

    event = [e for e in _evals(eval_run) if e["source"] == "run"][-1]  # step 6: kept
    assert event["step"] == 6 and len(event["slot_acc_seen"]) == 3
    assert event["tau_tf_seen"] >= 1.0
    data, held = load_dataset_dir(heldout_data), load_heldout(str(heldout_data))
    budget = answer_length(held.rows)
    assert 0 < budget <= 48  # the held-out answers' length, not the decoded 16 tokens
    rows = seen_sample(data.rows, len(data), len(held.rows), budget, 0)
    samples = [
        (tuple(int(i) for i in ids), int(sum(mask))) for ids, mask in data.rows(range(len(data)))
    ]
    assert len(rows) == 2 and rows[0] != rows[1]
    for ids, mask in rows:  # one of the run's own samples, cut after `budget` answer tokens
        answers = [n for whole, n in samples if whole[: len(ids)] == ids]
        assert answers and sum(mask) == min(budget, answers[0])
    # The run's figures are this rule's, recomputed from its checkpoint.
    start = next(line for line in status_lines(eval_run) if line.kind == "run_start")
    drafter = load_any_drafter(event["checkpoint"]).eval()
    acc, tau = teacher_forced(smollm2, drafter, rows, start["config"]["max_length"])
    assert [round(a, 4) for a in acc] == event["slot_acc_seen"]
    assert tau is not None and round(tau, 4) == event["tau_tf_seen"]


def test_status_lists_tau_per_checkpoint_and_export_best_names_the_best(eval_run: Path) -> None:
    scores = {e["step"]: (e["tau"], e["tau_tf"]) for e in _evals(eval_run)}
    status = _cli("status", str(eval_run))
    listed = {c["step"]: c for c in status.data["checkpoint_list"]}
    # keep 1: step 3 outlived the prune at step 6 because it was then the best evaluated.
    assert sorted(listed) == [3, 6]
    assert {s: (c["tau"], c["tau_tf"]) for s, c in listed.items()} == scores
    best_step = max(scores, key=lambda s: (*scores[s], s))
    assert [s for s, c in listed.items() if c["best"]] == [best_step]

    out = eval_run.parent / "best-export"
    reply = _cli("export", str(eval_run), "--best", "--out", str(out))
    assert reply.ok, reply
    assert reply.data["step"] == best_step and reply.data["tau"] == scores[best_step][0]
    assert f"best held-out tau {scores[best_step][0]} at step {best_step}" in reply.data["message"]
    assert reply.data["checkpoint"].endswith(f"step_{best_step:07d}")
    assert (out / "model.safetensors").is_file()


async def _checkpoint_rows(app: Any, pilot: Any) -> dict[str, Any]:
    """`c`: the checkpoints screen's rows once the box's listing came, by step."""
    from textual.widgets import DataTable

    from dflash_tui.screens.checkpoints_screen import CheckpointsScreen
    from tests.tui.console_harness import wait_until

    await pilot.press("c")
    screen = app.screen
    assert isinstance(screen, CheckpointsScreen)
    await wait_until(pilot, lambda: screen.listed is not None)
    table = screen.query_one(DataTable)
    return {table.get_row_at(i)[0]: table.get_row_at(i) for i in range(table.row_count)}


async def test_a_hybrid_target_is_scored_teacher_forced_and_its_best_exported(
    tmp_path: Path, heldout_data: Path
) -> None:
    """A hybrid (Gated-DeltaNet layers) cannot be decoded speculatively in the run (its
    recurrent state is not cut back after a rejected draft): each evaluation is then the
    teacher-forced tau on the held-out answers, an `eval` event with tau null, the
    checkpoint's score, listed by `status`, chosen by `export --best` and shown by the
    console as teacher-forced (header, tau view, checkpoints), not a warning."""
    from dflash_tui.screens.checkpoints_screen import BEST_MARK, TF_MARK
    from dflash_tui.widgets.header import RunHeader
    from dflash_tui.widgets.loss_plot import LossPane
    from tests.tui.console_harness import console_app, wait_until

    run_dir = tmp_path / "run"
    argv = train_argv(
        "random:tiny-hybrid", heldout_data, run_dir, "--pipeline", "sync", "--max-steps", "2",
        "--save-every", "0", "--eval-every", "1", "--eval-prompts", "2", "--eval-tokens", "8",
    )  # fmt: skip
    done = run_train(argv, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = status_lines(run_dir)
    assert not [line for line in lines if line.get("code") == "eval_failed"]
    evals = _evals(run_dir)
    assert [(e["step"], e["tau"], e["lossless"], e["prompts"]) for e in evals] == [
        (1, None, None, 0),
        (2, None, None, 0),
    ]
    block = evals[0]["block_size"]
    assert all(1.0 <= e["tau_tf"] <= block and len(e["slot_acc"]) == block - 1 for e in evals)
    assert "teacher-forced at step 1 (a hybrid target" in evals[0]["message"]
    status = _cli("status", str(run_dir))
    listed = {c["step"]: c for c in status.data["checkpoint_list"]}
    assert {s: (c["tau"], c["tau_tf"]) for s, c in listed.items()} == {
        e["step"]: (None, e["tau_tf"]) for e in evals
    }
    best = max(evals, key=lambda e: (e["tau_tf"], e["step"]))
    assert [s for s, c in listed.items() if c["best"]] == [best["step"]]
    reply = _cli("export", str(run_dir), "--best", "--out", str(tmp_path / "best"))
    assert reply.ok, reply
    assert reply.data["step"] == best["step"]
    told = f"best held-out tau {best['tau_tf']} teacher-forced at step {best['step']}"
    assert told in reply.data["message"]

    app, _ = console_app(run_dir, read_only=True)
    async with app.run_test(size=(160, 48)) as pilot:
        header = app.screen.query_one(RunHeader)
        # The header is redrawn on the app's refresh tick, not when the state changes.
        shown = f"held-out τ(tf) {evals[-1]['tau_tf']:.3f} @2"
        await wait_until(pilot, lambda: app.state.end is not None and shown in str(header.render()))
        loss = app.screen.query_one(LossPane)
        while loss.choice.id != "tau":
            await pilot.press("v")
        app.request_redraw()
        await wait_until(pilot, lambda: "eval_tau_tf" in loss.drawn)
        assert "eval_tau" not in loss.drawn  # nothing decoded: no such series
        rows = await _checkpoint_rows(app, pilot)
        assert {step: row[4] for step, row in rows.items()} == {
            str(e["step"]): f"{e['tau_tf']:.3f} {TF_MARK}" for e in evals
        }
        assert [s for s, row in rows.items() if BEST_MARK in row[5]] == [str(best["step"])]


def test_export_best_without_any_score_says_what_to_run(tmp_path: Path, eval_run: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(eval_run, run_dir)
    for score in run_dir.glob(f"checkpoints/*/step_*/{SCORE_FILE}"):
        score.unlink()
    reply = _cli("export", str(run_dir), "--best")
    assert not reply.ok and reply.error_code == "bad_source"
    assert reply.error == (
        f"source: no checkpoint of run {RUN_ID} has a held-out score (eval.json); "
        f"train with --eval-every or run dflash-train eval --run-dir {run_dir}"
    )


def test_a_failing_evaluation_is_a_warning_and_training_goes_on(
    tmp_path: Path, heldout_data: Path, smollm2_spec: str
) -> None:
    """A held-out answer with a token id past the vocabulary: the teacher-forced pass
    fails inside the real embedding lookup; the run warns and completes."""
    bad = tmp_path / "bad.jsonl"
    record = json.loads((heldout_data / HELDOUT_FILE).read_text().splitlines()[0])
    record["input_ids"][-1] = 10**7
    bad.write_text(json.dumps(record) + "\n")
    run_dir = tmp_path / "run"
    argv = train_argv(
        smollm2_spec, heldout_data, run_dir, "--pipeline", "sync", "--max-steps", "1",
        "--eval-every", "1", "--eval-prompts", "1", "--eval-tokens", "4",
        "--eval-data", str(bad),
    )  # fmt: skip
    done = run_train(argv, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = status_lines(run_dir)
    failed = [line for line in lines if line.get("code") == "eval_failed"]
    assert [(line["step"], line["level"]) for line in failed] == [(1, "warning")]
    assert "IndexError" in failed[0]["message"] and "\n" not in failed[0]["message"]
    assert not [line for line in lines if line.get("code") == "eval"]
    # The run went on: its step, checkpoint (without a score), export and a normal end.
    assert [line["step"] for line in lines if line.kind == "step"] == [1]
    assert not list(run_dir.glob(f"checkpoints/*/step_0000001/{SCORE_FILE}"))
    assert any(line.get("code") == "exported" for line in lines)
    assert lines[-1]["reason"] == "completed"


async def test_the_console_plots_the_held_out_tau_and_marks_the_best_checkpoint(
    eval_run: Path,
) -> None:
    """The real console on the real run (local, through the real dflash-train commands):
    `v` to the tau view draws the training tau_tf beside the held-out series at the
    evaluated steps, the header shows the newest held-out tau, `c` marks the best."""
    from dflash_tui.screens.checkpoints_screen import BEST_MARK
    from dflash_tui.widgets.header import RunHeader
    from dflash_tui.widgets.loss_plot import LossPane
    from tests.tui.console_harness import console_app, wait_until

    # The run's at steps 3 and 6, then one by hand of step 3: only a score, not a new point.
    evals = {e["step"]: e for e in _evals(eval_run)}
    newest = evals[6]
    app, _ = console_app(eval_run, read_only=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: app.state.end is not None)
        loss = app.screen.query_one(LossPane)
        while loss.choice.id != "tau":
            await pilot.press("v")
        app.request_redraw()
        await wait_until(pilot, lambda: "eval_tau_tf" in loss.drawn)
        assert loss.drawn["tau"].last_x == 6
        for name, field in (("eval_tau", "tau"), ("eval_tau_tf", "tau_tf")):
            drawn = loss.drawn[name]
            assert dict(zip(drawn.xs, drawn.means, strict=True)) == {
                s: e[field] for s, e in evals.items()
            }
        header = str(app.screen.query_one(RunHeader).render())
        assert f"held-out τ {newest['tau']:.3f} @{newest['step']}" in header

        rows = await _checkpoint_rows(app, pilot)
        assert sorted(rows) == ["3", "6"]
        # Paths read from the run dir (the full ones were cut to the screen's width).
        for step, row in rows.items():
            assert row[6].startswith("checkpoints/") and row[6].endswith(f"step_{int(step):07d}")
            assert (eval_run / row[6]).is_dir()
        assert {step: row[4] for step, row in rows.items()} == {
            str(s): f"{e['tau']:.3f}" for s, e in evals.items()
        }
        status = _cli("status", str(eval_run))
        best = next(c["step"] for c in status.data["checkpoint_list"] if c["best"])
        assert [s for s, row in rows.items() if BEST_MARK in row[5]] == [str(best)]


def test_a_stop_during_an_evaluation_ends_it_at_the_next_prompt(
    tmp_path: Path, heldout_data: Path, smollm2_spec: str
) -> None:
    """SIGTERM while the held-out evaluation runs (told by its eval_started event): the
    evaluation gives way (eval_interrupted, no score), and the run checkpoints and ends as
    any stopped run does, exit 0, without waiting for the evaluation to finish."""
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    argv = train_argv(
        smollm2_spec, heldout_data, run_dir, "--pipeline", "sync", "--max-steps", "50",
        "--eval-every", "1", "--eval-prompts", "2", "--eval-tokens", "200",
    )  # fmt: skip
    proc = start_train(argv, log)
    try:
        started = wait_for(run_dir, lambda line: line.get("code") == "eval_started", proc, log, 600)
        assert started["step"] == 1 and started["level"] == "info"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = status_lines(run_dir)
    interrupted = [line for line in lines if line.get("code") == "eval_interrupted"]
    assert [(line["step"], line["level"]) for line in interrupted] == [(1, "info")]
    assert not [line for line in lines if line.get("code") == "eval"]
    assert not list(run_dir.glob(f"checkpoints/*/step_*/{SCORE_FILE}"))
    assert lines[-1].kind == "run_end" and lines[-1]["reason"] == "signal"


def test_a_long_evaluation_keeps_the_run_alive_in_the_stream(
    tmp_path: Path, heldout_data: Path, smollm2_spec: str
) -> None:
    """--stall-after 3 and an evaluation longer than that: the evaluation's keep-alive keeps
    the monitor from falling silent (no no_progress event), so heartbeats go on between
    eval_started and eval (the monitor's own, tests/pipeline/test_monitor.py), so neither
    `status` nor the console calls the run stalled."""
    run_dir = tmp_path / "run"
    argv = train_argv(
        smollm2_spec, heldout_data, run_dir, "--pipeline", "sync", "--max-steps", "1",
        "--eval-every", "1", "--eval-prompts", "1", "--eval-tokens", "64",
        "--stall-after", "3",
    )  # fmt: skip
    done = run_train(argv, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = status_lines(run_dir)
    codes = [line.get("code") for line in lines]
    start, end = codes.index("eval_started"), codes.index("eval")
    assert lines[end]["seconds"] > 3  # long enough that a silent monitor would have warned
    # Without the keep-alive (or with one slower than --stall-after) the monitor warns
    # no_progress after 3 s and stops its heartbeats, and the run then reads as stalled.
    assert "no_progress" not in codes[start:end]
    assert lines[-1].kind == "run_end" and lines[-1]["reason"] == "completed"
