"""`train --init-from`: a run starts its drafter from another run's export or checkpoint (the
weights only: its own optimizer, schedule and step 0), says so in `run_start` and an event,
refuses a source of another shape before anything heavy loads, and a resume of its own
checkpoint wins over it. Real trainer processes on the CPU, the real prepared data."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import datasets
import pytest
from train_process import losses_by_step, run_train, status_lines, train_argv

from dflash_train import protocol
from dflash_train.model.drafter import read_drafter_config

TARGET = "random:tiny"  # seeded: the same weights in every process


def _argv(data: Path, run_dir: Path, *extra: str) -> list[str]:
    return train_argv(
        TARGET, data, run_dir, "--epochs", "20", "--seed", "7", "--pipeline", "sync", *extra
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, prepared_data_dir: Path) -> Path:
    """A completed 10-step run `source`: checkpoints at steps 5 and 10, and its export."""
    run_dir = tmp_path_factory.mktemp("init_from") / "source"
    extra = ("--max-steps", "10", "--save-every", "5", "--run-id", "source")
    done = run_train(_argv(prepared_data_dir, run_dir, *extra))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "export" / "model.safetensors").is_file()  # a completed run exports
    return run_dir


def _first(lines: list[protocol.StatusLine], kind: str) -> protocol.StatusLine:
    return next(line for line in lines if line.kind == kind)


def test_a_run_started_from_an_export_trains_on_from_its_weights(
    tmp_path: Path, prepared_data_dir: Path, source: Path
) -> None:
    export = source / "export"

    # The source's recipe for 2 steps, from the source's export.
    started = tmp_path / "started"
    extra = ("--max-steps", "2", "--init-from", str(export))
    done = run_train(_argv(prepared_data_dir, started, *extra))
    assert done.returncode == 0, done.stderr[-3000:]
    source_lines, lines = status_lines(source), status_lines(started)
    source_losses, losses = losses_by_step(source_lines), losses_by_step(lines)
    # From the export the first step's loss is where the source ended, not where it began
    # (the source's first step is a fresh run's: same seed, same first batch).
    assert losses[1] < source_losses[1] - 0.5 * (source_losses[1] - source_losses[10])

    start = _first(lines, "run_start")
    record = start["init_from"]
    weights = (export / "model.safetensors").read_bytes()
    assert record == {
        "path": str(export.resolve()), "kind": "export", "run": "source", "step": 10,
        "sha256": hashlib.sha256(weights).hexdigest(),
    }  # fmt: skip
    assert start["start_step"] == 0 and start["resumed_from"] is None
    assert _first(source_lines, "run_start")["init_from"] is None
    event = next(ln for ln in lines if ln.kind == "event" and ln["code"] == "init_from")
    assert str(export.resolve()) in event["message"] and "step 10" in event["message"]
    # Its own schedule: the first step's learning rate is a fresh run's warm-up value (both
    # schedules warm up over one step).
    steps = [ln for ln in lines if ln.kind == "step"]
    source_steps = [ln for ln in source_lines if ln.kind == "step"]
    assert steps[0]["step"] == 1 and steps[0]["lr"] == source_steps[0]["lr"]
    assert _first(lines, "run_end")["reason"] == "completed"


def test_a_source_of_another_shape_is_refused_naming_the_field(
    tmp_path: Path, prepared_data_dir: Path, source: Path
) -> None:
    checkpoint = source / "checkpoints" / "source" / "step_0000005"
    assert checkpoint.is_dir()
    for path, extra, why in (
        (source / "export", ("--draft-layers", "2"), "draft_layers: --init-from "),
        (checkpoint, ("--block-size", "8"), "block_size: --init-from "),
        (source, (), "init_from: "),  # a run dir is neither: say which one you mean
    ):
        run_dir = tmp_path / f"refused_{why.split(':')[0]}"
        done = run_train(_argv(prepared_data_dir, run_dir, "--init-from", str(path), *extra))
        assert done.returncode != 0
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"dflash-train train: {why}"), done.stderr[-2000:]
        assert str(path) in last
        assert not [ln for ln in status_lines(run_dir) if ln.kind == "run_start"]


def test_a_resume_of_the_runs_own_checkpoint_wins_over_init_from(
    tmp_path: Path, prepared_data_dir: Path, source: Path
) -> None:
    checkpoint = source / "checkpoints" / "source" / "step_0000005"
    run_dir = tmp_path / "b"
    common = ("--init-from", str(checkpoint), "--run-id", "b", "--save-every", "2")
    done = run_train(_argv(prepared_data_dir, run_dir, *common, "--max-steps", "2"))
    assert done.returncode == 0, done.stderr[-3000:]
    first = status_lines(run_dir)
    assert _first(first, "run_start")["init_from"]["kind"] == "checkpoint"
    assert _first(first, "run_start")["init_from"]["step"] == 5
    # What a restart does: the same arguments, resuming the run's newest checkpoint.
    more = ("--max-steps", "4", "--resume-from", "latest")
    done = run_train(_argv(prepared_data_dir, run_dir, *common, *more))
    assert done.returncode == 0, done.stderr[-3000:]
    second = status_lines(run_dir)[len(first) :]
    start = _first(second, "run_start")
    assert start["init_from"] is None and start["start_step"] == 2
    assert start["resumed_from"].endswith("b/step_0000002")


def _data_holding(prepared: Path, token: int, out: Path) -> Path:
    """A copy of the prepared data whose first sample holds `token` (absent before)."""
    table = datasets.load_from_disk(str(prepared))
    assert token not in {t for ids in table["input_ids"] for t in ids}

    def with_token(row: dict, index: int) -> dict:
        ids = row["input_ids"]
        return {"input_ids": [*ids[:3], token, *ids[4:]]} if index == 0 else {}

    table.map(with_token, with_indices=True).save_to_disk(str(out))
    shutil.copy(prepared / "prepare.json", out / "prepare.json")
    return out


def test_weights_whose_mask_token_is_in_the_new_data_are_refused(
    tmp_path: Path, prepared_data_dir: Path, source: Path
) -> None:
    # The source drafts with a token absent from its data (SmolLM2's table has no spare
    # row). New data holding that token would make the mask a real input: refused.
    export = source / "export"
    mask = json.loads((export / "config.json").read_text())["dflash_config"]["mask_token_id"]
    data = _data_holding(prepared_data_dir, mask, tmp_path / "data")
    run_dir = tmp_path / "run"
    done = run_train(_argv(data, run_dir, "--max-steps", "2", "--init-from", str(export)))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"dflash-train train: init_from: {export.resolve()} drafts with mask token {mask}, "
        "which occurs in this run's training data; start fresh, or train on data without it"
    ), done.stderr[-2000:]
    # The same data from scratch picks another mask token and trains.
    done = run_train(_argv(data, tmp_path / "fresh", "--max-steps", "1"))
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_resume_onto_data_holding_its_mask_token_is_refused(
    tmp_path: Path, prepared_data_dir: Path, source: Path
) -> None:
    # A restart that changed --data-dir: the checkpoint's drafter keeps its mask token, so
    # data holding that token is refused as it is for --init-from, not trained on. A copy of
    # the source run, so the module's other tests see it as it was.
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    checkpoint = max((run_dir / "checkpoints" / "source").glob("step_*"))
    mask = read_drafter_config(checkpoint).mask_token_id
    assert isinstance(mask, int)
    data = _data_holding(prepared_data_dir, mask, tmp_path / "data")
    again = ("--max-steps", "12", "--run-id", "source", "--resume-from", "latest")
    done = run_train(_argv(data, run_dir, *again))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dflash-train train: resume_from: ") and last.endswith(
        f"drafts with mask token {mask}, which occurs in this run's training data; start "
        "fresh, or train on data without it"
    ), done.stderr[-2000:]
    # The data it trained on resumes.
    done = run_train(_argv(prepared_data_dir, run_dir, *again))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _first(status_lines(run_dir)[::-1], "run_start")["start_step"] == 10
