"""The launch form's fields: which trainer options it asks for, each checked by the option's
own rule from the trainer's table (`dflash_train.config`), what each offers where nothing
else says (the table's default), and the flags they become. No Textual here, so the rules
can be read (and tested) on their own."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_train import protocol
from dflash_train.config import OPTIONS
from dflash_train.config.options import Option, OptionError


class FieldError(ValueError):
    """The one-line reason shown under the field."""


def _option_check(name: str) -> Callable[[str], str]:
    """The trainer's own rule for the option (type, bounds, choices): the form refuses what
    `dflash-train train` would. Numbers keep the text as typed; integers are normalised."""
    spec = OPTIONS[name]

    def check(text: str) -> str:
        try:
            value = spec.parse(text)
        except OptionError as exc:
            raise FieldError(str(exc)) from None
        if value is None:
            return ""
        return spec.text(value) if spec.kind == "int" else text.strip()

    return check


def _devices(name: str) -> Callable[[str], str]:
    """`cpu`, or GPU indices separated by commas, each once (the console's stricter rule),
    then the trainer's own device rule."""
    trainer_rule = _option_check(name)

    def check(text: str) -> str:
        return trainer_rule(_device_words(text))

    return check


def _device_words(text: str) -> str:
    text = text.strip().replace(" ", "")
    if text == "cpu":
        return text
    if not text:
        raise FieldError("required: 'cpu' or GPU indices such as 0,1")
    parts = text.split(",")
    if not all(p.isdigit() for p in parts):
        raise FieldError(f"expected 'cpu' or GPU indices such as 0,1, got {text!r}")
    if len(set(parts)) != len(parts):
        raise FieldError("a GPU is listed twice")
    return ",".join(str(int(p)) for p in parts)


def _extra_args(text: str) -> str:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise FieldError(f"cannot split: {exc}") from None
    if words and not words[0].startswith("--"):
        raise FieldError(f"extra arguments start with a --flag, not {words[0]!r}")
    return text.strip()


def typed_text(spec: Option, value: Any) -> str:
    """A value as one types it: a float below 1e-3 in exponent notation (6e-4, as learning
    rates are written, not 0.0006), anything else as the option table writes it."""
    plain = spec.text(value)
    if isinstance(value, float) and 0 < abs(value) < 1e-3:
        # The fewest mantissa digits that read back as the same float.
        mantissa, _, exponent = next(
            text for digits in range(17) if float(text := f"{value:.{digits}e}") == value
        ).partition("e")
        return f"{mantissa}e{int(exponent)}"
    return plain


def default_text(spec: Option) -> str | None:
    """What a field offers where nothing else says: the table's default (a live setting's
    is the protocol's); None when the option has none."""
    default = protocol.DEFAULT_SETTINGS.get(spec.name, spec.default)
    return None if default is None else typed_text(spec, default)


@dataclass(frozen=True)
class LaunchField:
    name: str
    label: str
    flag: str | None
    check: Callable[[str], str]
    placeholder: str = ""
    help: str = ""


def _field(name: str, label: str, placeholder: str = "") -> LaunchField:
    """A form field for a trainer option: flag, check, help and default from its table."""
    spec = OPTIONS[name]
    bounds = spec.bounds()
    return LaunchField(
        name,
        label,
        spec.flag,
        _devices(name) if spec.kind == "devices" else _option_check(name),
        placeholder or default_text(spec) or "",
        f"{spec.help} ({bounds})" if bounds else spec.help,
    )


# The options the form asks for, in its order; the others go in "extra args".
LAUNCH_FIELDS: tuple[LaunchField, ...] = (
    _field("target_model", "target model", "path or name"),
    _field("data_dir", "data dir", "prepared dataset on the box"),
    _field("target_gpus", "target GPUs", "cpu or 0,1,2"),
    _field("drafter_gpus", "drafter GPUs", "cpu or 3"),
    _field("pipeline", "pipeline", "sync or async"),
    _field("epochs", "epochs"),
    _field("lr", "learning rate"),
    _field("hs_queue_depth", "hs-queue-depth"),
    _field("hs_min_ready", "hs-min-ready"),
    _field("max_steps", "max steps", "blank: all"),
    LaunchField(
        "extra", "extra args", None, _extra_args, "--block-size 16 --seed 0",
        "more `dflash-train train` flags, checked on the box",
    ),
)  # fmt: skip
FIELD_NAMES = tuple(f.name for f in LAUNCH_FIELDS)
# What the form offers where the profile (or the demo's recipe) says nothing.
FORM_DEFAULTS: dict[str, str] = {
    f.name: text
    for f in LAUNCH_FIELDS
    if f.flag is not None and (text := default_text(OPTIONS[f.name])) is not None
}


def form_fields(texts: Mapping[str, str], extra_args: Sequence[str] = ()) -> dict[str, str]:
    """Train options as typed, by name (a recipe's, a profile's launch table), as the form's
    fields over FORM_DEFAULTS: an option without a field of its own goes to extra args, in
    the order given, before `extra_args`."""
    values = dict(FORM_DEFAULTS)
    extra: list[str] = []
    for name, text in texts.items():
        if name in FIELD_NAMES:
            values[name] = text
        else:
            extra += [OPTIONS[name].flag, text]
    values["extra"] = shlex.join([*extra, *extra_args])
    return values


def check_field(name: str, text: str) -> str:
    """The cleaned value, or FieldError with the reason."""
    spec = next(f for f in LAUNCH_FIELDS if f.name == name)
    return spec.check(text)


def cross_field_errors(values: Mapping[str, str]) -> dict[str, str]:
    """Rules between fields, judged on values that passed their own checks."""
    errors: dict[str, str] = {}
    depth, ready = values.get("hs_queue_depth"), values.get("hs_min_ready")
    if depth and ready:
        try:
            protocol.validate_settings({"hs_queue_depth": depth, "hs_min_ready": ready}, {})
        except protocol.SettingError as exc:
            errors["hs_min_ready"] = str(exc).split(": ", 1)[-1]
    targets, drafters = values.get("target_gpus"), values.get("drafter_gpus")
    if targets and drafters and "cpu" not in (targets, drafters):
        shared = set(targets.split(",")) & set(drafters.split(","))
        if shared:
            errors["drafter_gpus"] = f"GPU {','.join(sorted(shared))} is also a target GPU"
    return errors


def validate_form(raw: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(clean values, errors by field). A launch may be sent only when errors is empty."""
    values: dict[str, str] = {}
    errors: dict[str, str] = {}
    for spec in LAUNCH_FIELDS:
        try:
            values[spec.name] = spec.check(raw.get(spec.name, ""))
        except FieldError as exc:
            errors[spec.name] = str(exc)
    for name, message in cross_field_errors(values).items():
        errors.setdefault(name, message)
    return values, errors


def train_args(values: Mapping[str, str]) -> list[str]:
    """The argv after `dflash-train launch RUN_DIR --`; blank optional fields are left out."""
    argv: list[str] = []
    for spec in LAUNCH_FIELDS:
        value = values.get(spec.name, "")
        if spec.flag is not None and value:
            argv += [spec.flag, value]
    argv += shlex.split(values.get("extra", ""))
    return argv
