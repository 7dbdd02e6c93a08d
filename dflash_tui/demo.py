"""`dflash-tui demo`: no host, no GPU. A run directory in the user's cache, data prepared by
the real SmolLM2 target on first use (its progress streamed into the events pane), then a
real CPU training run launched through the control plane; an already running demo is
attached to instead."""

from __future__ import annotations

import asyncio
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from dflash_train import protocol
from dflash_train.config.recipes import CPU_DEMO
from dflash_train.protocol import Reply
from dflash_tui.messages import ControlDone, Note
from dflash_tui.sources.launch_fields import form_fields

if TYPE_CHECKING:
    from dflash_tui.app import DflashApp

# Small enough to prepare in a couple of minutes on two CPU cores.
DEMO_SAMPLES = 24
DEMO_NEW_TOKENS = 64
PROGRESS_EVERY_S = 1.0
_SPLIT = re.compile(rb"[\r\n]+")


@dataclass(frozen=True)
class DemoPaths:
    root: Path

    @classmethod
    def default(cls) -> DemoPaths:
        return cls(Path(platformdirs.user_cache_dir("dflash")) / "demo")

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def ready_marker(self) -> Path:
        # Written only after prepare exits 0, so an interrupted prepare is redone.
        return self.root / "data.ready"


def launch_defaults(paths: DemoPaths) -> dict[str, str]:
    """What the launch form offers, and what the demo launches with: the cpu_demo recipe."""
    return {**form_fields(CPU_DEMO.texts), "data_dir": str(paths.data_dir)}


def prepare_argv(paths: DemoPaths) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dflash_train",
        "prepare",
        "--target-model",
        "smollm2",
        "--prompts",
        "builtin",
        "--out",
        str(paths.data_dir),
        "--samples",
        str(DEMO_SAMPLES),
        "--max-new-tokens",
        str(DEMO_NEW_TOKENS),
        "--batch-size",
        "12",
        "--heldout",  # the cpu_demo recipe's evaluations decode 4 held-out prompts
        "4",
        "--overwrite",
    ]


async def prepare_data(app: DflashApp, paths: DemoPaths) -> bool:
    """Runs `dflash-train prepare`, forwarding its stderr progress (tqdm redraws with \\r)
    into the events pane at most once a second."""
    paths.root.mkdir(parents=True, exist_ok=True)
    argv = prepare_argv(paths)
    app.post_message(Note("info", "preparing demo data with SmolLM2 (first run only)…"))
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,  # the JSON reply: on failure it holds the reason
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stderr is not None and proc.stdout is not None
    reply_read = asyncio.ensure_future(proc.stdout.read())
    tail: list[str] = []
    shown = ""

    pending = b""

    async def show_latest() -> None:
        # tqdm redraws many times a second; the pane gets the newest state once a second.
        # A bar's current state is the text after its last \r, not yet ended by another.
        nonlocal shown
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            current = pending.decode("utf-8", "replace").strip() or (tail[-1] if tail else "")
            if current and current != shown:
                shown = current
                app.post_message(Note("info", f"prepare: {shown}", key="prepare"))

    ticker = asyncio.create_task(show_latest())
    try:
        while chunk := await proc.stderr.read(4096):
            parts = _SPLIT.split(pending + chunk)
            pending = parts.pop()
            for raw in parts:
                text = raw.decode("utf-8", "replace").strip()
                if text:
                    tail = [*tail[-19:], text]
        rc = await proc.wait()
    except asyncio.CancelledError:
        proc.terminate()
        reply_read.cancel()
        raise
    finally:
        ticker.cancel()
    if rc != 0:
        reply = protocol.decode_reply(await reply_read)
        why = reply.error if isinstance(reply, Reply) and reply.error else " | ".join(tail[-3:])
        app.post_message(Note("error", f"prepare failed (exit {rc}): {why or 'no reason given'}"))
        return False
    paths.ready_marker.write_text("ok\n", encoding="utf-8")
    app.post_message(Note("info", "demo data ready", key="prepare"))
    return True


async def start_demo_run(app: DflashApp, paths: DemoPaths) -> None:
    """Attach when a demo run is already alive; otherwise prepare (once) and launch."""
    status = await app.session.status()
    if status.ok and status.data.get("state") in ("running", "stalled"):
        app.post_message(Note("info", f"attached to the running demo run in {paths.run_dir}"))
        return
    if not paths.ready_marker.exists() and not await prepare_data(app, paths):
        return
    from dflash_tui.sources.launch_fields import train_args

    app.post_message(Note("info", "launching the demo run (CPU, tiny drafter)…"))
    reply = await app.session.launch(train_args(app.options.launch_defaults))
    if reply.ok:
        app.post_message(Note("info", "demo run launched; q leaves it running, S stops it"))
    else:
        app.post_message(ControlDone("launch", reply))


def run_demo(*, watch: bool = False, theme: str | None = None) -> int:
    from dflash_tui.app import DflashApp
    from dflash_tui.sources.console_options import ConsoleOptions, remember_in
    from dflash_tui.sources.profiles import Profile, load_config
    from dflash_tui.sources.transport import LocalTransport

    paths = DemoPaths.default()
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    # What the operator chose last time (theme, hs_min_ready) lives in the "demo" profile.
    remembered = load_config().profiles.get("demo")
    defaults = launch_defaults(paths)
    if remembered is not None and remembered.launch.hs_min_ready is not None:
        defaults["hs_min_ready"] = str(remembered.launch.hs_min_ready)
    if theme is None and remembered is not None:
        theme = remembered.theme
    options = ConsoleOptions(
        target_name="demo (this machine)",
        run_dir=str(paths.run_dir),
        read_only=watch,
        python=sys.executable,
        launch_defaults=defaults,
        theme=theme,
        remember=remember_in(Profile("demo")),
    )

    async def startup(app: DflashApp) -> None:
        if not watch:
            await start_demo_run(app, paths)

    app = DflashApp(LocalTransport(), options, startup=startup)
    app.run()
    return int(app.return_code or 0)
