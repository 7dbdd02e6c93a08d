"""The log and events screens' filter: plain text matches anywhere, ignoring case; a
leading `re:` makes the rest a regular expression. A bad expression is refused with a one-line
reason, and the screen keeps its last good filter. No UI."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

REGEX_PREFIX = "re:"


class FilterError(ValueError):
    pass


@dataclass(frozen=True)
class LineFilter:
    text: str = ""
    pattern: re.Pattern[str] | None = None

    @classmethod
    def parse(cls, text: str) -> LineFilter:
        if text.startswith(REGEX_PREFIX):
            expression = text[len(REGEX_PREFIX) :]
            try:
                return cls(text, re.compile(expression))
            except re.error as exc:
                raise FilterError(f"filter: invalid pattern {expression!r}: {exc}") from None
        return cls(text)

    @property
    def active(self) -> bool:
        return bool(self.text) and self.text != REGEX_PREFIX

    def matches(self, line: str) -> bool:
        if not self.active:
            return True
        if self.pattern is not None:
            return self.pattern.search(line) is not None
        return self.text.casefold() in line.casefold()

    def select(self, lines: Iterable[str]) -> list[str]:
        return [line for line in lines if self.matches(line)]
