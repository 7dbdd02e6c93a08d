"""The fleet screen: one row per profile, trouble first, redrawn from the fleet's cached
summaries; Enter opens a row's dashboard, `/` filters, `a` adds a profile."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from dflash_tui.screens.add_profile import AddProfileDialog
from dflash_tui.sources.fleet import RowView
from dflash_tui.sources.profiles import config_path
from dflash_tui.widgets import units
from dflash_tui.widgets.header import BADGE_STYLE, badge_label

if TYPE_CHECKING:
    from dflash_tui.fleet_console import FleetApp

# The alerts beside the state: a long reason in `updated` must not push them out of sight.
COLUMNS = (
    "profile", "host", "run", "state", "alerts", "epoch", "step", "ETA", "Ktok/s", "loss",
    "τ", "GPU °C", "updated",
)  # fmt: skip
PROBLEM_WIDTH = 40
TROUBLE = frozenset({"crashed", "stalled", "unreachable", "no_trainer"})
FLEET_BADGE_STYLE = {**BADGE_STYLE, "unreachable": "error", "no run": "secondary"}


def row_cells(view: RowView, colours: dict[str, str]) -> list[Text | str]:
    colour = colours.get(FLEET_BADGE_STYLE.get(view.badge, "secondary"), "")
    badge = Text(f" {badge_label(view.badge)} ", style=f"bold reverse {colour}")
    epoch = "–" if view.epoch is None else str(view.epoch + 1)  # people count from 1
    if view.epochs is not None:
        epoch += f"/{view.epochs}"
    step = "–" if view.step is None else f"{view.step:,}"
    if view.total_steps is not None:
        step += f"/{view.total_steps:,}"
    name = view.name + (" 🔒" if view.read_only else "")
    alerts = Text(str(view.alerts), style=f"bold {colours['error']}") if view.alerts else "0"
    updated = "–" if view.age_s is None else f"{units.duration(view.age_s)} ago"
    if view.problem and view.badge in ("unreachable", "no run", "no_trainer"):
        # The reason in brief; the whole of it is on the dashboard (Enter).
        problem = (
            view.problem
            if len(view.problem) <= PROBLEM_WIDTH
            else view.problem[: PROBLEM_WIDTH - 1] + "…"
        )
        updated = Text(problem, style="dim")
    return [
        name,
        view.host,
        view.run_id or "–",
        badge,
        alerts,
        epoch,
        step,
        units.duration(view.eta_s),
        units.number(view.ktok_s),
        units.number(view.loss),
        units.number(view.tau),
        "–" if view.hottest_c is None else f"{view.hottest_c:.0f}",
        updated,
    ]


class FleetScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        # Priority: shown in the footer over the table's own (hidden) Enter.
        Binding("enter", "open", "Open", priority=True, id="fleet.open"),
        Binding("slash", "filter", "Filter", key_display="/", id="fleet.filter"),
        Binding("a", "add", "Add profile", id="fleet.add"),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="fleet.clear"),
        Binding("q", "app.quit", "Quit", id="fleet.quit"),
    ]

    @property
    def console(self) -> FleetApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title")
        table: DataTable[Text | str] = DataTable(id="fleet-table", cursor_type="row")
        self._columns = table.add_columns(*COLUMNS)
        self._shown: list[str] = []
        yield table
        yield Input(placeholder="filter: profile, host, run id or state", id="fleet-filter")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#fleet-filter", Input).display = False
        self.query_one(DataTable).focus()
        self.refresh_rows()

    @property
    def filter_text(self) -> str:
        return self.query_one("#fleet-filter", Input).value

    def refresh_rows(self) -> None:
        views = self.console.fleet.views()
        shown = [v for v in views if v.matches(self.filter_text)]
        table = self.query_one(DataTable)
        colours = self.console.colours()
        names = [v.name for v in shown]
        if names == self._shown:
            # Same rows in the same order: new cells in place, the cursor left alone (a
            # rebuild would race with the operator's arrow keys).
            for view in shown:
                for column, cell in zip(self._columns, row_cells(view, colours), strict=True):
                    table.update_cell(view.name, column, cell, update_width=True)
        else:
            current = self.selected() or self.console.last_opened
            table.clear()
            for view in shown:
                table.add_row(*row_cells(view, colours), key=view.name)
            self._shown = names
            if current in names:
                table.move_cursor(row=names.index(current), animate=False)
        trouble = sum(1 for v in views if v.badge in TROUBLE)
        title = Text(" dflash fleet ", style=f"bold reverse {colours['primary']}")
        if not views:
            title.append("  no profiles yet: press a to add one", style="bold")
            title.append(f" (saved to {config_path()})", style="dim")
            self.query_one("#fleet-title", Static).update(title)
            return
        title.append(f"  {len(views)} profiles", style="bold")
        title.append(f" · {trouble} in trouble" if trouble else " · all well")
        if self.filter_text:
            title.append(f" · filter {self.filter_text!r}: {len(shown)} shown", style="dim")
        self.query_one("#fleet-title", Static).update(title)

    def selected(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return None if key.value is None else str(key.value)

    @on(DataTable.RowSelected)
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        if self.focused is self.query_one("#fleet-filter", Input):
            self._filter_done()  # Enter in the filter box ends the typing
            return
        name = self.selected()
        if name is not None:
            self.console.open_dashboard(name)

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#fleet-filter")
    def _filter_changed(self) -> None:
        self.refresh_rows()

    @on(Input.Submitted, "#fleet-filter")
    def _filter_done(self) -> None:
        self.query_one(DataTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.value = ""
        box.display = False
        self.query_one(DataTable).focus()
        self.refresh_rows()

    def action_add(self) -> None:
        def added(fields: dict[str, str] | None) -> None:
            if fields is not None:
                self.console.add_profile(fields)

        self.app.push_screen(AddProfileDialog(set(self.console.fleet.rows)), added)
