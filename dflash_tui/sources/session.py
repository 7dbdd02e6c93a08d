"""One console's conversation with one run directory on the box: following the status
stream with a resume cursor (reconnecting with backoff after a drop), following GPU
readings, and the control calls. Watch mode is enforced here, before anything is sent,
whatever the UI does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from dflash_train import protocol
from dflash_train.protocol import Rejected, Reply, StatusLine
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.deadline import within
from dflash_tui.sources.line_stream import StreamEnd
from dflash_tui.sources.transport import CommandTimeout, HostKeyUnknown, Transport, TransportError

DEFAULT_TRAINER = "dflash-train"
# launch waits on the box for the trainer's run_start line (model and data loading); the
# SSH call waits that long plus CONTROL_TIMEOUT_S.
LAUNCH_WAIT_S = 300.0
CONTROL_TIMEOUT_S = 60.0
ERROR_TAIL_LINES = 8
DEFAULT_BACKOFF = Backoff()
# Set by `dflash-tui serve` for the consoles it starts for browsers: every Session in such a
# process is read-only, whatever its caller, profile or flags ask for.
WATCH_ONLY_ENV = "DFLASH_TUI_WATCH_ONLY"
_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ConnectionStatus = Literal[
    "connecting", "connected", "reconnecting", "failed", "no_run", "no_trainer"
]
# The shell's "command not found": the box answers, but not with a trainer.
NO_TRAINER_EXIT = 127
# What `tail` and `logs` answer for a run dir that does not exist (yet).
RUN_DIR_MISSING = "run_dir_missing"
LOG_LINES = 500


@dataclass(frozen=True)
class ConnectionState:
    """Where a follow stands. `reconnecting` carries the attempt number and the seconds
    until it; `failed` (no further attempts) the reason, and the error itself so the UI
    can offer to trust an unknown host key."""

    status: ConnectionStatus
    attempt: int = 0
    next_in: float | None = None
    reason: str | None = None
    error: TransportError | None = None

    @classmethod
    def connecting(cls) -> ConnectionState:
        return cls("connecting")

    @classmethod
    def connected(cls) -> ConnectionState:
        return cls("connected")

    @classmethod
    def reconnecting(cls, attempt: int, next_in: float, reason: str) -> ConnectionState:
        return cls("reconnecting", attempt, next_in, reason)

    @classmethod
    def failed(cls, reason: str, error: TransportError | None = None) -> ConnectionState:
        return cls("failed", reason=reason, error=error)

    @classmethod
    def no_trainer(cls, reason: str) -> ConnectionState:
        """The box answered and has no `dflash-train` where the console calls it: nothing
        to retry until the operator sets `python` (or presses `r`)."""
        return cls("no_trainer", reason=reason)

    @classmethod
    def no_run(cls, reason: str) -> ConnectionState:
        """The box answered, and there is no run dir: nothing to retry until a launch (or
        the operator's `r`) says there may be one now."""
        return cls("no_run", reason=reason)


class ReadOnlyError(PermissionError):
    """A mutating call on a watch-mode session; nothing was sent."""


class InputError(ValueError):
    """Operator input refused before sending; the message names the field and the reason."""


def check_inert(field: str, value: str) -> str:
    """Refuse what could break the one quoting layer: NUL bytes cannot pass through argv at
    all, and a newline inside quotes is not safe in every remote login shell (csh)."""
    if not isinstance(value, str):
        raise InputError(f"{field}: expected text, got {type(value).__name__}")
    for bad, name in (("\0", "a NUL byte"), ("\n", "a newline"), ("\r", "a carriage return")):
        if bad in value:
            raise InputError(f"{field}: contains {name}")
    return value


def watch_only_forced() -> bool:
    """Whether this process may only watch (the browser consoles of `dflash-tui serve`)."""
    return os.environ.get(WATCH_ONLY_ENV, "") not in ("", "0")


def trainer_prefix(python: str | None) -> tuple[str, ...]:
    """How to call the box's trainer: the `dflash-train` script, or an interpreter path
    running the package (`PATH -m dflash_train`)."""
    if python is None or python == DEFAULT_TRAINER:
        return (DEFAULT_TRAINER,)
    check_inert("python", python)
    if not python.strip():
        raise InputError("python: empty path")
    return (python, "-m", "dflash_train")


class Session:
    def __init__(
        self,
        transport: Transport,
        *,
        run_dir: str,
        python: str | None = DEFAULT_TRAINER,
        read_only: bool,
        on_line: Callable[[StatusLine], None],
        on_connection: Callable[[ConnectionState], None] = lambda state: None,
        on_reject: Callable[[Rejected], None] = lambda rejected: None,
        on_gpu_line: Callable[[StatusLine], None] | None = None,
        history_points: int = 400,
        settings_in_force: Callable[[], Mapping[str, int]] | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        max_attempts: int | None = None,
        control_timeout: float = CONTROL_TIMEOUT_S,
        launch_wait: float = LAUNCH_WAIT_S,
        env_file: str | None = None,
    ) -> None:
        check_inert("run_dir", run_dir)
        if not run_dir.strip():
            raise InputError("run_dir: empty path")
        if run_dir.startswith("-"):
            # Quoting makes it inert for the shell, but argparse would read it as an option.
            raise InputError(f"run_dir: {run_dir!r} starts with '-'")
        self.transport = transport
        self.run_dir = run_dir
        self.trainer = trainer_prefix(python)
        self._read_only = bool(read_only) or watch_only_forced()
        self._on_line = on_line
        self._on_connection = on_connection
        self._on_reject = on_reject
        self._on_gpu_line = on_gpu_line or on_line
        self.history_points = history_points
        self._settings_in_force = settings_in_force
        self.backoff = backoff
        self.max_attempts = max_attempts
        self.control_timeout = control_timeout
        self.launch_wait = launch_wait
        # A file on the box the trainer's variables come from: only its path is sent.
        self.env_file = None if env_file is None else check_inert("env_file", env_file)
        self._cursor: tuple[str | None, int] = (None, -1)
        # Set by `wake()`: waiting streams (backoff, no run dir yet) try again now.
        self._wake = asyncio.Event()
        self.duplicates_dropped = 0
        self.connection = ConnectionState.connecting()

    @property
    def read_only(self) -> bool:
        # No setter: a session made for watching cannot be switched to control.
        return self._read_only

    @property
    def cursor(self) -> tuple[str | None, int]:
        """(run id, last seq delivered); (None, -1) before the first line."""
        return self._cursor

    async def connect(self) -> None:
        """Open the connection now (raises HostKeyUnknown, TransportError)."""
        await self.transport.connect()

    # -----------------------------------------------------------------------------------
    # Following

    def tail_argv(self) -> list[str]:
        run, seq = self._cursor
        argv = [*self.trainer, "tail", self.run_dir, "--follow"]
        if run is not None:
            argv += ["--from-seq", str(seq), "--run", run]
        elif self.history_points:
            # Only a first attach gets the decimated past; a resume wants every line it
            # missed, so the stream has no gap.
            argv += ["--history", str(self.history_points)]
        return argv

    def _deliver(self, line: StatusLine) -> None:
        run, seq = self._cursor
        if line.run == run and line.seq <= seq:
            # The box's markers (end of history, trainer gone) repeat the seq before them.
            if protocol.is_marker(line):
                self._on_line(line)
            else:
                self.duplicates_dropped += 1
            return
        self._cursor = (line.run, line.seq)
        self._on_line(line)

    def _skip_past(self, rejected: Rejected) -> None:
        """A line the box did not send (too long) still used up its seq: the cursor moves
        past it, so a reconnect resumes after it and its notice is not counted twice."""
        run, seq = self._cursor
        if rejected.of_seq is None or rejected.of_run is None:
            return
        if run in (None, rejected.of_run) and rejected.of_seq > seq:
            self._cursor = (rejected.of_run, rejected.of_seq)

    def _report(self, state: ConnectionState) -> None:
        self.connection = state
        self._on_connection(state)

    async def follow(self) -> None:
        """Follow the status stream until cancelled; returns only after reporting `failed`
        (a refused host key or login, or `max_attempts` spent)."""
        handler = self._status_handler(self._deliver, skipped=self._skip_past)
        await self._keep_streaming(self.tail_argv, handler)

    async def follow_gpus(self, interval: float = 2.0) -> None:
        if not interval > 0:
            raise InputError(f"interval: {interval} must be above 0 seconds")
        argv = [*self.trainer, "gpus", "--follow", "--interval", f"{interval:g}"]
        await self._keep_streaming(lambda: argv, self._status_handler(self._on_gpu_line))

    async def follow_logs(
        self,
        on_text: Callable[[str], None],
        on_state: Callable[[ConnectionState], None],
        lines: int = LOG_LINES,
    ) -> None:
        """Follow train.log (`dflash-train logs --follow`); each (re)connection starts with
        the last `lines` lines again, announced to `on_state` as `connected`."""
        argv = [*self.trainer, "logs", self.run_dir, "--lines", str(lines), "--follow"]

        def handle(raw: bytes) -> tuple[bool, Reply | None]:
            if raw.startswith(b'{"v"'):
                reply = protocol.decode_reply(raw)
                if isinstance(reply, Reply) and not reply.ok:
                    return False, reply
            on_text(raw.decode("utf-8", errors="replace"))
            return True, None

        await self._keep_streaming(lambda: argv, handle, report=on_state)

    def wake(self) -> None:
        """Try every waiting stream now (the operator pressed `r`, or a launch made the run
        dir): no backoff left to sit out."""
        self._wake.set()

    async def _sleep(self, delay: float | None) -> None:
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await within(self._wake.wait(), delay)

    def _status_handler(
        self,
        deliver: Callable[[StatusLine], None],
        skipped: Callable[[Rejected], None] = lambda rejected: None,
    ) -> Callable[[bytes], tuple[bool, Reply | None]]:
        def handle(raw: bytes) -> tuple[bool, Reply | None]:
            decoded = protocol.decode_line(raw)
            if isinstance(decoded, StatusLine):
                deliver(decoded)
                return True, None
            # A command that cannot stream says why in a JSON reply: that is the reason
            # to show, not a malformed status line.
            reply = protocol.decode_reply(raw)
            if isinstance(reply, Reply) and not reply.ok:
                return False, reply
            skipped(decoded)
            self._on_reject(decoded)
            return False, None

        return handle

    async def _keep_streaming(
        self,
        make_argv: Callable[[], list[str]],
        handle: Callable[[bytes], tuple[bool, Reply | None]],
        *,
        report: Callable[[ConnectionState], None] | None = None,
    ) -> None:
        report = report or self._report
        attempt = 0
        report(ConnectionState.connecting())
        # After a `no_run` answer the checks go on quietly: `connected` only once a run's
        # lines come, so the header does not flicker on each look.
        waiting_for_run = False
        while True:
            refusal: Reply | None = None
            try:
                async with self.transport.stream(make_argv()) as lines:
                    if not waiting_for_run:
                        report(ConnectionState.connected())
                    async for raw in lines:
                        delivered, refused = handle(raw)
                        refusal = refused or refusal
                        if delivered:
                            # A stream that delivers resets the backoff; one that fails at
                            # once keeps growing it.
                            attempt = 0
                            if waiting_for_run:
                                waiting_for_run = False
                                report(ConnectionState.connected())
                    reason = _end_reason(lines.end, refusal.error if refusal else None)
                    if _no_trainer(lines.end):
                        report(ConnectionState.no_trainer(self._no_trainer_text(reason)))
                        return
            except TransportError as exc:
                if not exc.retryable:
                    report(ConnectionState.failed(str(exc), exc))
                    return
                reason = str(exc)
            if refusal is not None and refusal.error_code == RUN_DIR_MISSING:
                # No reconnect loop: look again only as often as the slowest retry (a run
                # started elsewhere), or at once after a launch or the operator's `r`.
                if not waiting_for_run:
                    report(ConnectionState.no_run(f"no run in {self.run_dir} yet"))
                waiting_for_run = True
                await self._sleep(self.backoff.cap)
                attempt = 0
                continue
            attempt += 1
            if self.max_attempts is not None and attempt > self.max_attempts:
                report(ConnectionState.failed(f"gave up after {attempt - 1} retries: {reason}"))
                return
            delay = self.backoff.delay(attempt)
            report(ConnectionState.reconnecting(attempt, delay, reason))
            await self._sleep(delay)

    # -----------------------------------------------------------------------------------
    # Control

    def _require_control(self, action: str) -> None:
        if self._read_only:
            raise ReadOnlyError(f"{action}: this console is in watch mode (read-only)")

    async def _call(self, command: str, argv: Sequence[str], timeout: float) -> Reply:
        full = [*self.trainer, *argv]
        try:
            result = await self.transport.run(full, timeout=timeout)
        except CommandTimeout as exc:
            return protocol.reply_error(
                command, "timeout", f"{exc}; it may still be running on the box"
            )
        except HostKeyUnknown as exc:
            return protocol.reply_error(command, "host_key_unknown", str(exc))
        except TransportError as exc:
            return protocol.reply_error(command, "unreachable", str(exc))
        decoded = protocol.decode_reply(result.stdout)
        if isinstance(decoded, Reply):
            return decoded
        tail = _tail_text(result.stderr) or decoded.reason
        if result.rc == NO_TRAINER_EXIT:
            return protocol.reply_error(
                command, "no_trainer", self._no_trainer_text(f"exit {result.rc}: {tail}")
            )
        return protocol.reply_error(
            command, "no_reply", f"{command}: no reply (exit {result.rc}): {tail}"
        )

    def _no_trainer_text(self, detail: str) -> str:
        return (
            f"no trainer: {' '.join(self.trainer)} is not on the box ({detail}); "
            "set python (the profile's `python`, or --python) to the trainer's interpreter"
        )

    def _start_options(self, env: Mapping[str, str]) -> list[str]:
        """Options launch and restart share: how long to wait for run_start, and the
        trainer's environment (the box passes nothing else but PATH, HOME and LANG)."""
        options = ["--wait", f"{self.launch_wait:g}"]
        if self.env_file:
            options += ["--env-file", self.env_file]
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise InputError(f"environment variable {name!r}: not a valid name")
            options += ["--env", f"{name}={check_inert(f'environment variable {name}', value)}"]
        return options

    @property
    def _start_timeout(self) -> float:
        return self.launch_wait + self.control_timeout

    async def launch(
        self, train_args: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> Reply:
        self._require_control("launch")
        args = [check_inert(f"launch argument {i + 1}", a) for i, a in enumerate(train_args)]
        # `--prepare -- PREPARE_ARGS -- TRAIN_ARGS` (the form's "prepare first") is launch's
        # own form: no `--` goes before it.
        rest = args if args[:1] == ["--prepare"] else ["--", *args]
        argv = ["launch", self.run_dir, *self._start_options(env or {}), *rest]
        return await self._call("launch", argv, self._start_timeout)

    async def stop(self, timeout: float = 60) -> Reply:
        self._require_control("stop")
        if not timeout > 0:
            raise InputError(f"timeout: {timeout} must be above 0 seconds")
        argv = ["stop", self.run_dir, "--timeout", f"{timeout:g}"]
        return await self._call("stop", argv, timeout + self.control_timeout)

    async def restart(
        self,
        *,
        fresh: bool = False,
        overrides: Mapping[str, str] | None = None,
        settings: Mapping[str, str | int] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Reply:
        """Stop, then start again from the newest checkpoint (or from scratch with
        `fresh`). `overrides` replace recorded train options (`{"lr": "1e-4"}`),
        `settings` are live settings for the new start."""
        self._require_control("restart")
        extra: list[str] = []
        for key, value in (overrides or {}).items():
            if not _OPTION_NAME.fullmatch(key):
                raise InputError(f"restart override {key!r}: not an option name")
            extra += [f"--{key.replace('_', '-')}", check_inert(f"restart override {key}", value)]
        argv = ["restart", self.run_dir, *(["--fresh"] if fresh else [])]
        for key, raw in (settings or {}).items():
            check_inert("setting name", key)
            try:
                number = protocol.parse_setting_value(key, raw)
            except protocol.SettingError as exc:
                raise InputError(str(exc)) from None
            argv += ["--set", f"{key}={number}"]
        argv += self._start_options(env or {})
        if extra:
            argv += ["--", *extra]
        return await self._call("restart", argv, self._start_timeout + self.control_timeout)

    async def set_setting(self, key: str, value: str) -> Reply:
        self._require_control("set")
        check_inert("setting name", key)
        check_inert(key, str(value))
        try:
            number = protocol.parse_setting_value(key, value)
            current = self._settings_in_force() if self._settings_in_force else None
            if current:
                protocol.validate_settings({key: number}, current)
        except protocol.SettingError as exc:
            raise InputError(str(exc)) from None
        argv = ["set", self.run_dir, key, str(number)]
        return await self._call("set", argv, self.control_timeout)

    async def status(self) -> Reply:
        return await self._call("status", ["status", self.run_dir], self.control_timeout)


def _no_trainer(end: StreamEnd | None) -> bool:
    return end is not None and end.returncode == NO_TRAINER_EXIT


def _end_reason(end: StreamEnd | None, refusal: str | None) -> str:
    if end is None:
        return "stream ended"
    why = refusal or _tail_text(end.stderr_tail)
    return f"stream ended (exit {end.returncode})" + (f": {why}" if why else "")


def _tail_text(data: bytes, lines: int = ERROR_TAIL_LINES) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return " | ".join(text.splitlines()[-lines:])
