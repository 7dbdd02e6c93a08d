"""The dashboard laid out by the terminal's height: at 80x24 and 100x30 the plots keep
their rows (the GPU history gives way first), the events pane stays on the screen, and the
footer keeps `? Help` and `q Quit` in sight at 80 columns; a tall terminal shows every pane."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Footer

from dflash_tui.screens.main import PLOT_ROWS
from tests.tui.console_harness import attached, make_run_dir, wait_until


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 48)])
async def test_panes_fit_the_terminal_height(tmp_path: Path, size: tuple[int, int]) -> None:
    width, height = size
    async with attached(make_run_dir(tmp_path), size=size) as (app, pilot, _):
        main = app.main_screen()
        assert main is not None
        loss, events, heatmap = (main.pane(n) for n in ("loss", "events", "heatmap"))
        await wait_until(pilot, lambda: loss.region.height > 0 and events.region.height > 0)
        assert loss.region.height >= PLOT_ROWS, loss.region
        footer = main.query_one(Footer)
        assert events.region.bottom <= footer.region.y  # on the screen, above the footer
        assert heatmap.display == (height >= 43)  # the GPU history gives way first
        keys = [key for key in footer.query("FooterKey") if key.region.width]
        shown = [(key.key_display, key.description) for key in keys]
        assert shown[:2] == [("?", "Help"), ("q", "Quit")]
        assert all(key.region.right <= width for key in keys[:2])
        if height < 43:
            await pilot.press("7")  # the operator's choice wins over the layout's
            assert heatmap.display
