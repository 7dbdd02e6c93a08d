"""The trainer's target_fallback warning (a hybrid target whose linear-attention layers run
the pure-PyTorch reference) reaches the console's events pane as a warning."""

from __future__ import annotations

from pathlib import Path

from dflash_train import protocol
from dflash_train.targets.linear_attention import fallback_warning
from dflash_tui.widgets.events_log import EventsLog
from tests.tui.console_harness import attached, make_run_dir, wait_until
from tests.tui.synthetic_stream import RUN_ID

# What a CPU run on random:tiny-hybrid reports (tests/trainer/test_target_paths.py).
CPU_FALLBACK = {
    "full_attention": {"attention": "sdpa"},
    "linear_attention": {"gated_delta_rule": "torch", "conv1d": "torch"},
}


async def test_the_fallback_warning_shows_in_the_events_pane(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    message = fallback_warning(CPU_FALLBACK)
    assert message is not None
    async with attached(run_dir) as (app, pilot, _):
        with (run_dir / "status.jsonl").open("a") as fh:
            fh.write(
                protocol.encode_line(
                    "event", seq=9000, run=RUN_ID, level="warning", code="target_fallback",
                    message=message,
                )
            )  # fmt: skip
        events = app.screen.query_one(EventsLog)
        await wait_until(pilot, lambda: "pure-PyTorch fallback" in str(events.render()))
        shown = [e for e in app.state.events if "pure-PyTorch fallback" in e.text]
        assert [e.level for e in shown] == ["warning"]
