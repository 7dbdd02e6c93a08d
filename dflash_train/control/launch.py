"""Start a trainer detached from the caller and verify it started: its own session,
stdin from /dev/null, output appended to train.log, an explicit minimal environment, and
success only once the run lock is held and this run's `run_start` is in the stream."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_train import protocol
from dflash_train.checkpoint import layout as checkpoint_layout
from dflash_train.config import ResolvedConfig
from dflash_train.control.preflight import (
    PreflightError,
    preflight_config,
    resolve_launch_config,
)
from dflash_train.control.run_config import with_values, write_run_config
from dflash_train.control.run_status import log_tail
from dflash_train.rundir import RunDir, atomic_write_json, lock_holder_pid, lock_is_held, read_json
from dflash_train.stream.reader import find_lines, last_record

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_PARTS = ("API_KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE")
REDACTED = "<redacted>"
# The caller's variables a trainer needs; nothing else of the caller's environment
# passes (inside `pct exec` the SSH session's environment would leak in).
INHERITED_ENV = ("PATH", "HOME", "LANG")
POLL_S = 0.2
TERM_GRACE_S = 5.0
LOG_TAIL_LINES = 30


class ControlBusy(RuntimeError):
    pass


@contextlib.contextmanager
def control_guard(run_dir: RunDir) -> Iterator[None]:
    """One launch, restart or set at a time per run dir: an flock on the directory itself, so
    two racing launches cannot both pass the run-lock check before the trainer takes it."""
    run_dir.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir.root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ControlBusy(
                f"run_dir: another launch, restart or set on {run_dir.root} is in progress"
            ) from None
        yield
    finally:
        os.close(fd)


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.fullmatch(name):
            raise PreflightError("bad_env", f"env: {pair!r} is not NAME=VALUE")
        env[name] = value
    return env


def load_env_file(path: str) -> dict[str, str]:
    """Variables for the trainer from a file on the box (`NAME=VALUE` lines, `#` comments,
    an optional `export `): how W&B keys reach a trainer without passing through a
    console. The file must be private (mode 0600 or stricter); no value is ever echoed."""
    where = Path(path).expanduser()
    try:
        st = where.stat()
    except OSError as exc:
        raise PreflightError("bad_env_file", f"env_file: {where}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PreflightError("bad_env_file", f"env_file: {where} is not a regular file")
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        raise PreflightError(
            "bad_env_file",
            f"env_file: {where} is mode {mode:04o}; it holds secrets: chmod 600 {where}",
        )
    env: dict[str, str] = {}
    try:
        text = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PreflightError("bad_env_file", f"env_file: {where}: cannot read: {exc}") from None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not ENV_NAME.fullmatch(name):
            # The line may hold a secret: name its number, never its text.
            raise PreflightError("bad_env_file", f"env_file: {where} line {number}: not NAME=VALUE")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name] = value
    return env


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in SECRET_PARTS) or upper.endswith("_KEY")


def redacted(env: Mapping[str, str]) -> dict[str, str]:
    return {k: REDACTED if is_secret(k) else v for k, v in env.items()}


def trainer_env(run_id: str, overrides: Mapping[str, str]) -> dict[str, str]:
    env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    # train.log should show a crash's last words even when the process is killed.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    env["DFLASH_RUN_ID"] = run_id
    return env


@dataclass(frozen=True)
class Started:
    proc: subprocess.Popen[bytes]
    run_id: str
    log_offset: int
    baseline_seq: int
    started_at: float
    mode: str = "train"  # or "prepare" (launch --prepare)


def _start(
    run_dir: RunDir,
    run_id: str,
    train_args: Sequence[str],
    env: Mapping[str, str],
    env_file: str | None = None,
    argv: list[str] | None = None,
) -> Started:
    """`argv`: what to run instead of the trainer (a launched prepare)."""
    mode = "prepare" if argv is not None and "prepare" in argv[3:4] else "train"
    if argv is None:
        # The trainer runs exactly the config the run dir records (written just before).
        argv = [sys.executable, "-m", "dflash_train", "train", "--output-dir", str(run_dir.root)]
        argv += ["--config", str(run_dir.config)]
    last = last_record(run_dir.status)
    # A resumed run id continues its seq: only a run_start past this one is ours.
    baseline = last.seq if last is not None and last.run == run_id else -1
    started_at = time.time()
    with run_dir.log.open("ab") as log:
        log_offset = log.tell()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started_at))
        log.write(f"==== dflash-train launch {run_id} at {stamp} UTC ====\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=trainer_env(run_id, {**(load_env_file(env_file) if env_file else {}), **env}),
            start_new_session=True,
            close_fds=True,
        )
    atomic_write_json(
        run_dir.run_json,
        {
            "run_id": run_id,
            "pid": proc.pid,
            "pgid": proc.pid,  # start_new_session: the trainer leads its own group
            "argv": argv,
            "train_args": list(train_args),
            "mode": mode,
            "env": redacted(env),
            # Only the file's path: its values are read again on the box at each start.
            "env_file": env_file,
            "started_at": started_at,
            "host": socket.gethostname(),
            "launch": "starting",
            # This run's checkpoint folder, and where earlier runs in this dir keep theirs.
            **checkpoint_layout.run_layout(run_dir.root, run_id),
        },
    )
    return Started(proc, run_id, log_offset, baseline, started_at, mode)


def _record_outcome(run_dir: RunDir, outcome: str) -> None:
    record = read_json(run_dir.run_json)
    if isinstance(record, dict):
        atomic_write_json(run_dir.run_json, {**record, "launch": outcome})


def _end_group(proc: subprocess.Popen[bytes]) -> int | None:
    """TERM the group we started, KILL it after a grace period; the exit code if known."""
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(grace)
    return proc.poll()


def _verify(run_dir: RunDir, started: Started, wait_s: float) -> protocol.Reply:
    deadline = time.monotonic() + wait_s
    proc = started.proc
    while True:
        code = proc.poll()
        facts = find_lines(
            run_dir.status, started.run_id, after_seq=started.baseline_seq, max_bytes=1 << 18
        )
        held = lock_is_held(run_dir.lock)
        common = {
            "run_id": started.run_id,
            "pid": proc.pid,
            "pgid": proc.pid,
            "run_dir": str(run_dir.root),
            "mode": started.mode,
            "seconds": round(time.time() - started.started_at, 2),
        }
        if facts.run_start is not None and (held or code == 0):
            _record_outcome(run_dir, "started")
            return protocol.reply_ok(
                "launch",
                **common,
                run_start_seq=facts.run_start.seq,
                total_steps=facts.run_start.get("total_steps"),
                finished=not held,
            )
        if code is not None:
            _record_outcome(run_dir, "exited_at_startup")
            return protocol.reply_error(
                "launch",
                "exited_at_startup",
                f"trainer exited with code {code} before it started training",
                **common,
                exit_code=code,
                log_tail=log_tail(run_dir.log, LOG_TAIL_LINES, since=started.log_offset),
            )
        if time.monotonic() >= deadline:
            code = _end_group(proc)
            _record_outcome(run_dir, "startup_timeout")
            return protocol.reply_error(
                "launch",
                "startup_timeout",
                f"no run_start within {wait_s:g} s; the trainer's process group was ended",
                **common,
                exit_code=code,
                log_tail=log_tail(run_dir.log, LOG_TAIL_LINES, since=started.log_offset),
            )
        time.sleep(POLL_S)


def start_verified(
    run_dir: RunDir,
    train_args: Sequence[str],
    *,
    env: Mapping[str, str],
    wait_s: float,
    allow_busy: bool = False,
    min_free_bytes: int | None = None,
    run_id: str | None = None,
    env_file: str | None = None,
    config: ResolvedConfig | None = None,
) -> protocol.Reply:
    """Preflight, record the config, start, verify. `config` is what to run (a restart's);
    without it, `train_args` are resolved in the trainer's environment. `train_args` are
    recorded in run.json as given. The caller holds `control_guard`."""
    try:
        file_env = load_env_file(env_file) if env_file else {}  # refused before anything starts
        if lock_is_held(run_dir.lock):
            holder = lock_holder_pid(run_dir.lock)
            record: Any = read_json(run_dir.run_json) or {}
            return protocol.reply_error(
                "launch",
                "already_running",
                f"run_dir: a trainer (pid {holder}) holds {run_dir.lock}",
                pid=holder,
                run_id=record.get("run_id"),
            )
        if config is None:
            config = resolve_launch_config(run_dir, train_args, {**file_env, **env})
        preflight_config(
            run_dir, config.config, allow_busy=allow_busy, min_free_bytes=min_free_bytes
        )
    except PreflightError as exc:
        return protocol.reply_error("launch", exc.code, exc.message)
    # $DFLASH_RUN_ID given with --env is in the config already (the loader reads it).
    run_id = config.config.run.run_id or run_id or uuid.uuid4().hex[:12]
    try:
        checkpoint_layout.check_run_id(run_id)  # it names the run's checkpoint folder
    except ValueError as exc:
        return protocol.reply_error("launch", "bad_train_args", str(exc))
    write_run_config(run_dir, with_values(config, "launch", run_id=run_id))
    started = _start(run_dir, run_id, train_args, env, env_file)
    return _verify(run_dir, started, wait_s)


def launch_run(
    run_dir: RunDir,
    train_args: Sequence[str],
    *,
    env: Mapping[str, str],
    wait_s: float,
    allow_busy: bool = False,
    min_free_bytes: int | None = None,
    env_file: str | None = None,
) -> protocol.Reply:
    try:
        with control_guard(run_dir):
            return start_verified(
                run_dir,
                train_args,
                env=env,
                wait_s=wait_s,
                allow_busy=allow_busy,
                min_free_bytes=min_free_bytes,
                env_file=env_file,
            )
    except ControlBusy as exc:
        return protocol.reply_error("launch", "busy", str(exc))
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return protocol.reply_error(
            "launch", "output_not_writable", f"run_dir: {run_dir.root}: {reason}"
        )


def _prepare_out(prepare_args: Sequence[str]) -> str:
    """The --out of prepare's arguments (already checked), as an absolute path."""
    import argparse

    from dflash_train.config.prepare_cli import add_prepare_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_prepare_arguments(parser)
    return str(Path(parser.parse_args(list(prepare_args)).out).absolute())


def launch_prepare(
    run_dir: RunDir,
    prepare_args: Sequence[str],
    *,
    env: Mapping[str, str],
    wait_s: float,
    env_file: str | None = None,
    train_args: Sequence[str] | None = None,
) -> protocol.Reply:
    """`launch RUN_DIR --prepare -- PREPARE_ARGS`: `prepare --run-dir RUN_DIR` started like a
    trainer (its own session, train.log, run.json, the run lock, verified by its run_start).
    With `train_args` (`-- PREPARE_ARGS -- TRAIN_ARGS`), the training config is resolved and
    recorded now (its data dir, prepare's --out unless given, may not exist yet) and the
    prepare process becomes that trainer once its data is complete."""
    from dflash_train.config.prepare_cli import check_args

    problem = check_args(prepare_args)
    if problem:
        return protocol.reply_error("launch", "bad_prepare_args", problem)
    try:
        with control_guard(run_dir):
            file_env = load_env_file(env_file) if env_file else {}
            if lock_is_held(run_dir.lock):
                holder = lock_holder_pid(run_dir.lock)
                return protocol.reply_error(
                    "launch",
                    "already_running",
                    f"run_dir: a run (pid {holder}) holds {run_dir.lock}",
                    pid=holder,
                )
            run_id = {**file_env, **env}.get("DFLASH_RUN_ID") or uuid.uuid4().hex[:12]
            argv = [sys.executable, "-m", "dflash_train", "prepare", *prepare_args]
            argv += ["--run-dir", str(run_dir.root)]
            if train_args is not None:
                words = list(train_args)
                if not any(w == "--data-dir" or w.startswith("--data-dir=") for w in words):
                    words += ["--data-dir", _prepare_out(prepare_args)]
                config = resolve_launch_config(run_dir, words, {**file_env, **env})
                write_run_config(run_dir, with_values(config, "launch", run_id=run_id))
                argv.append("--then-train")
            started = _start(run_dir, run_id, prepare_args, env, env_file, argv=argv)
            return _verify(run_dir, started, wait_s)
    except PreflightError as exc:
        return protocol.reply_error("launch", exc.code, exc.message)
    except ControlBusy as exc:
        return protocol.reply_error("launch", "busy", str(exc))
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return protocol.reply_error(
            "launch", "output_not_writable", f"run_dir: {run_dir.root}: {reason}"
        )
