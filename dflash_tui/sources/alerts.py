"""When the console must call the operator: a crash (or `run_end` with reason error), a
stall, a non-finite step, a failed checkpoint, a connection lost for over a minute. One
alert per cause, not per line: a run's causes alert once per run id, a stall and a lost
connection again only after they cleared. Also the terminal escapes that carry an alert
out of the console (bell, OSC 9 / OSC 777 desktop notifications, through tmux). No UI."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dflash_train.protocol import TRAINER_GONE, Reply, StatusLine, is_crash_report

CHANNELS = ("bell", "toast", "osc")
DEFAULT_CHANNELS: tuple[str, ...] = ("bell", "toast")
LOST_AFTER_S = 60.0
SETTLE_S = 5.0

# cause -> (title, the header badge's word); the order is the badge's precedence.
CAUSES: dict[str, tuple[str, str]] = {
    "crash": ("run crashed", "crashed"),
    "checkpoint_failed": ("checkpoint failed", "checkpoint_failed"),
    "restart_failed": ("restart failed", "restart_failed"),
    "nonfinite": ("non-finite step", "nan_steps"),
    "connection_lost": ("connection lost", "connection_lost"),
    "stall": ("run stalled", "stalled"),
}
# Causes that belong to one run: a new run id forgets them.
RUN_CAUSES = frozenset({"crash", "checkpoint_failed", "nonfinite", "restart_failed"})
EVENT_CAUSES = {
    "nonfinite_step": "nonfinite",
    "checkpoint_failed": "checkpoint_failed",
    "restart_failed": "restart_failed",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Alert:
    cause: str
    text: str  # one line: what happened and why
    t: float

    @property
    def title(self) -> str:
        return CAUSES[self.cause][0]

    @property
    def badge(self) -> str:
        return CAUSES[self.cause][1]


def check_channels(where: str, channels: Iterable[str]) -> tuple[str, ...]:
    """The profile's `alerts` list, checked: a one-line error names the bad entry."""
    chosen = tuple(channels)
    for name in chosen:
        if name not in CHANNELS:
            raise ValueError(f"{where}: {name!r} is not one of {', '.join(CHANNELS)}")
    return chosen


class AlertTracker:
    def __init__(
        self, *, lost_after: float = LOST_AFTER_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.lost_after = lost_after
        self.clock = clock
        self.run_id: str | None = None
        self.raised: list[Alert] = []  # every alert, oldest first
        self.active: dict[str, Alert] = {}  # what the header names now
        self._armed_out: set[str] = set()  # causes that already alerted and have not cleared
        self._was_connected = False
        self._connected_since: float | None = None
        # `status` on the box said a trainer holds the run lock (set by on_status).
        self._trainer_alive = False
        self._lost_since: float | None = None

    # -- inputs ------------------------------------------------------------------------

    def on_line(self, line: StatusLine) -> Alert | None:
        if line.run != self.run_id and line.run != "gpus":
            self._new_run(line.run)
        elif line.kind == "run_start" and line.get("history") is not True:
            self._new_run(line.run)  # restarted under the same id: a new life, new alerts
        if line.kind == "run_end" and line["reason"] == "error":
            tail = line.get("error_tail")
            last = tail.strip().splitlines()[-1] if isinstance(tail, str) and tail.strip() else ""
            text = f"run {line.run} ended with an error (exit {line['exit_code']})"
            return self._raise("crash", text + (f": {last}" if last else ""))
        if line.kind == "event" and line["code"] == TRAINER_GONE:
            return self._raise("crash", f"{line['message']} (run {line.run})")
        if line.kind == "event" and line.get("history") is not True:
            cause = EVENT_CAUSES.get(line["code"])
            if cause is not None:
                return self._raise(cause, f"{line['message']} (run {line.run})")
        return None

    def on_status(self, reply: Reply) -> Alert | None:
        """The box's own verdict: a trainer killed without a run_end shows only here, and a
        silent stream is a stall only while the trainer still lives (else it is a crash:
        one alert, not a stall and then a crash)."""
        data = reply.data
        if reply.ok and data.get("state") in ("running", "stalled"):
            self._trainer_alive = True
        if not reply.ok or data.get("state") != "crashed":
            return None
        self._trainer_alive = False
        run = data.get("run_id")
        if isinstance(run, str) and run != self.run_id:
            self._new_run(run)
        tail = data.get("log_tail") or []
        if is_crash_report(tail):
            last = str(tail[0])  # "Fatal Python error: Segmentation fault": the cause
        else:
            last = next((str(t) for t in reversed(tail) if str(t).strip()), "")
        text = f"the trainer of run {run} is gone without ending its stream"
        return self._raise("crash", text + (f"; train.log: {last}" if last else ""))

    def on_connection(self, status: str) -> None:
        if status != "connected":
            self._connected_since = None
        elif self._connected_since is None:
            self._connected_since = self.clock()

    def check(self, run_state: str, connection: str, now: float | None = None) -> list[Alert]:
        """Conditions that last: call on every redraw tick."""
        now = self.clock() if now is None else now
        out: list[Alert] = []
        # Just (re)connected, the resumed stream is still catching up: not a stall yet.
        settled = self._connected_since is not None and now - self._connected_since >= SETTLE_S
        if run_state == "stalled" and settled and self._trainer_alive:
            alert = self._raise("stall", "no line from the trainer for over a minute")
            if alert is not None:
                out.append(alert)
        elif run_state != "stalled" and connection == "connected":
            self._clear("stall")
            self._trainer_alive = False  # asked again at the next stall
        # Disconnected, silence says nothing about the trainer: the lost connection alerts.
        if connection == "connected":
            self._was_connected = True
            self._lost_since = None
            self._clear("connection_lost")
        elif self._was_connected and connection != "no_run":
            if self._lost_since is None:
                self._lost_since = now
            elif now - self._lost_since >= self.lost_after:
                lost = now - self._lost_since
                alert = self._raise("connection_lost", f"no connection to the box for {lost:.0f} s")
                if alert is not None:
                    out.append(alert)
        return out

    def acknowledge(self) -> None:
        """The operator has seen them: the badge goes back to the run's state. Nothing
        alerts again for these causes until they clear or a new run starts."""
        self.active.clear()

    # -- reading -----------------------------------------------------------------------

    @property
    def badge(self) -> str | None:
        for cause in CAUSES:
            if cause in self.active:
                return CAUSES[cause][1]
        return None

    # -- internals ---------------------------------------------------------------------

    def _new_run(self, run: str) -> None:
        self.run_id = run
        for cause in RUN_CAUSES:
            self._armed_out.discard(cause)
            self.active.pop(cause, None)

    def _raise(self, cause: str, text: str) -> Alert | None:
        if cause in self._armed_out:
            return None
        self._armed_out.add(cause)
        alert = Alert(cause, _one_line(text), self.clock())
        self.raised.append(alert)
        self.active[cause] = alert
        return alert

    def _clear(self, cause: str) -> None:
        self._armed_out.discard(cause)
        self.active.pop(cause, None)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(_CONTROL.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def osc_notification(title: str, body: str, *, in_tmux: bool) -> str:
    """Desktop notification escapes: OSC 9 (iTerm2, kitty, WezTerm, Windows Terminal) and
    OSC 777 (foot, Ghostty, VTE, urxvt); a terminal ignores the one it does not know.
    Inside tmux they are wrapped for passthrough (tmux needs `allow-passthrough on`);
    over SSH they are just bytes on the terminal, so they reach the operator's desktop."""
    title = _one_line(title, 80).replace(";", ",")
    body = _one_line(body, 200)
    text = f"\x1b]9;{title}: {body}\x07\x1b]777;notify;{title};{body.replace(';', ',')}\x07"
    if not in_tmux:
        return text
    return "\x1bPtmux;" + text.replace("\x1b", "\x1b\x1b") + "\x1b\\"
