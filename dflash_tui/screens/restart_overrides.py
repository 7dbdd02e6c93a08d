"""The restart dialog's overrides: `key=value` words for any train option, checked with the
trainer's own rules before anything is sent: live settings against the values in force (the
protocol's rules), every other option by the trainer's option table. No Textual here."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from dflash_train import protocol
from dflash_train.config import OPTIONS, ConfigError, parse_option
from dflash_train.config.train_config import RESTART_OWNED


def parse_overrides(text: str, current: Mapping[str, int]) -> dict[str, str]:
    """`lr=1e-4 epochs=8 hs_min_ready=4` -> {"lr": "1e-4", ...}; raises SettingError with a
    one-line reason naming the word or option at fault."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise protocol.SettingError(f"overrides: cannot split: {exc}") from None
    updates: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise protocol.SettingError(f"overrides: {word!r} is not key=value")
        if key in updates:
            raise protocol.SettingError(f"{key}: given twice")
        updates[key] = value
    live = {k: v for k, v in updates.items() if k in protocol.LIVE_SETTINGS}
    checked = {k: str(v) for k, v in protocol.validate_settings(live, current).items()}
    for key, value in updates.items():
        if key in live:
            continue
        if key not in OPTIONS:
            raise protocol.SettingError(f"{key}: unknown setting (no such train option)")
        if key in RESTART_OWNED:
            raise protocol.SettingError(f"{key}: set by restart itself (resume or fresh)")
        try:
            parse_option(key, value)
        except ConfigError as exc:
            raise protocol.SettingError(str(exc)) from None
        checked[key] = value
    return {key: checked[key] for key in updates}
