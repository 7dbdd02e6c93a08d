"""The GPU pane's rows keep their columns whatever the role: a GPU that holds a target replica
and a drafter rank (DDP on a small box) reads `tgt+dft`, in the drafter colour."""

from __future__ import annotations

from dflash_tui.widgets.gpu_table import render_gpus

COLOURS = {
    name: name for name in ("primary", "success", "warning", "error", "secondary")
}  # fmt: skip


def _gpu(index: int, role: str) -> dict[str, object]:
    return {
        "index": index, "role": role, "util": 97.0, "power_w": 650.0, "power_limit_w": 700.0,
        "temp_c": 61.0, "mem_used": 130000.0, "mem_total": 143771.0,
    }  # fmt: skip


def test_roles_line_up_and_shared_gpus_are_named() -> None:
    roles = ["target", "drafter", "target+drafter", ""]
    text = render_gpus(
        [_gpu(i, role) for i, role in enumerate(roles)], {}, COLOURS, unavailable=None
    )
    header, *rows = text.plain.splitlines()  # type: ignore[union-attr]
    assert [row.split()[1] for row in rows] == ["target", "drafter", "tgt+dft", "–"]
    assert header.split()[:3] == ["gpu", "role", "util"]
    assert len({row.index("97%") for row in rows}) == 1  # same column on every row
    styled = {
        text.plain[span.start : span.end].strip(): span.style  # type: ignore[union-attr]
        for span in text.spans  # type: ignore[union-attr]
    }
    assert styled["drafter"] == styled["tgt+dft"] == "primary"


def test_a_narrow_pane_drops_the_history_then_the_limits_and_never_wraps() -> None:
    """Seen in tmux at 80 and 100 columns: each GPU's row wrapped into a second line."""
    gpus = [_gpu(i, "target" if i else "drafter") for i in range(2)]
    history = {0: [50.0] * 20, 1: [90.0] * 20}
    full = render_gpus(gpus, history, COLOURS, unavailable=None, width=120)
    assert "history" in full.plain.splitlines()[0]  # type: ignore[union-attr]
    assert "650/700" in full.plain and "127.0/140.4" in full.plain  # type: ignore[union-attr]
    for width, limits in ((70, True), (58, True), (46, False)):
        text = render_gpus(gpus, history, COLOURS, unavailable=None, width=width)
        header, *rows = text.plain.splitlines()  # type: ignore[union-attr]
        assert len(rows) == 2 and "history" not in header, (width, header)
        assert all(len(line) <= width for line in (header, *rows)), (width, header, rows)
        assert all("97%" in row and "61°C" in row for row in rows), rows
        assert all(("650/700" in row) == limits and "127.0" in row for row in rows), rows
        assert len({row.index("97%") for row in rows}) == 1  # columns still line up
        assert text.no_wrap  # type: ignore[union-attr]
