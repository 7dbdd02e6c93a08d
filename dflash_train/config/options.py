"""One training option: its type, default, bounds and help, and how a raw value (a
command-line word, a TOML or JSON value, an environment variable, a console field) becomes
a checked value. Standard library only: the console imports it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("int", "float", "bool", "str", "choice", "devices")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
# Words that mean "not set" for an option whose default is None (a console field or a
# `--set max_steps=none`).
NULL_WORDS = ("", "none", "null")


class OptionError(ValueError):
    """The reason a value is refused, without the option's name (the caller adds it)."""


def _shown(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 42 else text[:40] + "…"


def _number_text(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def parse_devices(raw: object) -> tuple[str, ...]:
    """`cpu`, `cpu,cpu`, `0,1`, `cuda:0`, or a list of those → torch device strings."""
    if isinstance(raw, str):
        parts: Sequence[object] = [p.strip() for p in raw.split(",")]
    elif isinstance(raw, (list, tuple)):
        parts = raw
    else:
        raise OptionError(f"expected a device list such as '0,1' or 'cpu', got {_shown(raw)}")
    devices = []
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool) and part >= 0:
            devices.append(f"cuda:{part}")
            continue
        text = part.strip() if isinstance(part, str) else None
        if text == "cpu":
            devices.append("cpu")
        elif text is not None and text.isdigit():
            devices.append(f"cuda:{int(text)}")
        elif text is not None and text.startswith("cuda:") and text[5:].isdigit():
            devices.append(f"cuda:{int(text[5:])}")
        else:
            raise OptionError(
                f"{_shown(part)} is not a device (use cpu, a GPU index, or a comma-separated list)"
            )
    if not devices:
        raise OptionError("no device named")
    return tuple(devices)


@dataclass(frozen=True)
class Option:
    """`name` and `group` are filled in from the dataclass field the option describes."""

    kind: str
    default: Any
    help: str
    name: str = ""
    group: str = ""
    minimum: float | None = None  # value >= minimum
    maximum: float | None = None  # value <= maximum
    above: float | None = None  # value > above
    below: float | None = None  # value < below
    choices: tuple[str, ...] = ()
    required: bool = False
    env: str | None = None  # an environment variable that may set it
    metavar: str | None = None
    live: bool = False  # changeable while the run trains (`dflash-train set`)
    repeatable: bool = False  # the flag may be given again; the values form a tuple
    rule: Callable[[Any], None] | None = None  # more checks of a parsed value (OptionError)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def nullable(self) -> bool:
        return self.default is None and not self.required

    def bounds(self) -> str:
        """The bounds in words, for help texts and the console's hints."""
        parts = []
        if self.minimum is not None:
            parts.append(f">= {_number_text(self.minimum)}")
        if self.above is not None:
            parts.append(f"> {_number_text(self.above)}")
        if self.maximum is not None:
            parts.append(f"<= {_number_text(self.maximum)}")
        if self.below is not None:
            parts.append(f"< {_number_text(self.below)}")
        if self.choices:
            parts.append(" | ".join(self.choices))
        return ", ".join(parts)

    def parse(self, raw: object) -> Any:
        """The checked value of `raw`; raises OptionError with the reason. A repeatable
        option given more than once (a list) is a tuple of checked values; given once, the
        value itself."""
        if self.repeatable and isinstance(raw, (list, tuple)):
            if not raw:
                raise OptionError("a value is required")
            values = tuple(self.parse(item) for item in raw)
            return values[0] if len(values) == 1 else values
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in NULL_WORDS):
            if self.nullable:
                return None
            if raw is None or not raw.strip():
                raise OptionError("required" if self.required else "a value is required")
        if self.kind == "devices":
            return parse_devices(raw)
        if self.kind == "bool":
            return self._parse_bool(raw)
        if self.kind in ("str", "choice"):
            text = self._parse_text(raw)
            if self.rule is not None:
                self.rule(text)
            return text
        value = self._parse_number(raw)
        self._check_bounds(value)
        return value

    def _parse_bool(self, raw: object) -> bool:
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise OptionError(f"expected true or false, got {_shown(raw)}")

    def _parse_text(self, raw: object) -> str:
        if not isinstance(raw, str):
            raise OptionError(f"expected a string, got {_shown(raw)}")
        text = raw.strip()
        if self.choices and text not in self.choices:
            words = [repr(c) for c in self.choices]
            listed = " or ".join(words) if len(words) == 2 else "one of " + ", ".join(words)
            raise OptionError(f"expected {listed}, got {_shown(text)}")
        if not text:
            raise OptionError("must not be empty")
        return text

    def _parse_number(self, raw: object) -> int | float:
        if isinstance(raw, bool):
            raise OptionError(f"expected a number, got a boolean ({raw})")
        if self.kind == "int":
            if isinstance(raw, int):
                return raw
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            try:
                return int(str(raw).strip(), 10)
            except ValueError:
                raise OptionError(f"expected an integer, got {_shown(raw)}") from None
        if isinstance(raw, (int, float)):
            value = float(raw)
        else:
            try:
                value = float(str(raw).strip())
            except ValueError:
                raise OptionError(f"expected a number such as 6e-4, got {_shown(raw)}") from None
        if not math.isfinite(value):
            raise OptionError(f"expected a finite number, got {_shown(raw)}")
        return value

    def _check_bounds(self, value: float) -> None:
        shown = _number_text(value)
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            ends = ["" if end is None else _number_text(end) for end in (low, high)]
            raise OptionError(f"{shown} is out of range {ends[0]}..{ends[1]}")
        if self.above is not None and value <= self.above:
            raise OptionError(f"must be above {_number_text(self.above)}, got {shown}")
        if self.below is not None and value >= self.below:
            raise OptionError(f"must be below {_number_text(self.below)}, got {shown}")

    def to_json(self, value: Any) -> Any:
        """The value as JSON/TOML holds it (device tuples become lists)."""
        return list(value) if isinstance(value, tuple) else value

    def text(self, value: Any) -> str:
        """The value as one would type it on a command line or in a console field."""
        if value is None:
            return ""
        if self.repeatable and isinstance(value, tuple):
            return " ".join(self.text(item) for item in value)
        if isinstance(value, tuple):
            return ",".join(d.removeprefix("cuda:") for d in value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return repr(value)
        return str(value)


def option(kind: str, default: Any, help: str, **details: Any) -> Any:
    """A dataclass field carrying its Option (see train_config.py)."""
    if kind not in KINDS:
        raise ValueError(f"option kind {kind!r} is not one of {KINDS}")
    spec = Option(kind=kind, default=default, help=help, **details)
    return field(default=default, metadata={"option": spec})
