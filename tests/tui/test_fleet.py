"""The fleet: rows sorted trouble first from real `status` and `tail` commands, `/` filters,
`a` adds a profile to the config file keeping its comments, Enter opens the usual dashboard
(read-only profiles stay read-only) and Esc comes back. Over two real OpenSSH servers and a
port with nothing listening: one connection per host, rows that update independently, a
frozen host that holds up only its own rows, and `unreachable` for the dead one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input

from dflash_tui.app import DflashApp
from dflash_tui.fleet_console import BACK, FleetApp, FleetDashboardApp, fleet_from_config, run_fleet
from dflash_tui.screens.fleet import COLUMNS, FleetScreen, row_cells
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.fleet import Fleet, RowView
from dflash_tui.sources.host_link import PrefixedTransport
from dflash_tui.sources.profiles import Profile, add_profile, load_config
from tests.sshd import ClientKey, OpenSshServer, free_port
from tests.tui.conftest import server_key, trusted_known_hosts
from tests.tui.console_harness import press_button, wait_until
from tests.tui.fleet_box import ssh_profile, start_live_run, transports_to_loopback
from tests.tui.synthetic_stream import write_stream

FAST = Backoff(initial=0.2, cap=1.0)


@pytest.fixture(scope="module")
def local_fleet_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A finished-looking stream without a live trainer (crashed), a live run holding its
    lock, and a run dir that does not exist."""
    root = tmp_path_factory.mktemp("fleet-local")
    write_stream(root / "old", 120)
    live = start_live_run(root / "live", "live0000run", interval=0.25)
    try:
        yield {"old": root / "old", "live": root / "live", "empty": root / "nothing-here"}
    finally:
        live.kill()
        live.wait()


def local_profiles(dirs: dict[str, Path], **watch: bool) -> list[Profile]:
    return [
        Profile(name, run_dir=str(path), python=sys.executable, watch=watch.get(name, False))
        for name, path in dirs.items()
    ]


def by_name(views: list[RowView]) -> dict[str, RowView]:
    return {v.name: v for v in views}


def table_names(app: FleetApp) -> list[str]:
    table = app.screen.query_one(DataTable)
    return [str(key.value) for key in table.rows]


async def test_rows_trouble_first_and_filter(local_fleet_dirs: dict[str, Path]) -> None:
    # A box without the trainer where the profile says (exit 127): NO TRAINER, and why.
    broken = Profile("broken", run_dir=str(local_fleet_dirs["live"]), python="/no/python")
    profiles = [*local_profiles(local_fleet_dirs), broken]
    fleet = Fleet(profiles, status_every=0.5, backoff=FAST)
    app = FleetApp(fleet)
    try:
        async with app.run_test(size=(160, 20)) as pilot:

            def settled() -> bool:
                # A pace (the ETA) needs two live steps; at step 0 there is none yet.
                views = by_name(fleet.views())
                live = views["live"]
                return (
                    live.hottest_c is not None
                    and live.eta_s is not None
                    and views["old"].badge == "crashed"
                )

            await wait_until(pilot, settled)
            views = by_name(fleet.views())
            assert views["live"].badge == "running" and views["empty"].badge == "no run"
            assert views["live"].total_steps == 3000 and views["live"].ktok_s == 12.5
            assert views["live"].hottest_c == 60.0 and views["live"].loss is not None
            assert views["live"].eta_s is not None and views["old"].eta_s is None
            assert views["old"].alerts == 1  # the box says its trainer is gone
            assert views["broken"].badge == "no_trainer"
            assert "set python" in (views["broken"].problem or "")
            assert "NO TRAINER (set python)" in str(row_cells(views["broken"], app.colours())[3])
            # The long reason is cut in `updated`; the alerts column stays in sight.
            table = app.screen.query_one(DataTable)
            widths = [c.get_render_width(table) for c in table.columns.values()]
            assert sum(widths[: COLUMNS.index("alerts") + 1]) <= table.size.width
            # Trouble first, once the next redraw has sorted the rows.
            order = ["old", "broken", "live", "empty"]
            await wait_until(pilot, lambda: table_names(app) == order)
            first = views["live"].step
            await wait_until(pilot, lambda: (by_name(fleet.views())["live"].step or 0) > first)

            await pilot.press("slash")
            await pilot.press(*"liv")
            assert table_names(app) == ["live"]
            await pilot.press("enter")  # leaves the filter box, keeps the filter
            assert table_names(app) == ["live"]
            await pilot.press("escape")
            assert table_names(app) == order
    finally:
        await fleet.close()


async def test_add_profile_keeps_the_users_comments(
    local_fleet_dirs: dict[str, Path], tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    original = (
        "# my boxes, by hand\n"
        "[profiles.live]  # the one that trains\n"
        f'run_dir = "{local_fleet_dirs["live"]}"\n'
        f'python = "{sys.executable}"  # venv on the box\n'
    )
    config.write_text(original)
    profiles = list(load_config(config).profiles.values())
    fleet = Fleet(profiles, status_every=0.5, backoff=FAST)
    app = FleetApp(fleet, config_writer=lambda p: add_profile(p, config))
    try:
        async with app.run_test(size=(180, 30)) as pilot:
            await pilot.press("a")
            await wait_until(pilot, lambda: bool(app.screen.query("#field-name")))
            fields = {"name": "box2", "host": "root@gpu2:2222", "container": "200"}
            fields["python"] = "/opt/dflash/.venv/bin/python"  # a trainer in a venv
            for key, value in fields.items():
                app.screen.query_one(f"#field-{key}", Input).value = value
            app.screen.query_one("#field-run_dir", Input).value = "/data/runs/two"
            app.screen.query_one("#field-host", Input).value = "root@gpu2:99999"
            await press_button(pilot, "#submit")
            assert "port '99999'" in str(app.screen.query_one("#add-error").render())
            app.screen.query_one("#field-host", Input).value = "root@gpu2:2222"
            await press_button(pilot, "#submit")
            assert "box2" in fleet.rows and not app.screen.query("#add-error")
    finally:
        await fleet.close()
    text = config.read_text()
    assert text.startswith(original)  # every comment and line as the user left it
    added = load_config(config).profiles["box2"]
    assert (added.host, added.port, added.user, added.container) == ("gpu2", 2222, "root", "200")
    assert added.run_dir == "/data/runs/two"
    assert added.python == "/opt/dflash/.venv/bin/python"


async def test_a_fleet_with_no_config_opens_empty_and_a_adds_the_first_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "home" / ".config" / "dflash" / "config.toml"  # not there yet
    monkeypatch.setenv("DFLASH_CONFIG", str(config))
    fleet = fleet_from_config()
    app = FleetApp(fleet)
    try:
        async with app.run_test(size=(160, 30)) as pilot:
            title = lambda: str(app.screen.query_one("#fleet-title").render())  # noqa: E731
            await wait_until(pilot, lambda: "press a to add one" in title())
            assert str(config) in title() and table_names(app) == []
            await pilot.press("a")
            await wait_until(pilot, lambda: bool(app.screen.query("#field-name")))
            app.screen.query_one("#field-name", Input).value = "first"
            app.screen.query_one("#field-run_dir", Input).value = "/data/runs/one"
            await press_button(pilot, "#submit")
            await wait_until(pilot, lambda: "1 profiles" in title())
    finally:
        await fleet.close()
    assert list(load_config(config).profiles) == ["first"]


async def test_enter_opens_the_dashboard_read_only_and_escape_comes_back(
    local_fleet_dirs: dict[str, Path],
) -> None:
    fleet = Fleet(local_profiles(local_fleet_dirs, live=True), status_every=0.5, backoff=FAST)
    seen: list[str] = []

    async def drive(app: DflashApp | FleetApp) -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            if isinstance(app, FleetApp):
                if seen:
                    await wait_until(pilot, lambda: "live" in table_names(app))
                    # Its own tail again: at once, or at the host loop's next round when
                    # the resume found the row's status between polls.
                    await wait_until(pilot, lambda: fleet.rows["live"].follow is not None)
                    seen.append(f"fleet again at {app.screen.selected()}")
                    await pilot.press("q")
                    return
                await wait_until(pilot, lambda: "live" in table_names(app))
                table = app.screen.query_one(DataTable)
                table.move_cursor(row=table_names(app).index("live"))
                await pilot.press("enter")
                return
            assert isinstance(app, FleetDashboardApp)
            await wait_until(pilot, lambda: (app.state.step or 0) > 0)
            assert app.read_only and app.session.read_only
            assert isinstance(app.transport, PrefixedTransport)
            assert app.transport.base is fleet.rows["live"].link.transport  # one connection
            assert fleet.rows["live"].follow is None  # the dashboard follows it meanwhile
            for key in ("l", "S", "R", "m"):
                await pilot.press(key)
                assert app.screen is app.main_screen(), key
            seen.append(f"dashboard {app.options.target_name}")
            await pilot.press("escape")

    try:
        assert await run_fleet(fleet, run_app=drive) == 0
    finally:
        await fleet.close()
    assert seen == ["dashboard live: local", "fleet again at live"]  # the cursor came back
    assert BACK == "fleet"


# ---------------------------------------------------------------------------------------
# Over real OpenSSH servers.


@pytest.fixture(scope="module")
def second_sshd(
    tmp_path_factory: pytest.TempPathFactory, client_key: ClientKey, shim_dir: Path
) -> Iterator[OpenSshServer]:
    server = OpenSshServer(tmp_path_factory.mktemp("sshd-b"), shim_dir)
    server.start(client_key)
    yield server
    server.stop()


def accepted(server: OpenSshServer) -> int:
    return server.log.read_text(errors="replace").count("Accepted publickey")


async def test_fleet_over_two_openssh_servers_and_a_dead_port(
    openssh_server: OpenSshServer,
    second_sshd: OpenSshServer,
    client_key: ClientKey,
    tmp_path: Path,
) -> None:
    known = trusted_known_hosts(
        tmp_path / "known_hosts", openssh_server.port, server_key(openssh_server)
    )
    trusted_known_hosts(known, second_sshd.port, server_key(second_sshd))
    dead_port = free_port()
    profiles = [
        ssh_profile("a-one", openssh_server.port, tmp_path / "a1"),
        ssh_profile("a-two", openssh_server.port, tmp_path / "a2", container="200"),
        ssh_profile("b-one", second_sshd.port, tmp_path / "b1"),
        ssh_profile("dead", dead_port, tmp_path / "nowhere"),
    ]
    writers = [
        start_live_run(tmp_path / "a1", "runa1", temp_c=61.0),
        start_live_run(tmp_path / "a2", "runa2", temp_c=62.0),
        start_live_run(tmp_path / "b1", "runb1", temp_c=71.0),
    ]
    before_a = accepted(openssh_server)
    # The server lives for the session: only this test's commands count.
    sent_before = len(openssh_server.received())
    fleet = Fleet(
        profiles,
        make_transport=transports_to_loopback(client_key, known),
        status_every=1.0,
        # Long enough for a status over OpenSSH on a loaded machine: A's rows must never
        # time out (its host would read unreachable and reconnect).
        status_timeout=10.0,
        backoff=FAST,
    )
    app = FleetApp(fleet)
    frozen: list[int] = []
    try:
        async with app.run_test(size=(180, 20)) as pilot:
            views = lambda: by_name(fleet.views())  # noqa: E731
            live = ("a-one", "a-two", "b-one")

            def all_up() -> bool:
                v = views()
                # A GPU reading comes from the tail, not from status: the tails are in too.
                return all(v[n].hottest_c is not None and v[n].badge == "running" for n in live)

            await wait_until(pilot, all_up, timeout=60)
            assert views()["dead"].badge == "unreachable"
            assert "cannot connect" in (views()["dead"].problem or "")
            assert views()["b-one"].hottest_c == 71.0 and views()["a-two"].hottest_c == 62.0
            steps = {n: views()[n].step or 0 for n in live}
            await wait_until(
                pilot, lambda: all((views()[n].step or 0) > steps[n] for n in live), timeout=30
            )
            await wait_until(pilot, lambda: table_names(app)[0] == "dead")  # trouble first

            # B goes dark (its sshd frozen, listener and connections): A's rows go on
            # regardless.
            frozen = second_sshd.freeze_host()
            steps = {n: views()[n].step or 0 for n in live}
            await wait_until(
                pilot,
                lambda: all((views()[n].step or 0) > steps[n] + 5 for n in ("a-one", "a-two")),
                timeout=30,
            )
            await wait_until(pilot, lambda: views()["b-one"].badge == "unreachable", timeout=60)
            badges = {n: (views()[n].badge, views()[n].age_s) for n in ("a-one", "a-two")}
            assert all(b == "running" for b, _ in badges.values()), badges
            second_sshd.thaw_and_kill(frozen)
            frozen = []
            # B's loop reconnects with its own backoff and its row comes back.
            b_step = views()["b-one"].step or 0

            def b_back() -> bool:
                b = views()["b-one"]
                return b.badge == "running" and (b.step or 0) > b_step

            await wait_until(pilot, b_back, timeout=60)
    finally:
        if frozen:
            second_sshd.thaw_and_kill(frozen)
        await fleet.close()
        for writer in writers:
            writer.kill()
            writer.wait()
    # Both profiles of server A shared one connection for the whole test.
    assert accepted(openssh_server) - before_a == 1
    commands = openssh_server.received()[sent_before:]
    assert any(c.startswith("pct exec 200 -- ") and " tail " in c for c in commands)
    assert not any(word in c.split() for c in commands for word in ("launch", "stop", "set"))


def test_no_destination_opens_the_fleet_when_profiles_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dflash_tui.cli_args import build_parser, wants_fleet

    config = tmp_path / "config.toml"
    monkeypatch.setenv("DFLASH_CONFIG", str(config))
    parse = build_parser().parse_args
    assert not wants_fleet(parse([]))  # no config: the console of this machine
    config.write_text('[profiles.one]\nrun_dir = "/r"\n')
    assert wants_fleet(parse([])) and wants_fleet(parse(["--watch"]))
    assert not wants_fleet(parse(["one"])) and not wants_fleet(parse(["--run-dir", "/x"]))
    config.write_text('default_profile = "one"\n[profiles.one]\nrun_dir = "/r"\n')
    assert not wants_fleet(parse([]))  # the default profile, as before


async def test_a_redraw_before_the_fleet_screen_has_composed_waits_for_it() -> None:
    """CI under load: the refresh timer fired between the push of the fleet screen and its
    compose, and the query for the filter box raised NoMatches in the app."""
    fleet = Fleet([], status_every=600)
    app = FleetApp(fleet)
    try:
        async with app.run_test(size=(160, 20)) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen))
            fresh = FleetScreen()
            app.push_screen(fresh)  # not composed until the loop runs again
            assert app.screen is fresh and not fresh.is_mounted
            app.refresh_rows()
            await wait_until(pilot, lambda: fresh.is_mounted)
            app.refresh_rows()
            assert "no profiles yet" in str(fresh.query_one("#fleet-title").render())
    finally:
        await fleet.close()
