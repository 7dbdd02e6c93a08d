"""Every profile's run at once, in light summary: per row, the box's `status` now and then
and the stream's tail from a cursor near its end (never the whole history). One loop per
host, on one shared connection, with its own reconnect backoff: a slow or dead host only
ever holds up its own rows."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dflash_train import protocol
from dflash_train.protocol import Reply, StatusLine
from dflash_tui.sources.alerts import AlertTracker
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.deadline import within
from dflash_tui.sources.host_link import HostKey, HostLink, TransportFactory, default_transport
from dflash_tui.sources.pace import eta_s
from dflash_tui.sources.profiles import Profile
from dflash_tui.sources.session import Session
from dflash_tui.sources.state import STALL_AFTER_S, RunState, listed_score

# How far before the stream's end a row's tail starts: enough lines for a rate (ETA), a
# GPU tick and the latest metrics.
TAIL_LINES = 150
STATUS_EVERY_S = 15.0
STATUS_TIMEOUT_S = 10.0
HOST_BACKOFF = Backoff(initial=1.0, cap=30.0)
UNREACHABLE_CODES = frozenset({"unreachable", "timeout", "host_key_unknown"})
# Trouble first; then the runs that are going, then those that are not.
BADGE_ORDER = {
    "crashed": 0,
    "stalled": 1,
    "unreachable": 2,
    "no_trainer": 2,
    "running": 3,
    "connecting": 4,
    "restarting": 4,
    "stopped": 5,
    "finished": 6,
    "no run": 7,
}


@dataclass(frozen=True)
class RowView:
    """What one fleet row shows, read at one moment."""

    name: str
    host: str
    run_id: str | None
    badge: str
    epoch: int | None  # 0-based, as in the stream
    epochs: int | None
    step: int | None
    total_steps: int | None
    eta_s: float | None
    ktok_s: float | None
    loss: float | None
    tau: float | None
    hottest_c: float | None
    age_s: float | None
    alerts: int
    problem: str | None
    read_only: bool

    def sort_key(self) -> tuple[int, int, str]:
        return (BADGE_ORDER.get(self.badge, 9), 0 if self.alerts else 1, self.name)

    def matches(self, text: str) -> bool:
        needle = text.strip().lower()
        fields = (self.name, self.host, self.run_id or "", self.badge)
        return not needle or any(needle in f.lower() for f in fields)


class RowSession(Session):
    """A read-only session that follows from a cursor given by `status` (the stream's tail),
    not from a history summary."""

    def start_at(self, run: str, seq: int) -> None:
        if self.cursor[0] != run:
            self._cursor = (run, seq)


class FleetRow:
    def __init__(
        self,
        profile: Profile,
        link: HostLink,
        clock: Callable[[], float],
        status_timeout: float = STATUS_TIMEOUT_S,
    ) -> None:
        self.profile = profile
        self.link = link
        self.clock = clock
        self.state = RunState(history=256, gpu_history=16, events=50, clock=clock)
        self.alerts = AlertTracker(clock=clock)
        self.status: Mapping[str, Any] | None = None
        self.status_error: str | None = None
        self.status_at: float | None = None
        self.status_broken = False
        self.no_trainer = False  # the box answers, but has no trainer where the profile says
        self.fresh_at: float | None = None  # arrival of the newest line past the status
        # A trainer's run_start arrived after the newest status: the stream is the newer word
        # (a restart's status said restarting, the new trainer has spoken since).
        self.started_after_status = False
        self.session = RowSession(
            link.view(profile),
            run_dir=profile.run_dir,
            python=profile.python,
            read_only=True,
            on_line=self._on_line,
            history_points=0,
            control_timeout=status_timeout,
        )
        self.follow: asyncio.Task[None] | None = None
        # While its dashboard is open the row needs no tail of its own (one channel fewer).
        self.paused = False

    @property
    def name(self) -> str:
        return self.profile.name

    def _on_line(self, line: StatusLine) -> None:
        self.state.apply(line)
        self.alerts.on_line(line)
        status = self.status or {}
        last = status.get("last_seq")
        if line.run != status.get("run_id") or line.seq > (last if isinstance(last, int) else -1):
            self.fresh_at = self.clock()
            if line.kind == "run_start":
                self.started_after_status = True

    async def poll_status(self) -> Reply:
        # Bounded here as a whole: on a host that stopped answering, even opening the
        # channel can hang until the keepalives give up.
        limit = self.session.control_timeout + 1
        try:
            reply = await within(self.session.status(), limit)
        except asyncio.TimeoutError:
            reply = protocol.reply_error("status", "timeout", f"no answer within {limit:g} s")
        now = self.clock()
        if reply.ok:
            self.status, self.status_error, self.status_at = reply.data, None, now
            self.status_broken = self.no_trainer = False
            self.fresh_at = None
            self.started_after_status = False
            self.alerts.on_status(reply)
        elif reply.error_code not in UNREACHABLE_CODES:
            self.status, self.status_error, self.status_at = None, reply.error, now
            # Only a missing run dir means "no run"; anything else (no dflash-train on the
            # box, a bad argument) keeps the run out of reach.
            self.status_broken = reply.error_code != "run_dir_missing"
            self.no_trainer = reply.error_code == "no_trainer"
        return reply

    def cursor_from_status(self) -> tuple[str, int] | None:
        status = self.status or {}
        run, last = status.get("run_id"), status.get("last_seq")
        if not isinstance(run, str) or not isinstance(last, int):
            return None
        return run, max(-1, last - TAIL_LINES)

    def age(self, now: float) -> float | None:
        if self.fresh_at is not None:
            return max(0.0, now - self.fresh_at)
        status = self.status or {}
        age = status.get("last_line_age")
        if not isinstance(age, (int, float)) or self.status_at is None:
            return None
        return age + max(0.0, now - self.status_at)

    def badge(self, now: float, reachable: bool | None) -> str:
        if reachable is False:
            return "unreachable"
        state = self.state
        status = self.status
        if self.started_after_status or state.run_id == (status or {}).get("run_id"):
            if state.end is not None:
                return state.end_state(now)
            if state.crashed_by_status:
                return "crashed"  # the box's tail saw the trainer go without a run_end
            if self.started_after_status:
                # Seen in tmux: a fleet row read RESTARTING 13 s past the new trainer's
                # first steps, until its next status, which is older than this start.
                return self._running_or_stalled(now)
        if status is None:
            if self.no_trainer:
                return "no_trainer"
            if self.status_error is None:
                return "connecting"
            return "unreachable" if self.status_broken else "no run"
        verdict = status.get("state")
        if verdict == "not_started":
            return "no run"
        if verdict == "finished":
            return "crashed" if status.get("reason") == "error" else "finished"
        if verdict in ("crashed", "stopped", "restarting"):
            return verdict
        return self._running_or_stalled(now)

    def _running_or_stalled(self, now: float) -> str:
        age = self.age(now)
        return "stalled" if age is not None and age > STALL_AFTER_S else "running"

    def view(self, now: float, reachable: bool | None, problem: str | None) -> RowView:
        state = self.state
        status = self.status or {}
        badge = self.badge(now, reachable)
        connection = {True: "connected", False: "failed"}.get(reachable, "connecting")
        self.alerts.check(badge, connection, now)  # a stall alerts; the rest arrive as lines
        temps = [g.get("temp_c") for g in state.gpus]
        hottest = max((t for t in temps if isinstance(t, (int, float))), default=None)
        step = state.step if state.step is not None else status.get("last_step")
        total = state.total_steps or status.get("total_steps")
        return RowView(
            name=self.name,
            host=self.link.key.label,
            run_id=status.get("run_id") or state.run_id,
            badge=badge,
            epoch=state.epoch,
            epochs=state.epochs,
            step=step,
            total_steps=total,
            # The tail rarely reaches back to run_start: the total comes from `status` then.
            eta_s=eta_s(state.steps_per_s, step, total) if badge == "running" else None,
            ktok_s=state.latest("ktok_s"),
            loss=state.latest("loss"),
            tau=_heldout_tau(state, status),
            hottest_c=hottest,
            age_s=self.age(now),
            alerts=len(self.alerts.active),
            problem=(problem or self.status_error) if badge == "unreachable" else self.status_error,
            read_only=self.profile.watch,
        )

    def start_following(self) -> None:
        cursor = self.cursor_from_status()
        if cursor is None or self.paused or (self.follow is not None and not self.follow.done()):
            return
        self.session.start_at(*cursor)
        self.follow = asyncio.ensure_future(self.session.follow())

    async def stop_following(self) -> None:
        task, self.follow = self.follow, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def _heldout_tau(state: RunState, status: Mapping[str, Any]) -> float | None:
    """The newest held-out tau: the stream's, else (its eval event lies before the tail the
    row follows) the newest scored checkpoint's in `status`, else the training tau."""
    if state.heldout is not None:
        return state.heldout.score
    listed = status.get("checkpoint_list")
    # The box lists a finite number or null (checkpoint/heldout_score.py reads it so); a
    # hybrid target's checkpoints have only the teacher-forced one.
    scored = [c for c in listed or () if isinstance(c, Mapping) and listed_score(c) is not None]
    if scored:
        return listed_score(max(scored, key=lambda c: c.get("step") or 0))
    return state.latest("tau")


class HostWatch:
    """The rows of one host and the loop that keeps them current."""

    def __init__(self, link: HostLink, backoff: Backoff, status_every: float) -> None:
        self.link = link
        self.rows: list[FleetRow] = []
        self.backoff = backoff
        self.status_every = status_every
        self.reachable: bool | None = None
        self.problem: str | None = None
        self.attempt = 0
        self.wake = asyncio.Event()

    async def run(self) -> None:
        try:
            while True:
                replies = await self._poll()
                down = [r for r in replies if not r.ok and r.error_code in UNREACHABLE_CODES]
                if replies and len(down) == len(replies):
                    self.reachable, self.problem = False, down[0].error
                    for row in self.rows:
                        await row.stop_following()
                    # The next attempt opens a fresh connection, not the stuck one.
                    await self.link.close()
                    self.attempt += 1
                    await self._sleep(self.backoff.delay(self.attempt))
                    continue
                self.reachable, self.problem, self.attempt = True, None, 0
                for row in self.rows:
                    row.start_following()
                await self._sleep(self.status_every)
        finally:
            for row in self.rows:
                await row.stop_following()

    async def _poll(self) -> list[Reply]:
        """Each row's status, one at a time: every live row already holds a channel for its
        tail, and OpenSSH allows a connection 10 at once (MaxSessions). A host that does not
        answer the first poll (refused, or silent past the timeout) is down: the others
        would only wait for the same."""
        replies = []
        for row in list(self.rows):
            reply = await row.poll_status()
            replies.append(reply)
            if not reply.ok and reply.error_code in UNREACHABLE_CODES:
                break
        return replies

    async def _sleep(self, seconds: float) -> None:
        # A new row (a profile added from the fleet) wakes the loop early.
        self.wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await within(self.wake.wait(), seconds)


class Fleet:
    """Rows for profiles, grouped by host. `run()` until cancelled; `views()` any time."""

    def __init__(
        self,
        profiles: Iterable[Profile],
        *,
        make_transport: TransportFactory = default_transport,
        clock: Callable[[], float] = time.time,
        backoff: Backoff = HOST_BACKOFF,
        status_every: float = STATUS_EVERY_S,
        status_timeout: float = STATUS_TIMEOUT_S,
    ) -> None:
        self.status_timeout = status_timeout
        self.make_transport = make_transport
        self.clock = clock
        self.backoff = backoff
        self.status_every = status_every
        self.hosts: dict[HostKey, HostWatch] = {}
        self.rows: dict[str, FleetRow] = {}
        self._tasks: dict[HostKey, asyncio.Task[None]] = {}
        self._running = False
        for profile in profiles:
            self.add(profile)

    def add(self, profile: Profile) -> FleetRow:
        if profile.name in self.rows:
            raise ValueError(f"profile {profile.name!r}: already in the fleet")
        key = HostKey.of(profile)
        watch = self.hosts.get(key)
        if watch is None:
            link = HostLink(key, self.make_transport)
            watch = self.hosts[key] = HostWatch(link, self.backoff, self.status_every)
        row = FleetRow(profile, watch.link, self.clock, self.status_timeout)
        watch.rows.append(row)
        self.rows[profile.name] = row
        if self._running:
            self._start(key, watch)
            watch.wake.set()
        return row

    def _start(self, key: HostKey, watch: HostWatch) -> None:
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.ensure_future(watch.run())

    def start(self) -> None:
        """Start every host's loop in the running event loop."""
        self._running = True
        for key, watch in self.hosts.items():
            self._start(key, watch)

    async def close(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()
        for watch in self.hosts.values():
            await watch.link.close()

    def views(self, now: float | None = None) -> list[RowView]:
        now = self.clock() if now is None else now
        out = []
        for watch in self.hosts.values():
            for row in watch.rows:
                out.append(row.view(now, watch.reachable, watch.problem))
        return sorted(out, key=RowView.sort_key)

    def transport_for(self, name: str) -> Any:
        """The shared-connection transport a dashboard of this row uses."""
        row = self.rows[name]
        return row.link.view(row.profile)

    def acknowledge(self, name: str) -> None:
        self.rows[name].alerts.acknowledge()

    async def pause(self, name: str) -> None:
        row = self.rows[name]
        row.paused = True
        await row.stop_following()

    def resume(self, name: str) -> None:
        row = self.rows[name]
        row.paused = False
        row.start_following()
