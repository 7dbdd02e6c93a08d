"""The progress of a launched prepare (a run whose run_start says mode "prepare"), drawn in
the hidden-state queue pane's place, which a prepare has none of: answers done of all with a
bar, answer tokens/s over all devices and per device (with each one's batch rows), truncated
answers and the time left. The GPU pane beside it shows each GPU's load."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import RenderableType
from rich.text import Text

from dflash_train.protocol import StatusLine
from dflash_tui.widgets import units

TITLE = "2 prepare"


def render_prepare(
    line: StatusLine | None, colours: Mapping[str, str], width: int, going: bool = True
) -> RenderableType:
    """`going`: the prepare still runs; once it ended (finished, stopped, crashed) its last
    line's ETA is no longer true and is not shown."""
    if line is None:
        return Text("loading the target; waiting for the first answers…", style="dim")
    done, total = int(line["answers_done"]), int(line["answers_total"])
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append("answers ")
    out.append(f"{done:,}/{total:,}", style=f"bold {colours['success']}")
    out.append(f"  samples {int(line['prompts_done']):,}/{int(line['prompts_total']):,}\n")
    fraction = done / total if total else 1.0
    out.append(units.bar(fraction, max(8, min(40, width - 4))) + "\n", style=colours["success"])
    out.append(f"{units.token_rate(line['tokens_per_s'])} answer tok/s", style="bold")
    out.append(f" ({int(line['answer_tokens']):,} tokens)")
    eta = line["eta_s"] if going else None
    out.append(f"   ETA {units.duration(float(eta)) if eta is not None else '–'}")
    truncated = int(line["truncated"])
    style = colours["warning"] if truncated else ""
    out.append(f"   truncated {truncated:,}\n", style=style)
    for device in line["devices"]:
        if not isinstance(device, Mapping):
            continue
        rows = device.get("batch_size")
        out.append(f"{device.get('device', '?'):<8}", style="dim")
        out.append(f"{units.token_rate(device.get('tokens_per_s')):>9} tok/s")
        out.append(f"  {int(device.get('answers') or 0):,} answers")
        out.append(f"  {rows if rows is not None else '–'} rows\n", style="dim")
    return out
