"""The log screen over real OpenSSH (through the pct shim): `L` shows a real train.log's
tail and follows what is appended, `/` filters (plain text, `re:` regex, a bad regex
refused and said, the input kept), `g`/`G` leave and resume following, `q` goes back (as
in less) and ends the box's `logs` process; the events screen keeps every event."""

from __future__ import annotations

import sys
from pathlib import Path

from textual.widgets import Input, Log

from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.screens.events_screen import EventsScreen
from dflash_tui.screens.log_screen import LogScreen
from dflash_tui.screens.main import MainScreen
from tests.sshd import ClientKey, OpenSshServer
from tests.tui.conftest import server_key, transport_to, trusted_known_hosts
from tests.tui.console_harness import make_run_dir, wait_until
from tests.tui.test_app_alerts import box_processes


def log_lines(start: int, count: int) -> str:
    rows = []
    for n in range(start, start + count):
        rows.append(f"WARNING queue low at step {n}" if n % 10 == 5 else f"step {n} loss 1.{n:03d}")
    return "\n".join(rows) + "\n"


async def test_log_screen_follows_and_filters_train_log_over_ssh(
    openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    run_dir = make_run_dir(tmp_path, steps=20)
    log = run_dir / "train.log"
    log.write_text(log_lines(0, 30))
    known = trusted_known_hosts(tmp_path / "known", openssh_server.port, server_key(openssh_server))
    transport = transport_to(openssh_server.port, client_key, known)
    options = ConsoleOptions("box", str(run_dir), python=sys.executable, follow_gpus=False)
    app = DflashApp(transport, options)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.state.step == 19)
        await pilot.press("L")
        screen = app.screen
        assert isinstance(screen, LogScreen)
        await wait_until(pilot, lambda: len(screen.lines) == 30)
        view = screen.query_one(Log)
        with log.open("a") as fh:
            fh.write(log_lines(30, 10))
        await wait_until(pilot, lambda: len(screen.lines) == 40 and view.line_count == 40)
        assert screen.lines[-1] == "step 39 loss 1.039" and screen.following

        await pilot.press("slash", "w", "a", "r", "n")  # plain text, any case
        await wait_until(pilot, lambda: view.line_count == 4)
        assert screen.visible_lines() == [f"WARNING queue low at step {n}" for n in (5, 15, 25, 35)]
        field = screen.query_one("#viewer-filter", Input)
        field.value = r"re:^step 3\d loss"
        await wait_until(pilot, lambda: view.line_count == 9)
        field.value = "re:(unclosed"
        await pilot.pause()
        # Said (first in the title), the input kept as typed and marked; the last good
        # filter still applies.
        assert "invalid pattern '(unclosed'" in screen.problem and view.line_count == 9
        assert field.value == "re:(unclosed" and field.has_class("invalid")
        title = str(screen.query_one("#viewer-title").render())
        assert title.startswith("filter: invalid pattern")
        field.value = r"re:^step 4\d"
        await pilot.press("enter")
        with log.open("a") as fh:
            fh.write(log_lines(40, 6))  # 45 is a warning: filtered out
        await wait_until(pilot, lambda: view.line_count == 5 and len(screen.lines) == 46)

        await pilot.press("g")
        assert not screen.following and view.scroll_y == 0
        await pilot.press("G")
        assert screen.following
        await pilot.press("q")  # back, as in less: the console stays
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen))
        assert app.is_running
        # Leaving the screen ends its follow on the box (the pct shim runs it locally).
        await wait_until(pilot, lambda: not box_processes("logs", run_dir), timeout=20)

        await pilot.press("e")
        events = app.screen
        assert isinstance(events, EventsScreen)
        await wait_until(pilot, lambda: any("epoch 1/6 done" in ln for ln in events.lines))
        await pilot.press("q")
        await wait_until(pilot, lambda: isinstance(app.screen, MainScreen))
        assert app.is_running
