"""The targets:drafters split of N GPUs that trains fastest (`dflash-train plan`), from two
rates of one GPU each: the target stage (Ktok/s one target replica produces) and the drafter
step (Ktok/s one drafter rank consumes). The async pipeline runs at its slower side, so a
split t:d gives min(t x target, d x drafter) and each stage's utilisation is that over its
own capacity. The rates come from a run's stream (its `profile` lines hold each stage's
mean ms per batch, its `step` lines the tokens per batch) or are given. Standard library."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dflash_train import protocol

# The drafter's side of a step: its forward+backward and the optimiser (profile stages).
DRAFTER_STAGES = ("drafter_fwd_bwd", "optimizer")
TARGET_STAGE = "target_fwd"


@dataclass(frozen=True)
class StageRates:
    target_ktok_s: float
    drafter_ktok_s: float
    source: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Split:
    targets: int
    drafters: int
    ktok_s: float
    target_util: float
    drafter_util: float

    @property
    def ratio(self) -> str:
        return f"{self.targets}:{self.drafters}"


def split_rate(rates: StageRates, targets: int, drafters: int) -> Split:
    produce = targets * rates.target_ktok_s
    consume = drafters * rates.drafter_ktok_s
    rate = min(produce, consume)
    return Split(
        targets, drafters, round(rate, 3), round(rate / produce, 3), round(rate / consume, 3)
    )


def topology_split(
    rates: StageRates, target_devices: Sequence[str], drafter_devices: Sequence[str]
) -> Split:
    """The predicted rate of a run's own placement, devices shared or not. A device's time is
    shared by what runs on it: target replicas on one device together make at most one
    device's worth of target stage (they split its time); each drafter rank consumes an equal
    share r / ranks (DDP steps in lock step), costing its device r / (ranks x drafter) of its
    time. With B drafter ranks on the devices that hold targets, those devices make
    (devices - r B / (ranks x drafter)) x target, so r = devices x target / (1 + target B /
    (ranks x drafter)), and no drafter device may be over-full: r <= ranks x drafter / (the
    most ranks on one device). Disjoint devices give split_rate's min(t x target, d x drafter);
    one shared device gives target x drafter / (target + drafter), the stages taking turns.
    The utilisations are the shares of its own devices' time each stage uses."""
    if not target_devices or not drafter_devices:
        raise ValueError("a run needs at least one target and one drafter device")
    ranks = len(drafter_devices)
    t_devices = set(target_devices)
    per_device = {d: list(drafter_devices).count(d) for d in set(drafter_devices)}
    on_targets = sum(n for d, n in per_device.items() if d in t_devices)
    produce = len(t_devices) * rates.target_ktok_s
    consume = ranks * rates.drafter_ktok_s
    rate = min(
        produce / (1.0 + rates.target_ktok_s * on_targets / consume),
        consume / max(per_device.values()),
    )
    return Split(
        len(target_devices),
        ranks,
        round(rate, 3),
        round(rate / produce, 3),
        round(rate * max(per_device.values()) / consume, 3),
    )


def all_splits(rates: StageRates, gpus: int) -> list[Split]:
    """Every split with at least one GPU on each side, targets ascending."""
    if gpus < 2:
        raise ValueError(f"gpus: {gpus} leaves no GPU for one of the two stages (need 2+)")
    return [split_rate(rates, t, gpus - t) for t in range(1, gpus)]


def best_split(rates: StageRates, gpus: int) -> Split:
    """The fastest split; between equals, the one whose slower stage idles least."""
    return max(
        all_splits(rates, gpus), key=lambda s: (s.ktok_s, min(s.target_util, s.drafter_util))
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def rates_from_lines(lines: Iterable[protocol.StatusLine]) -> StageRates:
    """The stage rates of the newest run in a stream. Raises ValueError (one line) when the
    stream holds no profile with both stages yet."""
    start: protocol.StatusLine | None = None
    profiles: list[dict[str, Any]] = []
    steps: list[tuple[int, int]] = []
    for line in lines:
        if line.kind == "run_start":
            start, profiles, steps = line, [], []
        elif line.kind == "profile":
            profiles.append(line["stages_ms"])
        elif line.kind == "step":
            steps.append((int(line["step"]), int(line["tokens"])))
    if start is None:
        raise ValueError("the stream has no run_start: not a training run's status.jsonl")
    usable = [p for p in profiles if p.get(TARGET_STAGE) and p.get(DRAFTER_STAGES[0])]
    if not usable:
        raise ValueError(
            "no profile line with both target_fwd and drafter_fwd_bwd yet (the first comes "
            "one profile interval after the start)"
        )
    if len(usable) > 1:
        usable = usable[1:]  # the first interval holds the compile and warm-up
    target_ms = _mean([p[TARGET_STAGE] for p in usable])
    drafter_ms = _mean([sum(p.get(s, 0.0) for s in DRAFTER_STAGES) for p in usable])
    first, last = (steps[0], steps[-1]) if steps else ((0, 0), (0, 0))
    if last[0] > first[0]:
        tokens = (last[1] - first[1]) / (last[0] - first[0])
    else:
        tokens = float(start["config"].get("tokens_per_batch") or 0)
    if tokens <= 0:
        raise ValueError("no tokens per batch: neither two step lines nor tokens_per_batch")
    topology = start["topology"]
    notes = []
    shared = set(topology.get("target") or ()) & set(topology.get("drafter") or ())
    # In the sync pipeline the stages take turns, so each one's time is its own even on a
    # shared device; the async pipeline overlaps them there.
    if shared and topology.get("pipeline") != "sync":
        notes.append(
            f"target and drafter shared {', '.join(sorted(shared))}: each stage's time holds "
            "the other's kernels too, so both rates are lower bounds"
        )
    source = (
        f"stream of run {start.run}: {len(usable)} profile lines, target_fwd {target_ms:.1f} "
        f"ms, drafter {drafter_ms:.1f} ms per batch of {tokens:.0f} tokens"
    )
    return StageRates(
        round(tokens / target_ms, 3), round(tokens / drafter_ms, 3), source, tuple(notes)
    )


def read_stream(path: Path) -> list[protocol.StatusLine]:
    lines = []
    with path.open("rb") as fh:
        for raw in fh:
            decoded = protocol.decode_line(raw)
            if isinstance(decoded, protocol.StatusLine):
                lines.append(decoded)
    return lines


def plan_record(
    rates: StageRates, gpus: int, current: tuple[Sequence[str], Sequence[str]] | None = None
) -> dict[str, Any]:
    """The reply's data: the rates, the best split, every split, and the run's own placement
    (its target and drafter devices) as topology_split predicts it."""
    record: dict[str, Any] = {
        "gpus": gpus,
        "rates": asdict(rates) | {"notes": list(rates.notes)},
        "best": asdict(best_split(rates, gpus)),
        "splits": [asdict(s) for s in all_splits(rates, gpus)],
    }
    if current is not None:
        record["current"] = asdict(topology_split(rates, *current)) | {
            "target_devices": list(current[0]),
            "drafter_devices": list(current[1]),
        }
    return record


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def table(record: dict[str, Any]) -> str:
    best = record["best"]
    rows = [f"{'split':>6}  {'Ktok/s':>8}  {'target util':>11}  {'drafter util':>12}"]
    for s in record["splits"]:
        mark = (
            "  <- best"
            if (s["targets"], s["drafters"]) == (best["targets"], best["drafters"])
            else ""
        )
        rows.append(
            f"{s['targets']:>3}:{s['drafters']:<2}  {s['ktok_s']:8.2f}  {s['target_util']:11.0%}  "
            f"{s['drafter_util']:12.0%}{mark}"
        )
    rates = record["rates"]
    rows.append(
        f"one GPU: target stage {rates['target_ktok_s']:.2f} Ktok/s, drafter step "
        f"{rates['drafter_ktok_s']:.2f} Ktok/s ({rates['source']})"
    )
    rows.extend(f"note: {note}" for note in rates["notes"])
    current, measured = record.get("current"), record.get("measured")
    if current is not None:
        targets = _count(current["targets"], "target replica")
        drafters = _count(current["drafters"], "drafter rank")
        on = [", ".join(sorted(set(current[f"{side}_devices"]))) for side in ("target", "drafter")]
        rows.append(
            f"the run's own placement ({targets} on {on[0]}, {drafters} on {on[1]}): "
            f"~{current['ktok_s']:.2f} Ktok/s"
        )
    if measured is not None:
        rows.append(
            "measured by a calibration run: target on {target_device}, drafter on "
            "{drafter_device}, {pipeline} pipeline, {steps} steps in {seconds:.0f} s".format(
                **measured
            )
        )
    return "\n".join(rows)
