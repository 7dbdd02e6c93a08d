"""The uniform average of drafter exports of one architecture, written as an export of its
own: stochastic weight averaging over the quality runs' warm restarts, whose exports are each
the end of one cosine schedule begun from the one before (run K+1 = `--init-from` run K).

    python bench/quality/average_exports.py OUT EXPORT EXPORT [EXPORT ...]

Each input is an export dir (config.json + model.safetensors); their configs must agree. The
mean is taken in float32 and written in the first input's dtype, with `dflash_export.json`
naming every input and its sha256, so `dflash-train eval --drafter OUT` measures it like any
export. Session 42 measured it on runs 12-14
(results/quality_smollm2/averaging_cpu_2026-12-07/).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from dflash_train.checkpoint.export import export_drafter, load_exported, servable
from dflash_train.checkpoint.layout import EXPORT_CONFIG, EXPORT_INFO, EXPORT_WEIGHTS
from dflash_train.model.drafter import DFlashDrafter


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def average(out: Path, exports: list[Path]) -> dict[str, Any]:
    """Write the mean of `exports` at `out`; returns what dflash_export.json records."""
    if len(exports) < 2:
        raise SystemExit("average_exports: exports: give at least two")
    try:
        drafters = [load_exported(folder) for folder in exports]  # float32 on the CPU
    except ValueError as exc:  # load_exported's one-line reason, naming the file
        raise SystemExit(f"average_exports: {exc}") from None
    first = drafters[0].config
    for folder, drafter in zip(exports[1:], drafters[1:], strict=True):
        other = drafter.config
        if other != first:
            field = next(k for k in vars(first) if getattr(first, k) != getattr(other, k))
            raise SystemExit(
                f"average_exports: {field}: {folder} has {getattr(other, field)!r}, "
                f"{exports[0]} {getattr(first, field)!r}"
            )
    states = [drafter.state_dict() for drafter in drafters]
    mean = DFlashDrafter(first)
    with torch.no_grad():
        mean.load_state_dict(
            {name: sum(s[name] for s in states) / len(states) for name in states[0]}
        )
    info = {
        "averaged_from": [
            {"export": str(folder), "sha256": _sha256(folder / EXPORT_WEIGHTS)}
            for folder in exports
        ],
        "weighting": "uniform, in float32",
        "servable": servable(first) is None,
        "exported_at": time.time(),
    }
    export_drafter(
        mean,
        out,
        # the inputs' dtype, which load_exported's float32 copies no longer carry
        str(json.loads((exports[0] / EXPORT_CONFIG).read_text("utf-8")).get("dtype", "bfloat16")),
        files={EXPORT_INFO: json.dumps(info, indent=2)},
    )
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the averaged export's dir (replaced whole)")
    parser.add_argument("exports", type=Path, nargs="+", help="export dirs of one architecture")
    args = parser.parse_args()
    info = average(args.out, args.exports)
    info["sha256"] = _sha256(args.out / EXPORT_WEIGHTS)
    print(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
