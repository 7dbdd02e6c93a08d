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
