"""The report as one self-contained HTML file: the run's header, its config, topology and
dataset, every plot as an embedded PNG, what the plots mark, and the checkpoint table.
Nothing is fetched when it opens (no script, no stylesheet, no font from elsewhere)."""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
from collections.abc import Mapping
from typing import Any

from dflash_train.report.series import RunSeries

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: 0.5rem 0; }
td, th { border-bottom: 1px solid #ddd; padding: 0.2rem 0.8rem 0.2rem 0; text-align: left;
  vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1rem 0; } figure img { max-width: 100%; } .muted { color: #666; }
.tables { display: flex; flex-wrap: wrap; gap: 2rem; } code { font-size: 0.9em; }
"""


def _when(t: float | None) -> str:
    if t is None:
        return "—"
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(", ", ": "))
    return "—" if value is None else str(value)


def _table(rows: Mapping[str, Any], table_id: str) -> str:
    body = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td><code>{html.escape(_text(v))}</code></td></tr>"
        for k, v in rows.items()
    )
    return f'<table id="{table_id}">{body or "<tr><td>none</td></tr>"}</table>'


def _duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m {rest % 60:02d}s"


def _summary(series: RunSeries) -> dict[str, Any]:
    start, end = series.start, series.end or {}
    last_step = int(series.steps[-1]) if len(series.steps) else 0
    rows: dict[str, Any] = {
        "run": ", ".join(series.run_ids) or "—",
        "host": start.get("host"),
        "started": _when(series.first_t),
        "last line": _when(series.last_t),
        "steps": f"{last_step:,} of {start.get('total_steps', 0):,}",
        "batches per epoch": start.get("batches_per_epoch"),
        "end": f"{end['reason']} (exit {end.get('exit_code')})" if end else "no run_end yet",
    }
    if series.first_t is not None and series.last_t is not None:
        rows["wall time"] = _duration(series.last_t - series.first_t)
    if series.rejected:
        rows["lines skipped"] = f"{series.rejected} of {series.lines} did not decode"
    return rows


def _checkpoint_rows(series: RunSeries) -> str:
    heldout = {e["step"]: e for e in series.evals}
    rows = []
    for c in series.checkpoints:
        held = heldout.get(c["step"])
        tau = "—"
        if held and held["tau"] is not None:
            tau = f"{held['tau']:.3f}"
        elif held and held["tau_tf"] is not None:
            tau = f"{held['tau_tf']:.3f} (teacher-forced)"
        rows.append(
            f'<tr><td class="n">{c["step"]:,}</td><td>{_when(c["t"])}</td>'
            f'<td class="n">{c["seconds"]:.1f}</td><td class="n">{tau}</td>'
            f"<td><code>{html.escape(c['path'])}</code></td></tr>"
        )
    head = (
        '<tr><th class="n">step</th><th>written</th><th class="n">seconds</th>'
        '<th class="n">held-out τ</th><th>path</th></tr>'
    )
    return f'<table id="checkpoints">{head}{"".join(rows)}</table>'


def _marks_line(series: RunSeries) -> str:
    parts = [
        f"{len(series.checkpoints)} checkpoints (grey dotted)",
        f"{len(series.restarts)} restarts (blue dashed)",
        f"{len(series.alerts)} alerts (red)",
    ]
    return "Marked on every plot: " + ", ".join(parts) + "."


def _alerts(series: RunSeries) -> str:
    if not series.alerts:
        return "<p>No warning or error in the stream.</p>"
    items = "".join(
        f"<li>step {int(a.step):,}, {_when(a.t)}: <b>{a.level}</b> {html.escape(a.label)}</li>"
        for a in series.alerts[:200]
    )
    more = len(series.alerts) - 200
    tail = f"<li class='muted'>and {more} more</li>" if more > 0 else ""
    return f'<ul id="alerts">{items}{tail}</ul>'


def render(series: RunSeries, images: Mapping[str, tuple[str, bytes]]) -> str:
    """`images`: plot name -> (title, PNG bytes), in page order."""
    figures = "".join(
        f'<figure id="plot-{name}"><img alt="{html.escape(title)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"></figure>'
        for name, (title, png) in images.items()
    )
    start = series.start
    title = f"dflash run {', '.join(series.run_ids) or series.path.parent.name}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p class='muted'>From <code>{html.escape(str(series.path))}</code> alone, "
        f"{series.lines:,} lines.</p>"
        f"{_table(_summary(series), 'summary')}"
        f"<h2>Plots</h2><p id='marks'>{_marks_line(series)}</p>{figures}"
        f"<h2>Checkpoints</h2>{_checkpoint_rows(series)}"
        f"<h2>Alerts</h2>{_alerts(series)}"
        "<h2>Run</h2><div class='tables'>"
        f"<div><h3>Topology</h3>{_table(start.get('topology') or {}, 'topology')}</div>"
        f"<div><h3>Dataset</h3>{_table(start.get('dataset') or {}, 'dataset')}</div></div>"
        f"<h3>Config</h3>{_table(start.get('config') or {}, 'config')}"
        "</body></html>\n"
    )
