"""Advice the monitor writes as an `event` (code `split_advice`, which the console's events
pane shows) when one side of the async pipeline waits on the other for a sustained time:
the drafter starving (its consumer wait) or the pool staying full (the target workers'
producer wait). It names the split of the run's GPUs that `dflash-train plan` finds best at
the stage rates of the latest profile, and the Ktok/s it predicts against the current one."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from dflash_train.pipeline.split_plan import (
    DRAFTER_STAGES,
    TARGET_STAGE,
    StageRates,
    best_split,
    split_rate,
)

SUSTAIN_S = 600.0  # how long a side must have waited before the advice
WAIT_SHARE = 0.2  # the mean wait share over that time that counts as waiting
GAIN = 1.05  # a split must predict at least this much more to be worth a restart


class SplitAdvisor:
    def __init__(
        self, targets: int, drafters: int, sustain: float = SUSTAIN_S, share: float = WAIT_SHARE
    ) -> None:
        self.targets, self.drafters = targets, drafters
        self.sustain, self.share = sustain, share
        self._waits: deque[tuple[float, float, float]] = deque()  # (t, producer, consumer)
        self._tokens: float | None = None
        self._stages: Mapping[str, float] | None = None
        self._advised_at: float | None = None

    @classmethod
    def for_roles(cls, roles: Mapping[int, str], **kwargs: Any) -> SplitAdvisor | None:
        """For a run whose GPUs each hold one side; None otherwise (a shared GPU, the CPU)."""
        kinds = list(roles.values())
        targets, drafters = kinds.count("target"), kinds.count("drafter")
        if not targets or not drafters or targets + drafters != len(kinds):
            return None
        return cls(targets, drafters, **kwargs)

    def observe_tokens(self, tokens_per_batch: float) -> None:
        if tokens_per_batch > 0:
            self._tokens = tokens_per_batch

    def observe_queue(self, now: float, producer_wait: float, consumer_wait: float) -> None:
        self._waits.append((now, producer_wait, consumer_wait))
        while self._waits and self._waits[0][0] < now - self.sustain:
            self._waits.popleft()

    def observe_profile(self, stages: Mapping[str, float]) -> None:
        if stages.get(TARGET_STAGE) and stages.get(DRAFTER_STAGES[0]):
            self._stages = stages

    def advice(self, now: float) -> dict[str, Any] | None:
        """The event's fields once a side has waited for `sustain` seconds and another split
        predicts GAIN more; then not again for another `sustain`."""
        if self._stages is None or self._tokens is None or len(self._waits) < 2:
            return None
        if now - self._waits[0][0] < 0.9 * self.sustain:
            return None  # not watched long enough yet
        if self._advised_at is not None and now - self._advised_at < self.sustain:
            return None
        producer = sum(w[1] for w in self._waits) / len(self._waits)
        consumer = sum(w[2] for w in self._waits) / len(self._waits)
        if max(producer, consumer) < self.share:
            return None
        drafter_ms = sum(self._stages.get(s, 0.0) for s in DRAFTER_STAGES)
        rates = StageRates(
            self._tokens / self._stages[TARGET_STAGE], self._tokens / drafter_ms, "profile"
        )
        now_split = split_rate(rates, self.targets, self.drafters)
        best = best_split(rates, self.targets + self.drafters)
        if best.ktok_s < GAIN * now_split.ktok_s:
            return None
        self._advised_at = now
        minutes = self.sustain / 60
        why = (
            f"the drafter waited {consumer:.0%} of the last {minutes:.0f} min"
            if consumer >= producer
            else f"the target workers waited on a full pool {producer:.0%} of the last "
            f"{minutes:.0f} min"
        )
        return {
            "message": f"{why}: {best.ratio} targets:drafters would give ~{best.ktok_s:.1f} "
            f"Ktok/s against ~{now_split.ktok_s:.1f} at {now_split.ratio} (dflash-train plan "
            f"--from RUN_DIR); restart with that split to take it",
            "split": [best.targets, best.drafters],
            "predicted_ktok_s": best.ktok_s,
            "current_split": [self.targets, self.drafters],
            "current_ktok_s": now_split.ktok_s,
        }
