"""Reconnect delays: exponential growth with a cap and jitter, so many consoles that lost
the same box do not all knock on it in the same second."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    # Each delay is drawn from [(1 - jitter) * d, d].
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt number `attempt` (1 for the first retry)."""
        if attempt < 1:
            raise ValueError(f"attempt: must be at least 1, got {attempt}")
        ceiling = min(self.cap, self.initial * self.factor ** min(attempt - 1, 64))
        draw = (rng or random).random()
        return ceiling * (1.0 - self.jitter * draw)
