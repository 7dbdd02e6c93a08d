"""The run directory layout (docs/architecture.md) and the file primitives every writer
shares: atomic replace and the `run.lock` flock that marks a live trainer."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str]) -> RunDir:
        return cls(Path(path).expanduser().absolute())

    @property
    def status(self) -> Path:
        return self.root / "status.jsonl"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def config(self) -> Path:
        """The resolved TrainConfig the current run was started with (launch/restart)."""
        return self.root / "config.json"

    @property
    def lock(self) -> Path:
        return self.root / "run.lock"

    @property
    def control(self) -> Path:
        return self.root / "control.json"

    @property
    def restart_lock(self) -> Path:
        """Held (flock) by `restart` from before it stops the old trainer until the new one
        is verified or the restart has failed: a run_end written meanwhile says
        `restarting`, and `status` answers restarting. A restarter that dies drops it."""
        return self.root / "restart.lock"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def export(self) -> Path:
        return self.root / "export"


def atomic_write_text(path: Path, text: str, *, make_parent: bool = True) -> None:
    """Write via a temp file in the same directory, fsync, then rename: readers see the old
    file or the new one, never half of either. `make_parent=False` for a file that lives
    inside a run dir the writer did not create: a run dir deleted under a live trainer is
    then not recreated (FileNotFoundError instead)."""
    if make_parent:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, obj: Any, *, make_parent: bool = True) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    atomic_write_text(path, text, make_parent=make_parent)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


class LockHeld(RuntimeError):
    pass


_ACQUIRE_TRIES = 5


class RunLock:
    """An exclusive flock on run.lock, held for the trainer's whole life. The kernel drops
    it when the process dies, however it dies, so "lock held" is the liveness test."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        # `lock_is_held` probes (status, a following tail) hold a shared lock for
        # microseconds: only a lock still held after a few tries belongs to a trainer.
        for attempt in range(_ACQUIRE_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt + 1 == _ACQUIRE_TRIES:
                    os.close(fd)
                    raise LockHeld(f"{self.path} is held by another process") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_is_held(path: Path) -> bool:
    """True when some live process holds the flock (probe with a non-blocking shared lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def lock_holder_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return int(text) if text else None
    except (FileNotFoundError, ValueError):
        return None
