"""Progress of long foreground work on stderr: `train`'s steps (one line per `--log-every`
steps) and `eval`'s prompts. A tqdm bar when stderr is a terminal; plain lines otherwise
(train.log, a pipe, CI), each with done/total, the caller's figures and the time left."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    if hours:
        return f"{hours}h {rest // 60:02d}m"
    return f"{rest // 60}m {rest % 60:02d}s" if rest >= 60 else f"{rest}s"


class ProgressLine:
    """`update(done, figures)` as work advances; the ETA comes from the rate since the first
    update (start-up and compilation are not in it)."""

    def __init__(
        self,
        what: str,
        total: int,
        *,
        stream: TextIO | None = None,
        bar: bool | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.what, self.total = what, max(1, total)
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self._first: tuple[int, float] | None = None
        self._bar: Any = None
        if self.stream.isatty() if bar is None else bar:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=what, file=self.stream, dynamic_ncols=True)

    def eta(self, done: int) -> str:
        now = self.clock()
        if self._first is None:
            self._first = (done, now)
            return "ETA —"
        first_done, first_at = self._first
        if done <= first_done:
            return "ETA —"
        rate = (done - first_done) / max(1e-9, now - first_at)
        return f"ETA {duration((self.total - done) / rate)}"

    def update(self, done: int, figures: str) -> None:
        eta = self.eta(done)
        if self._bar is not None:
            self._bar.n = min(done, self.total)
            self._bar.set_postfix_str(figures, refresh=True)
            return
        print(f"{self.what} {done}/{self.total}  {figures}  {eta}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def step_figures(fields: dict[str, Any]) -> str:
    """A step line's figures as `train` prints them."""

    def shown(name: str, spec: str) -> str:
        value = fields.get(name)
        return "—" if value is None else format(value, spec)

    return (
        f"loss {shown('loss', '.4f')}  acc {shown('acc', '.3f')}  {shown('ktok_s', '.1f')} Ktok/s"
    )
