"""Optional Weights & Biases logging that can never stall training: the monitor hands
figures to a bounded queue, a daemon thread owns the wandb run, and a full queue drops.

The key comes from the box, never through a console: WANDB_API_KEY in the trainer's
environment (an env file the launch read on the box), or the netrc `wandb login` wrote
under the box's HOME. Without either the run is offline. WANDB_MODE, when set, wins
(offline, online, disabled). Once the run exists, the logger has one notice for the status
stream: the run's URL, or why it is offline, disabled or failed."""

from __future__ import annotations

import contextlib
import netrc
import queue
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dflash_train.config.environment import wandb_environment

_STOP = object()
DEFAULT_HOST = "https://api.wandb.ai"
# WANDB_MODE's values (wandb's own spelling; dryrun is its old name for offline).
MODES = ("online", "offline", "disabled", "dryrun")


def wandb_mode(credentials: str | None, env: Mapping[str, str] | None = None) -> str:
    """online or offline by whether the box has a key, unless WANDB_MODE says otherwise.
    Raises ValueError naming the variable for a value wandb does not know."""
    env = wandb_environment() if env is None else env
    asked = env.get("WANDB_MODE")
    if asked is None or asked == "":
        return "offline" if credentials is None else "online"
    if asked not in MODES:
        raise ValueError(f"WANDB_MODE: {asked!r} is not one of {', '.join(MODES)}")
    return "offline" if asked == "dryrun" else asked


def split_tags(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def wandb_credentials(env: Mapping[str, str] | None = None) -> str | None:
    """Where this process's W&B key comes from: "WANDB_API_KEY", "netrc", or None. Only
    the source is returned: the key itself is left for wandb to read."""
    env = wandb_environment() if env is None else env
    if env.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    host = urlparse(env.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname or "api.wandb.ai"
    home = env.get("HOME")
    path = Path(env["NETRC"]) if env.get("NETRC") else Path(home) / ".netrc" if home else None
    if path is None or not path.is_file():
        return None
    try:
        found = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return "netrc" if found is not None and found[2] else None


class WandbLogger:
    """`log` never blocks; the first call of wandb.init happens on the logger's own thread.
    Without WANDB_API_KEY the run is offline, under `run_dir/wandb`. `entity`, `name`,
    `tags` and `group` go to wandb.init as given (None: wandb's default; the name: run id)."""

    def __init__(
        self,
        *,
        project: str,
        run_dir: Path,
        run_id: str,
        config: Mapping[str, Any],
        entity: str | None = None,
        name: str | None = None,
        tags: tuple[str, ...] = (),
        group: str | None = None,
        max_pending: int = 1024,
    ) -> None:
        self.project = project
        self.run_dir = run_dir
        self.run_id = run_id
        self.config = dict(config)
        self.entity, self.name, self.tags, self.group = entity, name or run_id, tags, group
        self.credentials = wandb_credentials()
        self.dropped = 0
        self.error: str | None = None
        try:
            self.mode = wandb_mode(self.credentials)
        except ValueError as exc:  # a bad WANDB_MODE is reported, never ends training
            self.mode, self.error = "disabled", str(exc)
        self.offline = self.mode == "offline"
        self.url: str | None = None
        self._notice: dict[str, Any] | None = None
        self._notice_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._work, name="wandb-log", daemon=True)
        self._thread.start()

    def log(self, figures: Mapping[str, Any], step: int | None) -> None:
        try:
            self._queue.put_nowait((dict(figures), step))
        except queue.Full:
            self.dropped += 1

    def take_notice(self) -> dict[str, Any] | None:
        """The `event` fields announcing the run (once): its URL, or why there is none."""
        with self._notice_lock:
            notice, self._notice = self._notice, None
        return notice

    def _announce(self, run: Any) -> None:
        if run is None:
            notice = {"level": "warning", "code": "wandb_failed", "message": str(self.error)}
        elif self.mode == "disabled":
            notice = {
                "level": "info",
                "code": "wandb_disabled",
                "message": "W&B disabled by WANDB_MODE=disabled: nothing is logged",
            }
        elif self.offline:
            where = self.run_dir / "wandb"
            why = (
                "WANDB_MODE=offline"
                if self.credentials is not None
                else "no key on the box (run `wandb login` there, or name an env_file in the "
                "profile)"
            )
            notice = {
                "level": "info",
                "code": "wandb_offline",
                "message": f"W&B offline: {why}; `wandb sync {where}` uploads it later",
            }
        else:
            self.url = str(getattr(run, "url", "") or "") or None
            notice = {
                "level": "info",
                "code": "wandb_run",
                "message": f"W&B run: {self.url or self.run_id}",
                "url": self.url,
            }
        with self._notice_lock:
            self._notice = notice

    def close(self, timeout: float = 60.0) -> bool:
        """Finishes the run; False when W&B had not finished within `timeout` (the run's
        files may then still be incomplete; training never waits longer for W&B)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _work(self) -> None:
        run = None
        if self.error is None:
            try:
                import wandb

                run = wandb.init(
                    project=self.project,
                    entity=self.entity,
                    id=self.run_id,
                    name=self.name,
                    tags=list(self.tags) or None,
                    group=self.group,
                    resume="allow",
                    dir=str(self.run_dir),
                    config=self.config,
                    mode=self.mode,
                    settings=wandb.Settings(console="off", silent=True),
                )
            except Exception as exc:  # W&B trouble must never end training
                self.error = f"wandb init failed: {exc}"
        if self.error is not None:
            print(self.error, file=sys.stderr)
        self._announce(run)
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if run is None:
                continue
            figures, step = item
            try:
                run.log(figures, step=step)
            except Exception as exc:
                self.error = f"wandb log failed: {exc}"
        if run is not None:
            with contextlib.suppress(Exception):
                run.finish()
