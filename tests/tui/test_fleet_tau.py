"""The fleet row's τ is the run's held-out one when the run has one (an `eval` event in the
tail the row follows), else the training τ: the number an operator ranks runs by."""

from __future__ import annotations

import sys
from pathlib import Path

from dflash_train.control.eval_record import event_line_fields
from dflash_train.stream.writer import StatusWriter
from dflash_tui.sources.fleet import Fleet
from dflash_tui.sources.profiles import Profile
from tests.reliability.console_side import wait_until
from tests.tui.synthetic_stream import RUN_ID, step_fields, write_stream

STEPS = 60


async def test_the_row_shows_the_held_out_tau_over_the_training_one(tmp_path: Path) -> None:
    scored, plain = tmp_path / "scored", tmp_path / "plain"
    for run_dir in (scored, plain):
        write_stream(run_dir, STEPS)
    writer = StatusWriter(scored / "status.jsonl", RUN_ID)
    figures = {"step": STEPS - 1, "tau": 2.345, "tau_tf": 2.5, "lossless": True}
    figures |= {"prompts": 16, "tokens": 128, "seconds": 4.2, "source": "manual"}
    writer.write("event", **event_line_fields(figures))
    writer.close()
    profiles = [Profile(d.name, run_dir=str(d), python=sys.executable) for d in (scored, plain)]
    fleet = Fleet(profiles, status_every=600)
    fleet.start()
    try:

        def taus() -> dict[str, float | None]:
            return {v.name: v.tau for v in fleet.views()}

        trained = step_fields(STEPS - 1, max(1, -(-STEPS // 6)), 6)["tau"]
        await wait_until(
            lambda: taus() == {"scored": 2.345, "plain": trained}, timeout=120, what=str(taus())
        )
    finally:
        await fleet.close()
