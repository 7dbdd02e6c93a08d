"""The header counts epochs as people do: the stream's 0-based `epoch` 5 of 6 is the last
one, "epoch 6/6" (seen in tmux: a finished run read "epoch 5/6 100%")."""

from __future__ import annotations

import dataclasses

from dflash_tui.widgets.header import HeaderFacts, render_header

COLOURS = {
    name: name for name in ("primary", "secondary", "success", "warning", "error", "accent")
}  # fmt: skip


def _facts(epoch: int | None, fraction: float | None) -> HeaderFacts:
    return HeaderFacts(
        target="box", run_dir="/runs/a", run_id="r1", badge="running", read_only=False,
        paused=False, epoch=epoch, epochs=6, epoch_fraction=fraction, step=210,
        total_steps=210, eta_s=None, age_s=1.0,
    )  # fmt: skip


def test_epochs_are_shown_counted_from_one() -> None:
    assert " epoch 1/6 " in render_header(_facts(0, 0.0), COLOURS, 120).plain
    assert " epoch 6/6 " in render_header(_facts(5, 1.0), COLOURS, 120).plain
    assert " epoch –/6 " in render_header(_facts(None, None), COLOURS, 120).plain


def test_a_narrow_terminal_shortens_the_paths_not_the_badge() -> None:
    """Seen in tmux at 80 columns: the first line wrapped and pushed the step, ETA and
    last-update line out of the header's two rows."""
    facts = dataclasses.replace(
        _facts(0, 0.5),
        target="root@gpu-box.example.org:2222 (pct exec 200)",
        run_dir="/data/runs/qwen3.6-27b/drafter-2026-11-30/liverun",
        read_only=True,
        step=1_062,
        total_steps=30_000,
        eta_s=90_000.0,
    )
    for width in (60, 80, 100):
        header = render_header(facts, COLOURS, width)
        top, bottom = header.plain.split("\n")
        assert len(top) <= width, (width, top)
        assert "RUNNING" in top and "READ-ONLY" in top and "r1" in top
        shown = top.split(" │ ")[1]
        assert facts.run_dir.endswith(shown.lstrip("…")) and len(shown) >= 2  # its end
        assert bottom.startswith(" epoch 1/6 ")
    # At 80 columns the epoch bar shrinks so that the last update is read whole.
    bottom = render_header(facts, COLOURS, 80).plain.split("\n")[1]
    assert len(bottom) <= 80 and bottom.endswith("last update 1 s ago"), bottom
    assert " …liverun │ " in render_header(facts, COLOURS, 80).plain
    wide = render_header(facts, COLOURS, 200).plain
    assert facts.run_dir in wide and facts.target in wide  # whole when there is room


def test_a_prepare_shows_its_answers_not_epochs_and_steps() -> None:
    """Seen in the console: a launched prepare read "epoch –/– │ step –" for its whole run."""
    facts = dataclasses.replace(
        _facts(None, None), badge="preparing", epochs=None, step=None, total_steps=None,
        eta_s=125.0, preparing=True,
    )  # fmt: skip
    waiting = render_header(facts, COLOURS, 120).plain.split("\n")[1]
    assert waiting.startswith(" answers –/– ") and "– tok/s answered" in waiting
    going = dataclasses.replace(facts, prepare=(1_500, 6_000, 9_870.0))
    bottom = render_header(going, COLOURS, 120).plain.split("\n")[1]
    assert bottom.startswith(" answers 1,500/6,000 ") and " 25%" in bottom
    assert "9.9 Ktok/s answered" in bottom and "ETA 2m 05s" in bottom
    assert "epoch" not in bottom and "step" not in bottom
    slow = dataclasses.replace(facts, prepare=(16, 120, 94.0))  # a CPU's pace
    assert "94 tok/s answered" in render_header(slow, COLOURS, 120).plain
