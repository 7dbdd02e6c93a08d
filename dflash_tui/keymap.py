"""The one table of key bindings. It feeds the footer (as Textual bindings with ids, so users
can remap them: the config file's `[keys]` table, through App.set_keymap), the help screen and
the command palette; `mutating` marks what watch mode must refuse."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from textual.binding import Binding

from dflash_tui.sources.profiles import load_config

ID_PREFIX = "dflash."


@dataclass(frozen=True)
class KeyAction:
    id: str
    key: str
    action: str
    description: str
    help: str
    mutating: bool = False
    show: bool = True
    key_display: str | None = None


PANES: tuple[tuple[str, str], ...] = (
    ("gpus", "GPUs"),
    ("queue", "HS queue"),
    ("throughput", "throughput"),
    ("loss", "loss"),
    ("events", "events"),
    ("header", "header"),
    ("heatmap", "GPU history"),
)

KEYMAP: tuple[KeyAction, ...] = (
    KeyAction("launch", "l", "launch", "Launch", "start a run from a form prefilled by the profile",
              mutating=True),
    KeyAction("restart", "R", "restart", "Restart",
              "stop and start again: resume or fresh, with overrides", mutating=True),
    KeyAction("split_advice", "a", "restart_with_advice", "Advice",
              "restart with the trainer's split advice: the restart dialog, its targets:drafters "
              "GPUs filled in", mutating=True, show=False),
    KeyAction("stop", "S", "stop", "Stop", "stop the run (checkpoint first), after a confirmation",
              mutating=True),
    KeyAction("min_ready", "m", "min_ready", "Min-ready",
              "change hs_min_ready live on the running trainer", mutating=True),
    KeyAction("logs", "L", "logs", "Log", "train.log, live: / filters, G/g end/start, Esc back"),
    KeyAction("events", "e", "events", "Events",
              "every event of the run, full screen, with the same filter and scroll"),
    KeyAction("reconnect", "r", "reconnect", "Reconnect",
              "connect again now (and ask again about a refused host key)", show=False),
    KeyAction("dismiss", "d", "dismiss_alerts", "Dismiss",
              "dismiss alert toasts; the header shows the run's state again", show=False),
    KeyAction("pause", "p", "pause", "Pause", "freeze the screen; data keeps arriving underneath"),
    KeyAction("theme", "t", "cycle_theme", "Theme", "next colour theme (remembered)"),
    KeyAction("loss_log", "g", "toggle_log_scale", "Log loss",
              "loss plot: logarithmic y axis on/off", show=False),
    KeyAction("loss_smooth", "s", "toggle_smoothing", "Smooth",
              "metrics plot: the smoothed line only (raw hidden) on/off", show=False),
    KeyAction("plot_metric", "v", "cycle_metric", "Metric",
              "metrics plot: next of loss, accuracy, tau, grad norm, learning rate, Ktok/s, "
              "stage times, drafter starved"),
    KeyAction("plot_range", "z", "cycle_range", "Range",
              "plots and GPU history: whole run, last 6 h, last 1 h, last 10 min"),
    KeyAction("plot_axis", "x", "toggle_axis", "Steps/time",
              "plots: x axis in steps or wall time", show=False),
    KeyAction("heat_value", "h", "toggle_heat", "Util/power",
              "GPU history: utilisation or power", show=False),
    KeyAction("details", "i", "run_details", "Details",
              "the run's config, topology, dataset stats and batches per epoch"),
    KeyAction("checkpoints", "c", "checkpoints", "Checkpoints",
              "every checkpoint: step, time, size, complete (the stream and dflash-train status)"),
    *(
        KeyAction(f"pane_{name}", str(i), f"toggle_pane('{name}')", title,
                  f"show or hide the {title} pane", show=False)
        for i, (name, title) in enumerate(PANES, start=1)
    ),
    KeyAction("help", "question_mark", "help", "Help", "this list of keys", key_display="?"),
    KeyAction("quit", "q", "app.quit", "Quit", "leave the console; the run keeps running"),
)  # fmt: skip

MUTATING_ACTIONS = frozenset(k.action for k in KEYMAP if k.mutating)


# Shown first in the footer: a narrow terminal cuts the footer from the right, and these
# two must stay in sight (seen at 80 columns: both were cut).
FOOTER_FIRST = ("help", "quit")


def entry(short_id: str) -> KeyAction:
    return next(k for k in KEYMAP if k.id == short_id)


def bindings() -> list[Binding]:
    first = [k for k in KEYMAP if k.id in FOOTER_FIRST]
    return [
        Binding(
            k.key,
            k.action,
            k.description,
            show=k.show,
            key_display=k.key_display,
            id=f"dflash.{k.id}",
        )
        for k in [*first, *(k for k in KEYMAP if k not in first)]
    ]


def shown_key(entry: KeyAction, remapped: Mapping[str, str] | None = None) -> str:
    key = (remapped or {}).get(ID_PREFIX + entry.id)
    if key is not None:
        return key
    return entry.key_display or entry.key


def remaps(keys: Mapping[str, str]) -> dict[str, str]:
    """The config file's `[keys]` (`stop = "ctrl+s"`: a binding's id, short or with the
    `dflash.` prefix, to a Textual key name, several comma-separated) as App.set_keymap
    takes it. Raises ValueError naming the entry: an unknown id, or a key another binding
    keeps."""
    by_id = {k.id: k for k in KEYMAP}
    wanted: dict[str, str] = {}
    for name, key in keys.items():
        short = name.removeprefix(ID_PREFIX)
        if short not in by_id:
            known = ", ".join(by_id)
            raise ValueError(f"keys.{name}: not a key of the console (known: {known})")
        wanted[short] = key
    taken = {k.key: k.id for k in KEYMAP if k.id not in wanted}
    for short, key in wanted.items():
        for one in key.split(","):
            other = taken.get(one.strip())
            if other is not None:
                raise ValueError(f"keys.{short}: {one.strip()!r} is already {other}'s key")
            taken[one.strip()] = short
    return {ID_PREFIX + short: key for short, key in wanted.items()}


def configured() -> dict[str, str]:
    """The remaps of the console's config file (checked as `remaps` checks them)."""
    return remaps(load_config().keys)
