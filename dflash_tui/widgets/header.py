"""The header: where we are (host, container, run), the state badge, epoch and step progress,
ETA and how stale the data is."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from dflash_tui.widgets import units

BADGE_STYLE = {
    "running": "success",
    "preparing": "success",
    "finished": "primary",
    "stopped": "secondary",
    "restarting": "warning",
    "crashed": "error",
    "stalled": "warning",
    "not_started": "secondary",
    "reconnecting": "warning",
    "disconnected": "error",
    "connecting": "secondary",
    "failed": "error",
    "no_run": "secondary",
    "no_trainer": "error",
    "unknown_host_key": "warning",
    # alert causes (sources/alerts.py) name themselves in the badge
    "nan_steps": "error",
    "checkpoint_failed": "error",
    "restart_failed": "error",
    "connection_lost": "error",
}
# Badges whose word alone would not say what to do.
BADGE_LABEL = {"no_trainer": "NO TRAINER (set python)"}
STALE_AFTER_S = 30.0


@dataclass(frozen=True)
class HeaderFacts:
    """What the header shows, gathered by the app from the session and RunState."""

    target: str
    run_dir: str
    run_id: str | None
    badge: str
    read_only: bool
    paused: bool
    epoch: int | None
    epochs: int | None
    epoch_fraction: float | None
    step: int | None
    total_steps: int | None
    eta_s: float | None
    age_s: float | None
    wandb_url: str | None = None
    # The run's own time of what is shown (a replay's cursor), in place of the age.
    updated_at: float | None = None
    # The newest held-out evaluation (an `eval` event): its tau and the step it measured.
    heldout_tau: float | None = None
    heldout_step: int | None = None
    heldout_tf_only: bool = False  # a hybrid target's: teacher-forced, not decoded
    # A launched prepare (run_start's mode), and its newest progress: answers done and of
    # all, answer tokens/s (None until its first progress line).
    preparing: bool = False
    prepare: tuple[int, int, float] | None = None


class RunHeader(Static):
    DEFAULT_CSS = "RunHeader { height: 2; }"

    def show(self, facts: HeaderFacts, colours: dict[str, str]) -> None:
        # Always two lines: no layout pass needed.
        self.update(render_header(facts, colours, self.size.width or 120), layout=False)


def badge_label(badge: str) -> str:
    return BADGE_LABEL.get(badge) or badge.upper().replace("_", " ")


def render_header(facts: HeaderFacts, colours: dict[str, str], width: int) -> Text:
    target, run_dir = facts.target, facts.run_dir
    top = _top_line(facts, colours, target, run_dir)
    # Too wide (a tmux split): the run dir and then the host give way from the left, to 8
    # characters and then to 2, so the badge stays in sight and the line never wraps over
    # the progress line below it.
    for shortest in (8, 2):
        excess = top.cell_len - width
        if excess <= 0:
            break
        shorter = _keep_right(run_dir, len(run_dir) - excess, shortest)
        excess -= len(run_dir) - len(shorter)
        run_dir = shorter
        target = _keep_right(target, len(target) - max(0, excess), shortest)
        top = _top_line(facts, colours, target, run_dir)
    bar = max(10, min(30, width // 6))
    bottom = _bottom_line(facts, colours, bar)
    if bottom.cell_len > width and bar > 4:  # the epoch bar gives way before the last update
        bottom = _bottom_line(facts, colours, max(4, bar - (bottom.cell_len - width)))
    return Text("\n", no_wrap=True, overflow="ellipsis").join([top, bottom])


def _keep_right(text: str, room: int, shortest: int) -> str:
    """`text` cut to `room` characters (at least `shortest`) keeping its end: the end of a
    path or host names it best."""
    room = max(room, shortest)
    return text if len(text) <= room else "…" + text[len(text) - room + 1 :]


def _top_line(facts: HeaderFacts, colours: dict[str, str], target: str, run_dir: str) -> Text:
    top = Text(no_wrap=True, overflow="ellipsis")
    top.append(" dflash ", style=f"bold reverse {colours['primary']}")
    top.append(f" {target} ", style="bold")
    top.append(f"│ {run_dir} │ run ", style="dim")
    top.append(facts.run_id or "–", style="bold")
    top.append("  ")
    badge_colour = colours[BADGE_STYLE.get(facts.badge, "secondary")]
    top.append(f" {badge_label(facts.badge)} ", style=f"bold reverse {badge_colour}")
    if facts.read_only:
        top.append("  ")
        top.append(" 🔒 READ-ONLY ", style=f"bold reverse {colours['warning']}")
    if facts.paused:
        top.append("  ")
        top.append(" ⏸ PAUSED ", style=f"bold reverse {colours['accent']}")
    if facts.wandb_url:
        top.append("  W&B ", style="bold")
        top.append(facts.wandb_url, style=f"underline link {facts.wandb_url}")
    return top


def _bottom_line(facts: HeaderFacts, colours: dict[str, str], bar_width: int) -> Text:
    bottom = Text(no_wrap=True, overflow="ellipsis")
    if facts.preparing:
        # A prepare has no epochs or steps (they read "epoch –/–"): its answers instead.
        done = total_answers = fraction = None
        speed = "– tok/s"
        if facts.prepare is not None:
            done, total_answers, rate = facts.prepare
            fraction = done / total_answers if total_answers else None
            # A CPU answers tens of tokens a second, an H200 tens of thousands.
            speed = f"{rate:,.0f} tok/s" if rate < 1000 else f"{rate / 1000:,.1f} Ktok/s"
        shown = "–" if done is None else f"{done:,}"
        of = "–" if total_answers is None else f"{total_answers:,}"
        bottom.append(f" answers {shown}/{of} ")
        bottom.append(units.bar(fraction, bar_width), style=colours["primary"])
        bottom.append(f" {units.percent(fraction)}  │ {speed} answered")
        bottom.append(f"  │ ETA {units.duration(facts.eta_s)}  │ ")
    else:
        # The stream counts epochs from 0; people count them from 1 ("epoch 6/6" is last).
        epoch = "–" if facts.epoch is None else str(facts.epoch + 1)
        epochs = "–" if facts.epochs is None else str(facts.epochs)
        bottom.append(f" epoch {epoch}/{epochs} ")
        bottom.append(units.bar(facts.epoch_fraction, bar_width), style=colours["primary"])
        bottom.append(f" {units.percent(facts.epoch_fraction)}")
        step = "–" if facts.step is None else f"{facts.step:,}"
        total = "" if facts.total_steps is None else f"/{facts.total_steps:,}"
        bottom.append(f"  │ step {step}{total}  │ ETA {units.duration(facts.eta_s)}  │ ")
    if facts.heldout_tau is not None:
        bottom.append("held-out τ(tf) " if facts.heldout_tf_only else "held-out τ ")
        bottom.append(f"{facts.heldout_tau:.3f}", style=f"bold {colours['accent']}")
        at = "" if facts.heldout_step is None else f" @{facts.heldout_step:,}"
        bottom.append(f"{at}  │ ")
    if facts.updated_at is not None:
        shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(facts.updated_at))
        bottom.append(f"run time {shown}")
    elif facts.age_s is None:
        bottom.append("no data yet", style="dim")
    else:
        stale = facts.age_s > STALE_AFTER_S
        bottom.append(
            f"last update {units.duration(facts.age_s)} ago",
            style=f"bold {colours['warning']}" if stale else "",
        )
    return bottom
