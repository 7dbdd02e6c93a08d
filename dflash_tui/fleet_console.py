"""`dflash-tui fleet`: the fleet screen and, on Enter, the usual dashboard of one row, one
after the other in one event loop, so the fleet's connections (one per host) and its rows
keep going while a dashboard is open, and the dashboard talks over the same connection."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from textual.app import App
from textual.binding import Binding
from textual.css.query import NoMatches

from dflash_tui import themes
from dflash_tui.app import DflashApp
from dflash_tui.screens.add_profile import profile_from_fields
from dflash_tui.screens.fleet import FleetScreen
from dflash_tui.sources.console_options import console_options
from dflash_tui.sources.fleet import Fleet
from dflash_tui.sources.host_link import default_transport
from dflash_tui.sources.profiles import Profile, ProfileError, add_profile, load_config
from dflash_tui.sources.session import watch_only_forced

REFRESH_HZ = 2.0
BACK = "fleet"


class FleetApp(App[str]):
    """Shows the fleet; exits with the name of the row to open (None: quit)."""

    CSS_PATH = "app.tcss"
    TITLE = "dflash fleet"

    def __init__(
        self,
        fleet: Fleet,
        *,
        theme: str | None = None,
        config_writer: Callable[[Profile], None] = add_profile,
        last_opened: str | None = None,
    ) -> None:
        super().__init__()
        self.fleet = fleet
        self.wanted_theme = theme
        self.config_writer = config_writer
        # The row whose dashboard was open last: the cursor comes back to it.
        self.last_opened = last_opened

    def on_mount(self) -> None:
        themes.install(self, self.wanted_theme)
        self.fleet.start()
        self.push_screen(FleetScreen())
        self.set_interval(1 / REFRESH_HZ, self.refresh_rows)

    def refresh_rows(self) -> None:
        screen = self.screen
        # The timer can fire between the push and the screen's compose (NoMatches on
        # '#fleet-filter' in CI), and while the app tears the screen down.
        if isinstance(screen, FleetScreen) and screen.is_mounted:
            with contextlib.suppress(NoMatches):
                screen.refresh_rows()

    def colours(self) -> dict[str, str]:
        return themes.palette(self)

    def open_dashboard(self, name: str) -> None:
        self.fleet.acknowledge(name)  # the operator is looking at it now
        self.exit(name)

    def add_profile(self, fields: dict[str, str]) -> None:
        try:
            profile = profile_from_fields(fields)
            self.config_writer(profile)
        except (ProfileError, OSError) as exc:
            self.notify(f"profile not added: {exc}", severity="error", timeout=10)
            return
        self.fleet.add(profile)
        self.notify(f"profile {profile.name!r} added to the config file")
        self.refresh_rows()


class FleetDashboardApp(DflashApp):
    """The usual dashboard, with Esc going back to the fleet."""

    BINDINGS = [  # noqa: RUF012 - Textual's own declaration style
        Binding("escape", "back_to_fleet", "Fleet", id="fleet.back"),
    ]

    def action_back_to_fleet(self) -> None:
        self.exit(BACK)  # type: ignore[arg-type]


def dashboard_for(fleet: Fleet, name: str, *, watch: bool, theme: str | None) -> DflashApp:
    # The CLI's own options: the dashboard reads exactly as `dflash-tui PROFILE` does.
    profile = fleet.rows[name].profile
    if watch or watch_only_forced():
        profile = replace(profile, watch=True)
    if theme:
        profile = replace(profile, theme=theme)
    transport = fleet.transport_for(name)
    options = console_options(profile, f"{profile.name}: {transport.description}")
    return FleetDashboardApp(transport, options)


async def run_fleet(
    fleet: Fleet,
    *,
    watch: bool = False,
    theme: str | None = None,
    run_app: Callable[[App[Any]], Any] | None = None,
) -> int:
    """Fleet, dashboard, fleet, ... until the operator quits. `run_app` runs one app to its
    end (tests drive it with Pilot); by default it is the app's own `run_async`."""
    run = run_app or (lambda app: app.run_async())
    name: str | None = None
    try:
        while True:
            chooser = FleetApp(fleet, theme=theme, last_opened=name)
            await run(chooser)
            name = chooser.return_value
            if name is None:
                return 0
            dashboard = dashboard_for(fleet, name, watch=watch, theme=theme)
            await fleet.pause(name)
            try:
                await run(dashboard)
            finally:
                fleet.resume(name)
            if dashboard.return_value != BACK:
                return int(dashboard.return_code or 0)
    finally:
        await fleet.close()


def fleet_from_config() -> Fleet:
    """Every profile of the config file. No config file, or one without profiles, makes an
    empty fleet: its title says that `a` adds the first profile (to the config file)."""
    config = load_config()
    return Fleet(config.profiles.values(), make_transport=default_transport, clock=time.time)


def run_fleet_console(*, watch: bool = False, theme: str | None = None) -> int:
    return asyncio.run(run_fleet(fleet_from_config(), watch=watch, theme=theme))
