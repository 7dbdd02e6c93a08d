"""train.log, live: `dflash-train logs --follow` on the box while this screen is open."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dflash_tui.screens.line_viewer import LineViewer
from dflash_tui.sources.session import ConnectionState

if TYPE_CHECKING:
    from dflash_tui.app import DflashApp

FLUSH_EVERY_S = 0.2  # lines arrive in bursts (the first 500 at once): draw them in batches


class LogScreen(LineViewer):
    title_text = "train.log"

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[str] = []
        self._fresh = False  # a (re)connection resends the tail: replace, do not append

    @property
    def console(self) -> DflashApp:
        return self.app  # type: ignore[return-value]

    def on_mount(self) -> None:
        super().on_mount()
        self.status = "connecting"
        self.set_interval(FLUSH_EVERY_S, self.flush)
        self._worker = self.run_worker(
            self.console.session.follow_logs(self._pending.append, self._on_state),
            group="logs",
            name="logs",
            exclusive=True,
        )

    def on_unmount(self) -> None:
        # Only our own follow: `self.workers` is the app's, the stream's follow included.
        self._worker.cancel()

    def _on_state(self, state: ConnectionState) -> None:
        if state.status == "connected":
            self._fresh = True
            self._pending.clear()
            self.status = "live"
        elif state.status == "no_run":
            self.status = f"{state.reason} (press l on the dashboard to launch)"
        elif state.status == "reconnecting":
            self.status = f"reconnecting in {state.next_in or 0:.0f} s: {state.reason}"
        else:
            self.status = f"{state.status}: {state.reason or ''}".rstrip(": ")
        self.flush()

    def flush(self) -> None:
        if not self.is_attached:
            return
        # In place: the follow holds `self._pending.append`.
        lines = self._pending[:]
        self._pending.clear()
        if self._fresh:
            self._fresh = False
            self.reset(lines)
        elif lines:
            self.add_lines(lines)
        else:
            self.show_title()
