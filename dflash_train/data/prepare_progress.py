"""Progress of a prepare across its workers: one tqdm bar on stderr and, under the control
plane, `prepare` lines in the status stream (answers done of all, answer tokens/s per
device, truncated answers, ETA) at most every EMIT_EVERY seconds."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflash_train.stream.writer import StatusWriter

EMIT_EVERY = 2.0
POSTFIX_EVERY = 0.5


@dataclass
class WorkerTally:
    device: str
    batch_size: int | None = None
    load_s: float | None = None  # the worker's target load
    tokens: int = 0
    answers: int = 0
    truncated: int = 0
    chunks: int = 0
    samples: int = 0
    started: float = field(default_factory=time.monotonic)

    def rate(self, now: float) -> float:
        return self.tokens / max(now - self.started, 1e-9)

    def record(self, now: float) -> dict[str, Any]:
        return {
            "device": self.device,
            "batch_size": self.batch_size,
            "load_s": self.load_s,
            "answers": self.answers,
            "samples": self.samples,
            "chunks": self.chunks,
            "answer_tokens": self.tokens,
            "truncated": self.truncated,
            "tokens_per_s": round(self.rate(now), 1),
        }


class PrepareProgress:
    """`answers_total`: assistant turns to generate in this call (0 when none are)."""

    def __init__(
        self,
        answers_total: int,
        samples_total: int,
        samples_done: int,
        writer: StatusWriter | None = None,
        deadline: float | None = None,
    ) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=answers_total, desc="prepare", unit="answer", file=sys.stderr, smoothing=0.1
        )
        self.answers_total = answers_total
        self.samples_total = samples_total
        self.samples_done = samples_done
        self.writer = writer
        # `--max-seconds`' end (time.time()): the ETA is never later than it, since the
        # prepare stops there with answers left (an ETA past it was seen reading 18 s at 97 %,
        # 5 s before the cap ended the run).
        self.deadline = deadline
        self.workers: dict[int, WorkerTally] = {}
        self.started = time.monotonic()
        self._shown = 0.0
        self._emitted = 0.0
        self._last_moved: tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(w.tokens for w in self.workers.values())

    def worker(self, number: int, device: str, batch_size: int | None = None) -> WorkerSink:
        tally = self.workers.setdefault(number, WorkerTally(device))
        tally.device, tally.batch_size = device, batch_size
        return WorkerSink(self, tally)

    def add(
        self, tally: WorkerTally, tokens: int = 0, answers: int = 0, truncated: int = 0
    ) -> None:
        tally.tokens += tokens
        tally.answers += answers
        tally.truncated += truncated
        if answers:
            self.bar.update(answers)
        now = time.monotonic()
        if now - self._shown > POSTFIX_EVERY:
            self._shown = now
            rate = self.tokens / max(now - self.started, 1e-9)
            self.bar.set_postfix_str(f"{self.tokens:,} tok, {rate:,.0f} tok/s", refresh=True)
        self.emit()

    def chunk_done(self, tally: WorkerTally, samples: int) -> None:
        tally.chunks += 1
        tally.samples += samples
        self.samples_done += samples
        self.emit(force=True)

    def emit(self, force: bool = False) -> None:
        """A `prepare` line when something moved, at most every EMIT_EVERY seconds (the
        run's heartbeats keep a quiet stream fresh)."""
        now = time.monotonic()
        if self.writer is None or (not force and now - self._emitted < EMIT_EVERY):
            return
        moved = (self.tokens, self.samples_done, *(w.answers for w in self.workers.values()))
        if not force and moved == self._last_moved:
            return
        self._emitted, self._last_moved = now, moved
        self.writer.write("prepare", **self.fields(now))

    def fields(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        answers = sum(w.answers for w in self.workers.values())
        # From the first worker's start of generation: target loads are not answer time.
        since = min((w.started for w in self.workers.values()), default=self.started)
        rate = self.tokens / max(now - since, 1e-9)
        answer_rate = answers / max(now - since, 1e-9)
        left = max(self.answers_total - answers, 0)
        eta = round(left / answer_rate, 1) if answers and left else (0.0 if not left else None)
        if self.deadline is not None and left:
            cap = round(max(self.deadline - time.time(), 0.0), 1)
            eta = cap if eta is None else min(eta, cap)
        return {
            "prompts_done": self.samples_done,
            "prompts_total": self.samples_total,
            "answers_done": answers,
            "answers_total": self.answers_total,
            "answer_tokens": self.tokens,
            "tokens_per_s": round(rate, 1),
            "truncated": sum(w.truncated for w in self.workers.values()),
            "eta_s": eta,
            "devices": [w.record(now) for _, w in sorted(self.workers.items())],
        }

    def per_worker(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"worker": n, **w.record(now)} for n, w in sorted(self.workers.items())]

    def close(self) -> None:
        self.emit(force=True)
        self.bar.close()


class WorkerSink:
    """What one worker's generation reports to (run_jobs' `progress`)."""

    def __init__(self, progress: PrepareProgress, tally: WorkerTally) -> None:
        self.progress = progress
        self.tally = tally

    @property
    def tokens(self) -> int:
        return self.tally.tokens

    def add_tokens(self, count: int) -> None:
        self.progress.add(self.tally, tokens=count)

    def add_answers(self, count: int, truncated: int = 0) -> None:
        self.progress.add(self.tally, answers=count, truncated=truncated)
