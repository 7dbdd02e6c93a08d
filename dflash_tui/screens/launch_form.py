"""The launch form (`l`): fields prefilled from the profile, each checked as it is typed with
the reason right under it; it only closes with a complete, valid argv."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from dflash_tui.sources.launch_fields import (
    LAUNCH_FIELDS,
    FieldError,
    LaunchField,
    check_field,
    train_args,
    validate_form,
)
from dflash_tui.sources.prepare_launch import (
    HELP,
    LABEL,
    NAME,
    PLACEHOLDER,
    PrepareFieldError,
    check_prepare,
    launch_argv,
)

# The trainer's fields, then "prepare first" (a prepare, then training, in one launch).
PREPARE_FIELD = LaunchField(NAME, LABEL, None, check_prepare, PLACEHOLDER, HELP)
FIELDS = (*LAUNCH_FIELDS, PREPARE_FIELD)


class LaunchForm(ModalScreen[list[str] | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, defaults: Mapping[str, str], *, target: str) -> None:
        super().__init__()
        self.defaults = dict(defaults)
        self.target = target
        self.last_values: dict[str, str] = {}  # the fields as they were when it closed

    def compose(self) -> ComposeResult:
        with Vertical(id="launch-dialog", classes="dialog"):
            yield Static(f"Launch a run on {self.target}", classes="dialog-title")
            with VerticalScroll(id="launch-fields"):
                for spec in FIELDS:
                    with Horizontal(classes="form-row"):
                        yield Label(spec.label, classes="form-label")
                        with Vertical(classes="form-cell"):
                            field = Input(
                                self.defaults.get(spec.name, ""),
                                placeholder=spec.placeholder,
                                id=f"field-{spec.name}",
                            )
                            field.tooltip = spec.help  # the trainer's help and bounds
                            yield field
                            yield Static("", id=f"error-{spec.name}", classes="field-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Launch…", id="submit", variant="primary")
                yield Button("Cancel", id="cancel")

    def raw_values(self) -> dict[str, str]:
        return {s.name: self.query_one(f"#field-{s.name}", Input).value for s in FIELDS}

    def show_error(self, name: str, message: str) -> None:
        error = self.query_one(f"#error-{name}", Static)
        error.update(message)
        error.set_class(bool(message), "shown")
        self.query_one(f"#field-{name}", Input).set_class(bool(message), "invalid")

    def on_mount(self) -> None:
        # Without this the scrolling container takes the focus and typing goes nowhere.
        self.query_one(f"#field-{LAUNCH_FIELDS[0].name}", Input).focus()

    @on(Input.Changed)
    def _check_one(self, event: Input.Changed) -> None:
        name = (event.input.id or "").removeprefix("field-")
        try:
            if name == PREPARE_FIELD.name:
                PREPARE_FIELD.check(event.value)
            else:
                check_field(name, event.value)
        except (FieldError, PrepareFieldError) as exc:
            self.show_error(name, str(exc))
        else:
            self.show_error(name, "")

    @on(Input.Submitted)
    @on(Button.Pressed, "#submit")
    def submit(self) -> None:
        self.last_values = self.raw_values()
        values, errors = validate_form(self.last_values)
        try:
            argv = launch_argv(self.last_values, train_args(values)) if not errors else []
        except PrepareFieldError as exc:
            errors[PREPARE_FIELD.name] = str(exc)
        for spec in FIELDS:
            self.show_error(spec.name, errors.get(spec.name, ""))
        if errors:
            first = next(s.name for s in FIELDS if s.name in errors)
            self.query_one(f"#field-{first}", Input).focus()
            return
        self.dismiss(argv)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.last_values = self.raw_values()
        self.dismiss(None)
