"""The launch form's fields: how each is checked and which `dflash-train train` flag it becomes.
No Textual here, so the rules can be read (and tested) on their own."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dflash_train import protocol


class FieldError(ValueError):
    """The one-line reason shown under the field."""


def _required(text: str) -> str:
    if not text.strip():
        raise FieldError("required")
    return text.strip()


def _int_in(low: int, high: int | None = None) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise FieldError(f"expected a whole number, got {text.strip()!r}") from None
        if value < low or (high is not None and value > high):
            upper = "" if high is None else str(high)
            raise FieldError(f"{value} is out of range {low}..{upper}")
        return str(value)

    return check


def _optional(check: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: check(text) if text.strip() else ""


def _learning_rate(text: str) -> str:
    try:
        value = float(text.strip())
    except ValueError:
        raise FieldError(f"expected a number such as 6e-4, got {text.strip()!r}") from None
    if not math.isfinite(value) or not 0 < value < 1:
        raise FieldError(f"{value:g} is outside (0, 1)")
    return text.strip()


def _devices(text: str) -> str:
    """`cpu`, or GPU indices separated by commas, each once."""
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


def _pipeline(text: str) -> str:
    if text.strip() not in ("sync", "async"):
        raise FieldError("expected 'sync' or 'async'")
    return text.strip()


def _extra_args(text: str) -> str:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise FieldError(f"cannot split: {exc}") from None
    if words and not words[0].startswith("--"):
        raise FieldError(f"extra arguments start with a --flag, not {words[0]!r}")
    return text.strip()


@dataclass(frozen=True)
class LaunchField:
    name: str
    label: str
    flag: str | None
    check: Callable[[str], str]
    placeholder: str = ""


LAUNCH_FIELDS: tuple[LaunchField, ...] = (
    LaunchField("target_model", "target model", "--target-model", _required, "path or name"),
    LaunchField("data_dir", "data dir", "--data-dir", _required, "prepared dataset on the box"),
    LaunchField("target_gpus", "target GPUs", "--target-gpus", _devices, "cpu or 0,1,2"),
    LaunchField("drafter_gpus", "drafter GPUs", "--drafter-gpus", _devices, "cpu or 3"),
    LaunchField("pipeline", "pipeline", "--pipeline", _pipeline, "sync or async"),
    LaunchField("epochs", "epochs", "--epochs", _int_in(1), "6"),
    LaunchField("lr", "learning rate", "--lr", _learning_rate, "6e-4"),
    LaunchField("hs_queue_depth", "hs-queue-depth", "--hs-queue-depth", _int_in(1, 4096), "8"),
    LaunchField("hs_min_ready", "hs-min-ready", "--hs-min-ready", _int_in(1, 4096), "2"),
    LaunchField("max_steps", "max steps", "--max-steps", _optional(_int_in(1)), "blank: all"),
    LaunchField("extra", "extra args", None, _extra_args, "--block-size 16 --seed 0"),
)
FIELD_NAMES = tuple(f.name for f in LAUNCH_FIELDS)


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
