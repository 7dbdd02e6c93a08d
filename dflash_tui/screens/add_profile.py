"""The add-profile dialog of the fleet (`a`): a name, the host, a container, the run dir and
the box's python, each checked as the config file would check it before the dialog closes."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from dflash_tui.cli_args import UsageError, parse_host
from dflash_tui.sources.profiles import Profile, ProfileError, parse_profile

FIELDS = (
    ("name", "profile name", "gpu-box-2"),
    ("host", "host ([user@]host[:port]; empty: this machine)", "root@gpu-box-2"),
    ("container", "container id (pct exec; empty: none)", "200"),
    ("run_dir", "run directory on the box", "/data/runs/qwen27b"),
    (
        "python",
        "the box's trainer: its venv's python (empty: dflash-train on the PATH)",
        "/opt/dflash/.venv/bin/python",
    ),
)


def profile_from_fields(fields: dict[str, str]) -> Profile:
    """The dialog's text as a profile, checked as the config file's entries are."""
    name = fields["name"]
    if not name:
        raise ProfileError("name: empty")
    table: dict[str, object] = {}
    if fields["host"]:
        try:
            spec = parse_host(fields["host"])
        except UsageError as exc:
            raise ProfileError(str(exc)) from None
        table["host"] = spec.host
        if spec.port is not None:
            table["port"] = spec.port
        if spec.username is not None:
            table["user"] = spec.username
    if fields["container"]:
        if not fields["container"].isdigit():
            raise ProfileError(f"container: expected a numeric id, got {fields['container']!r}")
        table["container"] = fields["container"]
    if not fields["run_dir"]:
        raise ProfileError("run_dir: empty")
    table["run_dir"] = fields["run_dir"]
    if fields.get("python"):
        table["python"] = fields["python"]
    return parse_profile(name, table, where=name)


class AddProfileDialog(ModalScreen[dict[str, str] | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, taken: set[str]) -> None:
        super().__init__()
        self.taken = taken

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog add-profile-dialog"):
            yield Static("Add a profile", classes="dialog-title")
            for key, label, placeholder in FIELDS:
                yield Label(label)
                yield Input(placeholder=placeholder, id=f"field-{key}")
            yield Static("", id="add-error", classes="field-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Add", id="submit", variant="primary")
                yield Button("Cancel", id="cancel")

    def values(self) -> dict[str, str]:
        return {key: self.query_one(f"#field-{key}", Input).value.strip() for key, *_ in FIELDS}

    def show_error(self, message: str) -> None:
        error = self.query_one("#add-error", Static)
        error.update(message)
        error.set_class(bool(message), "shown")

    @on(Input.Submitted)
    @on(Button.Pressed, "#submit")
    def submit(self) -> None:
        fields = self.values()
        if fields["name"] in self.taken:
            self.show_error(f"name: a profile {fields['name']!r} exists already")
            return
        try:
            profile_from_fields(fields)
        except ProfileError as exc:
            self.show_error(str(exc))
            return
        self.dismiss(fields)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
