"""The checkpoints screen's rows: whose score each step shows, and that a teacher-forced
score (a hybrid target's, never decoded) is marked as one, before and after the box's
listing comes."""

from __future__ import annotations

import dataclasses

from dflash_train import protocol
from dflash_tui.screens.checkpoints_screen import (
    BEST_MARK,
    TF_MARK,
    checkpoint_rows,
    shown_path,
)
from dflash_tui.sources.state import HeldoutTau
from tests.tui.synthetic_stream import RUN_ID, T0


def _checkpoints(*steps: int) -> list[protocol.StatusLine]:
    lines = []
    for seq, step in enumerate(steps):
        raw = protocol.encode_line(
            "checkpoint", seq=seq, run=RUN_ID, t=T0 + step, step=step, path=f"c/{step}", seconds=1
        )
        decoded = protocol.decode_line(raw)
        assert isinstance(decoded, protocol.StatusLine)
        lines.append(decoded)
    return lines


def _cells(rows: list) -> dict[int, tuple[str, str]]:
    return {row.step: (row.cells()[4], row.cells()[5]) for row in rows}


def test_a_teacher_forced_score_is_marked_from_the_stream_alone() -> None:
    scores = {
        10: HeldoutTau(10, None, 1.84, None),  # a hybrid's: teacher-forced only
        20: HeldoutTau(20, 2.05, 2.30, True),  # decoded: its tau, no mark
    }
    rows = checkpoint_rows(_checkpoints(10, 20, 30), None, scores)
    assert _cells(rows) == {
        30: ("–", "saved"),
        20: ("2.050", f"saved {BEST_MARK}"),
        10: (f"1.840 {TF_MARK}", "saved"),
    }


def test_the_box_listing_decides_the_score_and_its_mark() -> None:
    """eval.json wins over the stream's event: a step evaluated by hand since (decoded) loses
    its mark; one the box scored teacher-forced gains it."""
    scores = {10: HeldoutTau(10, None, 1.84, None), 20: HeldoutTau(20, 2.05, 2.30, True)}
    listed = [
        {"step": 10, "complete": True, "tau": 1.91, "tau_tf": 2.10},
        {"step": 20, "complete": True, "tau": None, "tau_tf": 2.31, "best": True},
    ]
    rows = checkpoint_rows(_checkpoints(10, 20), listed, scores)
    assert _cells(rows) == {
        20: (f"2.310 {TF_MARK}", f"complete {BEST_MARK}"),
        10: ("1.910", "complete"),
    }


def test_paths_under_the_run_dir_read_from_it() -> None:
    """The path column is cut to the screen's width: every full path kept the same long
    prefix and lost the step. Paths under the run dir (as the user named it: absolute,
    relative to the box's home, or with ~) read from it; any other stays whole."""
    path = "/root/runs/r1/checkpoints/0a1b2c3d4e5f/step_0000040"
    tail = "checkpoints/0a1b2c3d4e5f/step_0000040"
    assert shown_path(path, "/root/runs/r1") == tail
    assert shown_path(path, "/root/runs/r1/") == tail
    assert shown_path(path, "runs/r1") == tail
    assert shown_path(path, "~/runs/r1") == tail
    assert shown_path(path, "/root/runs/r10") == path  # a sibling that shares a prefix
    assert shown_path(path, "runs/r") == path  # a partial component is no match
    assert shown_path(path, "/other") == path
    assert shown_path(path, None) == path
    row = checkpoint_rows(_checkpoints(40), None)[0]
    assert dataclasses.replace(row, path=path).cells("/root/runs/r1")[-1] == tail
