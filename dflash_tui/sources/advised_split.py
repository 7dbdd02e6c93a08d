"""The trainer's `split_advice` event (a targets:drafters split of the run's GPUs that the
planner predicts faster, written by the monitor when one side keeps waiting) as the console
offers it: the advice read from the event, and the restart overrides that realise it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_train.protocol import StatusLine

SPLIT_ADVICE = "split_advice"


@dataclass(frozen=True)
class AdvisedSplit:
    seq: int
    targets: int
    drafters: int
    predicted_ktok_s: float
    current_ktok_s: float | None

    @property
    def ratio(self) -> str:
        return f"{self.targets}:{self.drafters}"

    def summary(self) -> str:
        now = "" if self.current_ktok_s is None else f" against ~{self.current_ktok_s:.1f} now"
        return f"{self.ratio} targets:drafters would give ~{self.predicted_ktok_s:.1f} Ktok/s{now}"


def read_advice(line: StatusLine) -> AdvisedSplit | None:
    """The advice of a `split_advice` event; None for any other line or a malformed one."""
    if line.kind != "event" or line.get("code") != SPLIT_ADVICE:
        return None
    split, predicted = line.get("split"), line.get("predicted_ktok_s")
    if not isinstance(split, list) or len(split) != 2 or not all(map(_is_count, split)):
        return None
    if not _is_number(predicted):
        return None
    current = line.get("current_ktok_s")
    now = float(current) if _is_number(current) else None
    return AdvisedSplit(line.seq, split[0], split[1], float(predicted), now)


def gpu_index(device: object) -> int | None:
    """The GPU of a topology entry ("cuda:3"); None for the CPU or anything else."""
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    return None


def split_overrides(topology: Mapping[str, Any], targets: int, drafters: int) -> str:
    """The restart overrides (`target_gpus=0,1,2 drafter_gpus=3,4,5,6,7`) that run `targets`
    target replicas and `drafters` drafter ranks on the GPUs the run uses now (run_start's
    topology). Raises ValueError naming why they cannot be worked out."""
    gpus: set[int] = set()
    for role in ("target", "drafter"):
        devices = topology.get(role)
        if not isinstance(devices, Sequence) or isinstance(devices, str) or not devices:
            raise ValueError(f"the run's topology names no {role} devices")
        indexes = [gpu_index(d) for d in devices]
        if None in indexes:
            raise ValueError(f"the run's {role} devices are not all GPUs: {list(devices)}")
        gpus.update(i for i in indexes if i is not None)
    if targets < 1 or drafters < 1 or targets + drafters != len(gpus):
        raise ValueError(
            f"the advice splits {targets + drafters} GPUs; the run has {len(gpus)}: "
            f"{','.join(map(str, sorted(gpus)))}"
        )
    # The same GPUs, split anew: the lowest-numbered ones run the target replicas and the
    # rest the drafter ranks (as the recipes lay an 8-GPU box out: targets 0-4, drafters
    # 5-7), so each side keeps a contiguous block of ids whatever split was there before.
    ordered = sorted(gpus)
    return f"target_gpus={_ids(ordered[:targets])} drafter_gpus={_ids(ordered[targets:])}"


def _ids(indexes: Sequence[int]) -> str:
    return ",".join(map(str, indexes))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
