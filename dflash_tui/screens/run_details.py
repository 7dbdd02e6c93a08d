"""The run details screen (`i`): what the run's `run_start` line says — host, pid, steps,
batches per epoch, the weights it resumed or began from, topology, dataset statistics and
the whole resolved config."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from dflash_train.protocol import StatusLine, init_from_text

RUN_FIELDS = ("host", "pid", "total_steps", "batches_per_epoch", "start_step", "resumed_from")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(", ", ": "))
    return "–" if value is None else str(value)


def _section(title: str, rows: Mapping[str, Any]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=None,
                  show_header=False, padding=(0, 2), expand=False)  # fmt: skip
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key in rows:
        table.add_row(key, _value(rows[key]))
    if not rows:
        table.add_row("–", "(none recorded)")
    return table


def run_details(start: StatusLine | None, run_id: str | None) -> Group:
    """Everything `run_start` recorded, in sections; a note when there is no run_start."""
    if start is None:
        return Group(Text(f"run {run_id or '–'}: no run_start line seen yet", style="dim"))
    begun = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start.t))
    run = {"run id": start.run, "started": begun}
    run |= {key: start.get(key) for key in RUN_FIELDS if start.get(key) is not None}
    source = start.get("init_from")
    if isinstance(source, Mapping):  # train --init-from: whose weights the drafter began with
        run["init_from"] = init_from_text(source)
    sections = [_section("run", run)]
    for name in ("topology", "dataset", "config"):
        value = start.get(name)
        sections.append(Text(""))
        sections.append(_section(name, value if isinstance(value, Mapping) else {}))
    known = {"config", "topology", "dataset", "settings", "init_from", *RUN_FIELDS}
    extra = {k: v for k, v in start.fields.items() if k not in known and k != "history"}
    if extra:
        sections += [Text(""), _section("also recorded", extra)]
    return Group(*sections)


class RunDetailsScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,i,q", "close", "Close")]

    def __init__(self, start: StatusLine | None, run_id: str | None) -> None:
        super().__init__()
        self.start = start
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog details-dialog"):
            yield Static("Run details", classes="dialog-title")
            with VerticalScroll(id="details-body"):
                yield Static(run_details(self.start, self.run_id), id="details-text")
            yield Static("escape closes this screen", classes="form-hint")

    def action_close(self) -> None:
        self.dismiss(None)
