"""The checkpoints screen (`c`): every checkpoint of the run, from the stream's `checkpoint`
lines and from the box's own listing (`dflash-train status`): step, when, size, how long
the save took, its held-out tau (the box's eval.json, else the stream's `eval` event) and
whether it is complete, still on disk or pruned; the best held-out tau is marked. A score
that is teacher-forced only (a hybrid target's, never decoded) says so: `1.842 (tf)`. Paths
under the run dir read from it (`checkpoints/RUN_ID/step_…`): the full ones share a long
prefix, and the screen's width cut every row's at the same place, before the step."""

from __future__ import annotations

import dataclasses
import posixpath
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from dflash_train.protocol import StatusLine, eval_score
from dflash_tui.sources.state import HeldoutTau, listed_score

COLUMNS = ("step", "written", "size", "save s", "held-out τ", "state", "path")
BEST_MARK = "★ best"
TF_MARK = "(tf)"  # the score is the teacher-forced tau: nothing was decoded


@dataclass(frozen=True)
class CheckpointRow:
    step: int
    t: float | None
    size_bytes: int | None
    seconds: float | None
    state: str  # complete | incomplete | pruned | saved (the box has not answered yet)
    path: str
    tau: float | None = None
    best: bool = False
    teacher_forced: bool = False

    def cells(self, run_dir: str | None = None) -> tuple[str, ...]:
        when = "–" if self.t is None else time.strftime("%m-%d %H:%M:%S", time.localtime(self.t))
        size = "–" if self.size_bytes is None else _size(self.size_bytes)
        seconds = "–" if self.seconds is None else f"{self.seconds:.1f}"
        tau = "–" if self.tau is None else f"{self.tau:.3f}"
        if self.tau is not None and self.teacher_forced:
            tau = f"{tau} {TF_MARK}"
        state = f"{self.state} {BEST_MARK}" if self.best else self.state
        return (f"{self.step:,}", when, size, seconds, tau, state, shown_path(self.path, run_dir))


def shown_path(path: str, run_dir: str | None) -> str:
    """`path` from `run_dir` when it lies under it, else whole. The box's paths are POSIX
    and absolute; a run dir given relative (`runs/r1`, `~/runs/r1`) is the box's resolved
    one's tail, so it is found as a whole run of path components."""
    if not run_dir or not posixpath.isabs(path):
        return path
    inside = posixpath.normpath(path)
    root = posixpath.normpath(run_dir.removeprefix("~/"))
    if not posixpath.isabs(root):
        marker = f"/{root}/"
        at = inside.rfind(marker)
        return inside[at + len(marker) :] if root != "." and at >= 0 else path
    if inside == root or posixpath.commonpath((root, inside)) != root:
        return path
    return posixpath.relpath(inside, root)


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} B"


def checkpoint_rows(
    stream: Sequence[StatusLine],
    listed: Sequence[Mapping[str, Any]] | None,
    scores: Mapping[int, HeldoutTau] | None = None,
) -> list[CheckpointRow]:
    """One row per step, newest first. `listed` is the box's listing (None: not asked yet
    or not answered): a checkpoint the stream announced that the box no longer has was
    pruned (the trainer keeps the newest K, and the best). `scores`: the held-out
    evaluation of each evaluated step from the stream; the box's own (eval.json) wins."""
    rows = _rows(stream, listed)
    on_box = {int(c["step"]): c for c in listed or () if isinstance(c.get("step"), int)}
    taus = {step: held.score for step, held in (scores or {}).items()}
    forced = {step for step, held in (scores or {}).items() if held.teacher_forced_only}
    for step, c in on_box.items():
        if (score := listed_score(c)) is not None:
            taus[step] = score
            # The box's rule: no finite decoded tau means the score is the teacher-forced one.
            if eval_score({"tau": c.get("tau")}) is None:
                forced.add(step)
            else:
                forced.discard(step)
    if any(c.get("best") for c in on_box.values()):
        best = next(step for step, c in on_box.items() if c.get("best"))
    else:
        kept = [r.step for r in rows if r.state != "pruned" and r.step in taus]
        best = max(kept, key=lambda step: (taus[step], step)) if kept else None
    return [
        dataclasses.replace(
            row, tau=taus.get(row.step), best=row.step == best, teacher_forced=row.step in forced
        )
        for row in rows
    ]


def _rows(
    stream: Sequence[StatusLine], listed: Sequence[Mapping[str, Any]] | None
) -> list[CheckpointRow]:
    on_box = {int(c["step"]): c for c in listed or () if isinstance(c.get("step"), int)}
    rows: dict[int, CheckpointRow] = {}
    for line in stream:
        step = int(line["step"])
        found = on_box.get(step)
        state = "saved" if listed is None else "pruned" if found is None else _state(found)
        rows[step] = CheckpointRow(
            step, line.t, _int(found, "size_bytes"), line.get("seconds"), state, line["path"]
        )
    for step, found in on_box.items():
        if step not in rows:
            written = found.get("written_at")
            rows[step] = CheckpointRow(
                step,
                float(written) if isinstance(written, (int, float)) else None,
                _int(found, "size_bytes"),
                None,
                _state(found),
                str(found.get("path", "")),
            )
    return [rows[step] for step in sorted(rows, reverse=True)]


def _state(found: Mapping[str, Any]) -> str:
    return "complete" if found.get("complete") else "incomplete"


def _int(found: Mapping[str, Any] | None, key: str) -> int | None:
    value = None if found is None else found.get(key)
    return value if isinstance(value, int) else None


class CheckpointsScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,c,q", "close", "Close")]

    def __init__(
        self,
        stream: Sequence[StatusLine],
        scores: Mapping[int, HeldoutTau] | None = None,
        run_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.run_dir = run_dir  # paths under it are shown from it
        self.stream = list(stream)
        self.scores = dict(scores or {})
        self.listed: list[Mapping[str, Any]] | None = None
        self.note = "asking the box (dflash-train status)…"

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog checkpoints-dialog"):
            yield Static("Checkpoints", classes="dialog-title")
            yield Static(self.note, id="checkpoints-note", classes="form-hint")
            yield DataTable(id="checkpoints-table", cursor_type="row", zebra_stripes=True)
            yield Static("escape closes this screen", classes="form-hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(*COLUMNS)
        self.fill()

    def show_listing(self, listed: Sequence[Mapping[str, Any]] | None, note: str) -> None:
        """The box's answer: its listing, or None with why there is none."""
        self.listed = None if listed is None else list(listed)
        self.note = note
        # The answer can come after the screen was closed (or before it mounted): then
        # there is nothing to draw; compose() shows the note if it mounts later. While it
        # closes, the screen is still attached but its widgets may be gone already (the
        # watch fuzzer hit that window: NoMatches ended the app).
        if not (self.is_mounted and self.is_attached):
            return
        try:
            self.query_one("#checkpoints-note", Static).update(note)
            self.fill()
        except NoMatches:
            return

    @property
    def rows(self) -> list[CheckpointRow]:
        return checkpoint_rows(self.stream, self.listed, self.scores)

    def fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        rows = self.rows
        for row in rows:
            table.add_row(*row.cells(self.run_dir))
        if not rows:
            self.query_one("#checkpoints-note", Static).update(f"{self.note} — none yet")

    def action_close(self) -> None:
        self.dismiss(None)
