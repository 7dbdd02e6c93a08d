"""`dflash-tui demo` when prepare fails (as on a machine without the SmolLM2 target): the
events pane shows the reason from prepare's JSON reply, not an empty stderr tail."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_tui import demo
from tests.tui.console_harness import console_app, wait_until


async def test_the_reason_comes_from_the_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = demo.DemoPaths(tmp_path / "demo")
    real_argv = demo.prepare_argv

    def missing_target(p: demo.DemoPaths) -> list[str]:
        argv = real_argv(p)
        argv[argv.index("--target-model") + 1] = str(tmp_path / "no-such-model")
        return argv

    monkeypatch.setattr(demo, "prepare_argv", missing_target)
    app, _ = console_app(tmp_path / "run")
    async with app.run_test(size=(120, 40)) as pilot:
        worker = app.run_worker(demo.prepare_data(app, paths))
        await worker.wait()
        assert worker.result is False
        await wait_until(pilot, lambda: any("prepare failed" in n.text for n in app.notes))
        (note,) = [n.text for n in app.notes if "prepare failed" in n.text]
        assert note.startswith("prepare failed (exit 2): target ")
        assert "no-such-model': not a directory with config.json" in note
    assert not paths.ready_marker.exists()
