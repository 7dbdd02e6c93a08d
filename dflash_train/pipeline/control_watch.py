"""Watches control.json for new revisions and turns each into an applied or rejected
decision on the live settings; the monitor thread polls it and reports the outcome."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dflash_train import protocol


@dataclass(frozen=True)
class ControlOutcome:
    """What the trainer answers for one revision (rev None: the file itself was unreadable)."""

    rev: int | None
    applied: bool
    message: str
    settings: dict[str, int]


def read_control_rev(path: Path) -> int | None:
    try:
        decoded = protocol.decode_control(path.read_text(encoding="utf-8"))
    except OSError:
        return None
    return decoded.rev if isinstance(decoded, protocol.ControlFile) else None


class ControlWatcher:
    """Answers each revision above `baseline_rev` once. `apply` receives validated values
    and may raise ValueError to reject them."""

    def __init__(
        self,
        path: Path,
        *,
        current: Callable[[], Mapping[str, int]],
        apply: Callable[[dict[str, int]], None],
        baseline_rev: int | None,
    ) -> None:
        self.path = path
        self._current = current
        self._apply = apply
        self.last_rev = baseline_rev
        self._last_signature: tuple[int, int] | None = None

    def poll(self) -> ControlOutcome | None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        signature = (stat.st_mtime_ns, stat.st_size)
        if signature == self._last_signature:
            return None
        self._last_signature = signature
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            return ControlOutcome(None, False, f"control.json: unreadable: {exc}", {})
        decoded = protocol.decode_control(text)
        if isinstance(decoded, protocol.Rejected):
            return ControlOutcome(None, False, decoded.reason, {})
        if self.last_rev is not None and decoded.rev <= self.last_rev:
            return None
        self.last_rev = decoded.rev
        current = dict(self._current())
        try:
            parsed = protocol.validate_settings(decoded.settings, current)
            self._apply(parsed)
        except (protocol.SettingError, ValueError) as exc:
            return ControlOutcome(decoded.rev, False, str(exc), current)
        merged = {**current, **parsed}
        message = " ".join(f"{k}={v}" for k, v in sorted(parsed.items())) or "no change"
        return ControlOutcome(decoded.rev, True, message, merged)
