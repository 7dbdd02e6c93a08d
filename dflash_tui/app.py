"""The console app: owns the Session and the RunState, runs the Session's I/O in workers,
and redraws the panes from RunState on a timer (never from the I/O path)."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from textual import on, work
from textual.app import App, SystemCommand
from textual.css.query import NoMatches
from textual.screen import Screen

from dflash_train import protocol
from dflash_train.protocol import Reply, StatusLine
from dflash_tui import keymap, themes
from dflash_tui.messages import ControlDone, LogTail, Note
from dflash_tui.pane_refresh import PaneRefresh, event_entries
from dflash_tui.screens.host_key_prompt import HostKeyPrompt
from dflash_tui.screens.main import MainScreen
from dflash_tui.screens.reply import ReplyDialog, reply_line
from dflash_tui.screens.restart_dialog import RestartRequest
from dflash_tui.sources.advised_split import SPLIT_ADVICE
from dflash_tui.sources.alerts import Alert, AlertTracker, osc_notification
from dflash_tui.sources.console_options import ConsoleOptions
from dflash_tui.sources.gpu_source import GpuSourcePicker
from dflash_tui.sources.known_hosts import trust_host_key
from dflash_tui.sources.session import ConnectionState, InputError, ReadOnlyError, Session
from dflash_tui.sources.state import RunState
from dflash_tui.sources.transport import HostKeyUnknown, Transport
from dflash_tui.widgets.events_log import EventEntry

REFRESH_HZ = 2.0
NOTES_KEPT = 2000
# The run's events the events screen can scroll back through (the pane shows the newest).
EVENTS_KEPT = 5000
# An alert's toast stays until dismissed (d, or a click); a reply's goes after a while.
ALERT_TOAST_S = 7 * 24 * 3600.0
REPLY_TOAST_S = 8.0
# The trainer's split advice comes at most every 10 minutes: its toast outlasts a glance away.
ADVICE_TOAST_S = 120.0
# How often a silent or crashed run is checked with `dflash-train status`.
STATUS_EVERY_S = 30.0
# A history whose last line is older than this when the console attaches is checked with
# `status` at once: a live trainer writes more often (GPU readings every 5 s, warm-up beats).
QUIET_AT_ATTACH_S = 15.0


Startup = Callable[["DflashApp"], Awaitable[None]]


class DflashApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "dflash"

    def __init__(
        self,
        transport: Transport,
        options: ConsoleOptions,
        *,
        clock: Callable[[], float] = time.time,
        startup: Startup | None = None,
    ) -> None:
        super().__init__()
        self.transport = transport
        self.options = options
        self.clock = clock
        self.startup = startup
        self.state = RunState(clock=clock, events=EVENTS_KEPT)
        self.alerts = AlertTracker(clock=clock)
        self.gpu_source = GpuSourcePicker(clock=clock)
        self.wandb_url: str | None = None
        self.replies: deque[Reply] = deque(maxlen=50)  # the newest last, for tests and help
        # Control commands answered so far, refusals and transport failures included: what
        # a caller waits on, since a command's worker may start a few turns after its key.
        self.controls_answered = 0
        self._refused_host_key: HostKeyUnknown | None = None
        self.session = self._make_session()
        self.paused = False
        self.connection = "connecting"
        self.notes: deque[EventEntry] = deque(maxlen=NOTES_KEPT)
        self._last_note_key: str | None = None
        self.log_tail: list[str] = []
        self.log_tail_run: str | None = None
        self._last_status_check = -math.inf
        # Lines seen per kind: the panes redraw only when what they show has changed.
        self.seen: Counter[str] = Counter()
        # The stream and the GPU follow connect side by side, so one unknown host reaches
        # us twice: one prompt per host, and a key trusted meanwhile is not asked again.
        self._host_prompts: set[tuple[str, int]] = set()
        self._trusted_keys: set[str] = set()
        self.panes = PaneRefresh()
        self.theme_names: list[str] = []
        self._saved_theme = ""
        self.launch_draft: dict[str, str] = {}  # the launch form's fields as last left
        self.escapes_written: deque[str] = deque(maxlen=20)
        self.bells = 0
        self.toasts: deque[tuple[str, str]] = deque(maxlen=50)  # (title, message)
        self._advice_offered: tuple[str | None, int] | None = None  # (run id, seq)

    # -- wiring ----------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self.options.read_only

    @property
    def target_name(self) -> str:
        return self.options.target_name

    @property
    def run_dir(self) -> str:
        return self.options.run_dir

    def _make_session(self) -> Session:
        return Session(
            self.transport,
            run_dir=self.options.run_dir,
            python=self.options.python,
            read_only=self.options.read_only,
            on_line=self._on_line,
            on_connection=self._on_connection,
            on_reject=self.state.count_rejected,
            on_gpu_line=self._on_gpu_line,
            history_points=self.options.history_points,
            settings_in_force=self.live_settings,
            env_file=self.options.env_file,
        )

    def on_mount(self) -> None:
        # The config file's [keys] (the CLI checked them before the app started).
        self.remapped_keys = keymap.configured()
        self.set_keymap(self.remapped_keys)
        self.theme_names.extend(themes.install(self, self.options.theme))
        self._saved_theme = self.theme
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self.push_screen(self.make_main_screen())
        self.set_interval(1 / REFRESH_HZ, self.redraw)
        self.connect_and_follow()
        if self.startup is not None:
            self.run_worker(self.startup(self), group="startup", name="startup")

    async def on_unmount(self) -> None:
        # End the tail/gpus commands before the loop closes, so no child outlives us.
        io = [w for w in self.workers if w.group in ("stream", "gpus", "status", "startup", "logs")]
        for worker in io:
            worker.cancel()
        with contextlib.suppress(Exception):
            await self.workers.wait_for_complete(io)
        await self.transport.close()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        main = self.main_screen()
        for entry in keymap.KEYMAP:
            if main is None or not main.check_action(entry.action.split("(")[0], ()):
                continue
            yield SystemCommand(
                entry.description,
                f"{entry.help} [{keymap.shown_key(entry)}]",
                lambda action=entry.action: self.call_later(main.run_action, action),
            )
        for name in self.theme_names:
            yield SystemCommand(
                f"Theme: {name}", "switch the colour theme", lambda n=name: self._set_theme(n)
            )

    def make_main_screen(self) -> MainScreen:
        return MainScreen()

    def main_screen(self) -> MainScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                return screen
        return None

    # -- stream I/O (workers) --------------------------------------------------------

    def _on_line(self, line: StatusLine) -> None:
        if line.run != self.state.run_id:
            self.wandb_url = None
        if line.kind == "run_start" and line.get("history") is not True:
            self.log_tail, self.log_tail_run = [], None  # the crash it showed is over
        history_end = line.kind == "event" and line["code"] == "history_end"
        self.state.apply(line)
        self.seen[line.kind] += 1
        alert = self.alerts.on_line(line)
        if alert is not None:
            self.raise_alert(alert)
        if line.kind == "gpu":
            self.gpu_source.trainer_reading(line)
        elif line.kind == "event" and line["code"] == "wandb_run":
            url = line.get("url")
            self.wandb_url = url if isinstance(url, str) and url else None
        elif line.kind == "event" and line["code"] == SPLIT_ADVICE and not line.get("history"):
            self.offer_split_advice()
        elif history_end:
            # The whole past is in: draw every pane now rather than at its next turn.
            self.request_redraw()
            self.offer_split_advice()  # advice the past holds since its latest run_start
            state = self.state
            if state.last_time is not None and state.last_arrival is not None:
                # A GPU reading sent on attach is as old as its line, not "0 s old".
                last_time, last_arrival = state.last_time, state.last_arrival
                self.gpu_source.date_back(lambda t: last_arrival - (last_time - t))
            # The marker dates the silence from the run's last line, not from the attach:
            # a run quiet for longer than a live trainer ever is (it writes a line every
            # few seconds: readings, warm-up beats) is asked about now, not once it reads
            # stalled a minute later, so a trainer that died before the attach reads as a
            # crash within seconds. A live one answers running and nothing changes.
            # (A run that reads stalled is quieter still, whatever its stall threshold.)
            age = self.state.last_line_age()
            limit = min(QUIET_AT_ATTACH_S, self.state.stall_after)
            if self.state.end is None and age is not None and age > limit:
                self._check_status_now(self.clock())  # does its trainer still live?
        elif line.kind == "event" and line["code"] == protocol.TRAINER_GONE:
            # The box saw the run lock free without a run_end: `status` has the log tail.
            self._check_status_now(self.clock())

    def _on_gpu_line(self, line: StatusLine) -> None:
        # `gpus --follow` readings fill the pane while no trainer reports its own (they
        # carry each GPU's role in the run), or once the trainer's are out of date.
        live = self.state.run_state in ("running", "preparing", "stalled")
        shown = self.gpu_source.box_reading(line, run_live=live)
        if shown is not None:
            self.state.apply_gpu_reading(shown)
            self.seen["gpu"] += 1

    def _on_connection(self, state: ConnectionState) -> None:
        self.connection = state.status
        self.alerts.on_connection(state.status)
        if state.status == "reconnecting":
            self.note("warning", f"reconnecting in {state.next_in:.0f} s: {state.reason}", "conn")
        elif state.status == "no_run":
            hint = "r checks again" if self.read_only else "press l to launch"
            self.note("info", f"no run in {self.run_dir} yet — {hint}", "conn")
        elif state.status == "no_trainer":
            self.note("error", f"{state.reason} (r tries again)", "conn")
        elif state.status == "connected":
            self._refused_host_key = None
        elif state.status == "failed":
            if isinstance(state.error, HostKeyUnknown) and state.error.can_be_trusted:
                # Not a failure yet: the prompt asks, and the answer decides.
                self.call_later(self.offer_host_key, state.error)
            else:
                self.note("error", f"connection failed: {state.reason}", "conn")

    @work(group="stream", exclusive=True, name="follow")
    async def connect_and_follow(self) -> None:
        if self.options.follow_gpus:
            self.run_worker(self.session.follow_gpus(), group="gpus", name="gpus", exclusive=True)
        await self.session.follow()

    def offer_host_key(self, exc: HostKeyUnknown) -> None:
        if not exc.can_be_trusted:
            return  # a changed key is never offered for trust from here
        where = (exc.host, exc.port)
        if where in self._host_prompts:
            return
        if exc.fingerprint in self._trusted_keys:
            # A failure from before the trust reached us late: restart only what is not
            # running already (cancelling a follow that is connecting would stall it).
            running = {w.name for w in self.workers if w.is_running}
            if "follow" not in running:
                self.connect_and_follow()
            elif self.options.follow_gpus and "gpus" not in running:
                self.run_worker(
                    self.session.follow_gpus(), group="gpus", name="gpus", exclusive=True
                )
            return
        self._host_prompts.add(where)
        self.note(
            "warning",
            f"unknown host key {exc.fingerprint} for {exc.host}:{exc.port}: trust it or not?",
            "conn",
        )

        def answer(yes: bool | None) -> None:
            self._host_prompts.discard(where)
            if not yes or exc.key is None or exc.known_hosts_path is None:
                self._refused_host_key = exc
                self.note("warning", "host key refused: not connecting (r asks again)")
                return
            trust_host_key(exc.host, exc.port, exc.key, exc.known_hosts_path)
            self._trusted_keys.add(exc.fingerprint)
            self.note("info", f"trusted {exc.host}:{exc.port} ({exc.fingerprint})")
            self.connect_and_follow()

        self.push_screen(HostKeyPrompt(exc.host, exc.port, exc.fingerprint), answer)

    # -- control (workers) -----------------------------------------------------------

    def _control(self, command: str, call: Callable[[], Awaitable[Reply]]) -> None:
        async def send() -> None:
            try:
                reply = await call()
            except ReadOnlyError as exc:
                self.post_message(ControlDone(command, None, f"refused: {exc}"))
            except InputError as exc:
                self.post_message(ControlDone(command, None, f"not sent: {exc}"))
            except Exception as exc:  # any transport failure is reported, never raised
                self.post_message(ControlDone(command, None, f"{type(exc).__name__}: {exc}"))
            else:
                self.post_message(ControlDone(command, reply))

        self.note("info", f"{command}: sent")
        self.run_worker(send(), group="control", name=command)

    def send_launch(self, argv: Sequence[str]) -> None:
        self._control("launch", lambda: self.session.launch(list(argv)))

    def send_restart(self, request: RestartRequest) -> None:
        self._control(
            "restart",
            lambda: self.session.restart(fresh=request.fresh, overrides=request.overrides),
        )

    def send_stop(self) -> None:
        self._control("stop", lambda: self.session.stop())

    def send_min_ready(self, value: int) -> None:
        self._control("set", lambda: self.session.set_setting("hs_min_ready", str(value)))
        self._remember("hs_min_ready", value)  # the launch form's default from now on

    @on(ControlDone)
    def _control_done(self, message: ControlDone) -> None:
        self.controls_answered += 1
        if message.reply is None:
            text = f"{message.command}: {message.problem}"
            self.note("error", text)
            self.toast(text, title=f"{message.command} not sent", severity="error")
            return
        reply = message.reply
        self.replies.append(reply)
        line = reply_line(reply)
        if reply.ok:
            # One human line, kept in events; the dashboard stays in view.
            self.note("info", line)
            self.toast(line, title=message.command, timeout=REPLY_TOAST_S)
            if message.command in ("launch", "restart"):
                self.follow_now()
        else:
            # A failure keeps a modal: the reason and the log tail need reading.
            self.note("error", line)
            self.push_screen(ReplyDialog(reply))

    def follow_now(self) -> None:
        """Follow the stream at once: after a launch made the run dir, or on the operator's
        `r`. A failed follow (host key, login) starts again; a waiting one is woken."""
        running = any(w.name == "follow" and w.is_running for w in self.workers)
        if running and self.connection != "failed":
            self.session.wake()
        else:
            self.connect_and_follow()

    def reconnect_now(self) -> None:
        refused, self._refused_host_key = self._refused_host_key, None
        if refused is not None:
            self.note("info", f"asking again about the host key of {refused.host}:{refused.port}")
        else:
            self.note("info", "reconnecting now")
        self.follow_now()

    @on(Note)
    def _note_message(self, message: Note) -> None:
        self.note(message.level, message.text, message.key)

    @on(LogTail)
    def _log_tail(self, message: LogTail) -> None:
        self.log_tail = message.lines
        self.log_tail_run = message.run_id
        self.request_redraw()

    @work(group="status", exclusive=True, name="status")
    async def check_status(self) -> None:
        """Ask the box itself: a trainer that died without run_end only shows as silence
        in the stream; `status` knows, and sends the train.log tail."""
        try:
            reply = await self.session.status()
        except Exception as exc:  # shown, not raised: the console keeps running
            self.post_message(Note("warning", f"status: {exc}", key="status"))
            return
        self.state.apply_status(reply)
        alert = self.alerts.on_status(reply)
        if alert is not None:
            self.raise_alert(alert)
        data = reply.data
        if reply.ok and (data.get("state") == "crashed" or data.get("reason") == "error"):
            tail = data.get("log_tail") or data.get("error_tail") or []
            lines = tail.splitlines() if isinstance(tail, str) else [str(t) for t in tail]
            self.post_message(LogTail(self.state.run_id, lines))

    # -- alerts ----------------------------------------------------------------------

    def raise_alert(self, alert: Alert) -> None:
        channels = self.options.alerts
        self.note("error", f"ALERT {alert.title}: {alert.text}", source="alert")
        if "bell" in channels:
            self.bells += 1
            self.bell()  # tmux's monitor-bell flags the window
        if "toast" in channels:
            self.toast(alert.text, title=alert.title, severity="error", timeout=ALERT_TOAST_S)
        if "osc" in channels:
            self.write_escape(
                osc_notification(
                    f"dflash: {alert.title}", alert.text, in_tmux=bool(os.environ.get("TMUX"))
                )
            )
        self.request_redraw()

    def offer_split_advice(self) -> None:
        """The trainer's current split advice as a toast, once per advice (a reconnect's
        history sends it again)."""
        advice = self.state.split_advice
        if advice is None or self._advice_offered == (self.state.run_id, advice.seq):
            return
        self._advice_offered = (self.state.run_id, advice.seq)
        text = advice.summary()
        if not self.read_only:
            key = keymap.shown_key(keymap.entry("split_advice"), self.remapped_keys)
            text += f" — press {key} to restart with it"
        self.toast(text, title="split advice", timeout=ADVICE_TOAST_S)

    def write_escape(self, sequence: str) -> None:
        """Bytes for the terminal itself (as `bell()` writes BEL), never drawn."""
        if not self.is_headless and self._driver is not None:
            self._driver.write(sequence)
        self.escapes_written.append(sequence)

    def toast(self, message: str, **kwargs: Any) -> None:
        """A toast, remembered (newest last) so what was shown can be asked later."""
        self.toasts.append((str(kwargs.get("title", "")), message))
        self.notify(message, markup=False, **kwargs)

    def dismiss_alerts(self) -> None:
        self.clear_notifications()
        self.alerts.acknowledge()
        self.request_redraw()

    # -- view state ------------------------------------------------------------------

    def note(
        self, level: str, text: str, key: str | None = None, *, source: str = "console"
    ) -> None:
        if key is not None and self.notes and self._last_note_key == key:
            self.notes.pop()
        self._last_note_key = key
        self.notes.append(EventEntry(self.clock(), level, text, source=source))
        self.call_later(self.redraw)  # the events pane sees the new note; nothing else changed

    def request_redraw(self) -> None:
        self.panes.invalidate()
        self.call_later(self.redraw)

    def launch_defaults(self) -> dict[str, str]:
        defaults = {k: str(v) for k, v in self.options.launch_defaults.items()}
        for key in ("hs_min_ready", "hs_queue_depth"):
            if key in self.state.settings:
                defaults.setdefault(key, str(self.state.settings[key]))
        return defaults

    def live_settings(self) -> dict[str, int]:
        return {**protocol.DEFAULT_SETTINGS, **self.state.settings}

    def run_label(self) -> str:
        return f"{self.state.run_id or '(no run id yet)'} in {self.run_dir}"

    def cycle_theme(self) -> None:
        names = self.theme_names or [self.theme]
        current = names.index(self.theme) if self.theme in names else -1
        self._set_theme(names[(current + 1) % len(names)])

    def _set_theme(self, name: str) -> None:
        self.theme = name
        self.request_redraw()

    def _remember_theme(self, theme: Any) -> None:
        # The signal also fires for the theme set at start: only a change is worth a write.
        if theme.name != self._saved_theme:
            self._saved_theme = theme.name
            self._remember("theme", theme.name)

    def _remember(self, key: str, value: Any) -> None:
        if self.options.remember is None:
            return
        try:
            self.options.remember(key, value)
        except OSError as exc:
            self.note("warning", f"could not save {key}: {exc}")

    # -- drawing ---------------------------------------------------------------------

    def colours(self) -> dict[str, str]:
        return themes.palette(self)

    def badge(self) -> str:
        """The header's word: an alert's cause first, then the connection, then the run."""
        alert = self.alerts.badge
        if alert is not None:
            return alert
        if self._host_prompts:
            return "unknown_host_key"  # waiting for the operator's answer, not failed
        if self.connection != "connected":
            return self.connection
        if any(w.name == "restart" and w.is_running for w in self.workers):
            return "restarting"  # the old trainer's stop is a pass, not the end
        return self.state.run_state

    def last_update_at(self) -> float | None:
        """A moment to show instead of the last update's age (a replay's cursor); None
        for a live console, whose header says how long ago."""
        return None

    def event_entries(self) -> list[EventEntry]:
        return event_entries(self)

    def frame_is_current(self) -> bool:
        return self.panes.frame_is_current(self)

    def redraw(self) -> None:
        main = self.main_screen()
        # is_mounted: the screen has composed its panes (an attached one may not have yet).
        if main is None or not main.is_mounted:
            return
        now = self.clock()
        for alert in self.alerts.check(self.state.run_state, self.connection, now):
            self.raise_alert(alert)
        self.maybe_check_status(now)
        try:
            self.panes.paint(self, main, now)
        except NoMatches:
            return  # the screen is being torn down under us (the app is leaving)

    def maybe_check_status(self, now: float) -> None:
        state = self.state
        if state.run_state not in ("stalled", "crashed") or self.log_tail_run == state.run_id:
            return
        if now - self._last_status_check < STATUS_EVERY_S:
            return
        self._check_status_now(now)

    def _check_status_now(self, now: float) -> None:
        """Ask the box for `status` (whether the trainer lives), at most every STATUS_EVERY_S
        from maybe_check_status."""
        self._last_status_check = now
        self.check_status()
