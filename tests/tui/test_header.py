"""The header counts epochs as people do: the stream's 0-based `epoch` 5 of 6 is the last
one, "epoch 6/6" (seen in tmux: a finished run read "epoch 5/6 100%")."""

from __future__ import annotations

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
