"""Held-out evaluation inside the run: at every checkpoint by default (`--eval-every`), the
drafter's real acceptance length on held-out prompts and its teacher-forced acceptance on
their answers, as one `eval` event (and W&B figures), and as the checkpoint's score
(eval.json, which `status`, `export --best` and pruning read).

It runs on the training thread with target replica 0, the one already resident: no second
target load. The held-out prompts are decoded together, 16 a round (batch_decode.py), by a
batched decoder made at the first evaluation and kept (its CUDA graphs too); the plain
greedy answers it is checked against are decoded once, at batch 1, the target being frozen.
It holds the module lock (compile_guard.py) for its whole length, so no target worker runs a
forward meanwhile (extract_context is not for concurrent calls on one replica): in the async
pipeline every worker pauses producing after its current batch while the pool keeps what it
holds; in the sync pipeline training simply waits. The
drafter's weights are copied into a drafter on the target's device in the target's dtype
(float32 on a CPU, so the figures equal `dflash-train eval` of the checkpoint exactly;
bfloat16 on a GPU, stated in the event). A hybrid target (linear-attention layers: their
recurrent state cannot be cut back after a rejected draft, so the decoder cannot drive it)
is scored teacher-forced only (`tau` null). A failure is a warning event; training goes on.
A stop asked for while an evaluation runs ends it at the next round (an `eval_interrupted`
event, no score), so SIGTERM is answered within stop's timeout however slow the device."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dflash_train.checkpoint import store as checkpoints
from dflash_train.checkpoint.heldout_score import write_score
from dflash_train.control.eval_record import event_line_fields
from dflash_train.data.heldout import HeldoutError, HeldoutSet, default_heldout, load_heldout

ALIVE_EVERY_S = 5.0
ALIVE_LIMIT_S = 1800.0
# Held-out prompts decoded together in one round (more are decoded in batches of this).
EVAL_ROWS = 16


class EvalInterrupted(Exception):
    """The run is stopping: the evaluation in progress gives way."""


if TYPE_CHECKING:
    from dflash_train.decode.batch_decode import BatchSpeculator
    from dflash_train.decode.speculative import Generation
    from dflash_train.model.drafter import DFlashDrafter
    from dflash_train.training.run import TrainingRun


def eval_data_spec(data_dirs: str | Sequence[str], eval_data: str | None) -> str:
    """The held-out set a run evaluates on: --eval-data, else its data dirs' heldout.jsonl
    (the first that has one)."""
    return eval_data if eval_data is not None else default_heldout(data_dirs)


class HeldoutEvaluator:
    """`wants_save(step)`: the loop must checkpoint this step first (an explicit interval);
    `after_save(step)`: evaluate if this saved step is due."""

    def __init__(self, run: TrainingRun) -> None:
        options = run.config.run
        self.run = run
        self.every = options.eval_every  # None: at every checkpoint; 0: off
        self.prompts = options.eval_prompts
        self.tokens = options.eval_tokens
        self.spec = eval_data_spec(run.config.train.data_dir, options.eval_data)
        self.heldout: HeldoutSet | None = None
        self.last_step: int | None = None
        self._prompt_ids: list[list[int]] | None = None
        self._drafter: DFlashDrafter | None = None
        self._speculator: BatchSpeculator | None = None
        # The frozen target's plain greedy decodings, made at the first evaluation only.
        self._greedy: dict[tuple[int, ...], Generation] = {}
        self._seen: list[tuple[tuple[int, ...], tuple[int, ...]]] | None = None
        self.enabled = self.every != 0 and run.rank.is_main

    def load(self) -> None:
        """At start-up: read the held-out set, or say why the run evaluates nothing."""
        if not self.enabled:
            return
        try:
            self.heldout = load_heldout(self.spec)
        except HeldoutError as exc:
            self.enabled = False
            explicit = self.run.config.run.eval_data is not None
            if explicit:
                raise
            self._say("info", "eval_off", f"held-out evaluation off: {exc}")
            return
        print(
            f"held-out set: {len(self.heldout)} prompts, {len(self.heldout.rows)} answers "
            f"({self.heldout.source})",
            file=sys.stderr,
        )

    def wants_save(self, step: int) -> bool:
        # From the config alone: every rank must save (gather) at the same steps.
        return bool(self.every) and step % int(self.every) == 0

    def after_save(self, step: int) -> None:
        if not self.enabled or step == self.last_step or self.run.last_saved_step != step:
            return
        if self.run.stop.is_set():  # a stop asked for is answered first (stop's timeout)
            return
        if self.every is None or step % self.every == 0:
            self.evaluate(step)

    def evaluate(self, step: int) -> None:
        import torch

        from dflash_train.model.compile_guard import GUARD

        run = self.run
        self.last_step = step
        started = time.monotonic()
        # Said first: steps pause while it runs (minutes on a CPU), and the console shows why.
        self._say(
            "info",
            "eval_started",
            f"held-out evaluation at step {step}: {self.prompts} prompts x {self.tokens} tokens"
            " (training waits)",
            step=step,
        )
        alive = self._keep_alive()
        try:
            # Its own RNG stream: the run's (saved in the checkpoint just written) must go on
            # as if no evaluation had run, or a resumed run would not repeat this one.
            with GUARD.held(), torch.random.fork_rng(devices=self._cuda_indices()):
                fields = self._measure()
        except EvalInterrupted:
            self._say(
                "info",
                "eval_interrupted",
                f"held-out evaluation at step {step} stopped: the run is stopping",
                step=step,
            )
            return
        except Exception as exc:  # an evaluation never ends the training
            message = f"held-out evaluation at step {step} failed: {type(exc).__name__}: {exc}"
            self._warn("eval_failed", message.splitlines()[0], step=step)
            return
        finally:
            alive.set()
        fields |= {"step": step, "seconds": round(time.monotonic() - started, 3), "source": "run"}
        path = run.checkpoint_dir / checkpoints.step_dir_name(step)
        try:
            run.wait_for_checkpoint()  # the step folder exists once its write is done
            write_score(path, {**fields, "checkpoint": str(path)})
        except OSError as exc:
            self._warn("eval_score_failed", f"eval.json not written to {path}: {exc}", step=step)
        if run.monitor is not None:
            run.monitor.emit("event", checkpoint=str(path), **event_line_fields(fields))

    def _keep_alive(self) -> threading.Event:
        """An evaluation is progress: the monitor hears so every few seconds (its stall
        warning would otherwise call a long one on a slow CPU a hang), for at most
        ALIVE_LIMIT_S, after which a truly stuck evaluation reads as a stall. Set the
        returned event when the evaluation is over."""
        done = threading.Event()
        monitor = self.run.monitor
        if monitor is None:
            return done

        # Well inside --stall-after, however short an operator set it.
        every = min(ALIVE_EVERY_S, self.run.config.run.stall_after / 4)

        def touch() -> None:
            until = time.monotonic() + ALIVE_LIMIT_S
            monitor.touch()
            while not done.wait(every) and time.monotonic() < until:
                monitor.touch()
            monitor.touch()

        threading.Thread(target=touch, name="eval-alive", daemon=True).start()
        return done

    def _cuda_indices(self) -> list[int]:
        devices = [*self.run.target_devices, self.run.device]
        return sorted({d.index or 0 for d in devices if d.type == "cuda"})

    def _measure(self) -> dict[str, Any]:
        from dflash_train.data.prompt_ids import conversation_prompt_ids, stop_token_ids
        from dflash_train.decode.batch_decode import evaluate_batched
        from dflash_train.decode.cached_target import supports
        from dflash_train.decode.heldout_figures import (
            event_fields,
            teacher_forced,
            teacher_forced_fields,
        )

        assert self.heldout is not None
        began = time.monotonic()
        target = self.run.targets[0]
        drafter = self._weights_now()
        summary = None
        # Where an evaluation's seconds go (seconds each, in the event): what to make
        # faster next, and whether the kept greedy decodings and decoder really are kept.
        phases: dict[str, float] = {}
        if supports(target):
            if self._prompt_ids is None:
                chosen = self.heldout.prompts[: self.prompts]
                self._prompt_ids = [conversation_prompt_ids(target.tokenizer, c) for c in chosen]
            speculator = self._speculator_for(drafter)
            phases["setup"] = time.monotonic() - began
            fresh = sum((self.tokens, *p) not in self._greedy for p in self._prompt_ids)
            summary = evaluate_batched(
                speculator,
                target,
                self._prompt_ids,
                self.tokens,
                stop_token_ids(target),
                self._greedy,
                on_prompt=lambda *_: self._unless_stopping(),
                between_rounds=self._unless_stopping,
                phases=phases,
            )
        else:
            phases["setup"] = time.monotonic() - began
        max_length = self.run.config.model.max_length
        forced = time.monotonic()
        slot_acc, tau_tf = teacher_forced(
            target, drafter, self.heldout.rows, max_length, before_batch=self._unless_stopping
        )
        phases["teacher_forced"] = time.monotonic() - forced
        forced = time.monotonic()
        seen_acc, tau_seen = teacher_forced(
            target, drafter, self._seen_rows(), max_length, before_batch=self._unless_stopping
        )
        phases["teacher_forced_seen"] = time.monotonic() - forced
        if summary is not None:
            fields = event_fields(summary, slot_acc, tau_tf, self.tokens)
            fields["greedy_decoded"] = fresh  # the first evaluation's; kept after
        elif tau_tf is None:
            raise ValueError(
                "the target is a hybrid (linear-attention layers), which is scored "
                "teacher-forced only, and the held-out set has no answers to score"
            )
        else:
            fields = teacher_forced_fields(slot_acc, tau_tf, drafter.config.block_size)
        if tau_seen is not None:
            fields["tau_tf_seen"] = round(tau_seen, 4)
            fields["slot_acc_seen"] = [round(a, 4) for a in seen_acc]
        fields["dtype"] = str(target.embed_tokens.weight.dtype).removeprefix("torch.")
        fields["device"] = str(target.device)
        fields["phases_s"] = {name: round(s, 3) for name, s in phases.items()}
        return fields

    def _seen_rows(self) -> Sequence[tuple[Sequence[int], Sequence[int]]]:
        """The training samples scored teacher-forced beside the held-out answers, picked
        once: as many as those answers and cut to their length (when the held-out set has
        none: as many as the prompts decoded, cut to the tokens decoded)."""
        from dflash_train.data.heldout import answer_length, seen_sample

        if self._seen is None:
            assert self.heldout is not None
            dataset = self.run.dataset
            rows = self.heldout.rows
            count, budget = (
                (len(rows), answer_length(rows)) if rows else (self.prompts, self.tokens)
            )
            seed = int(self.run.config.get("seed"))
            self._seen = seen_sample(dataset.rows, len(dataset), count, budget, seed)
        return self._seen

    def _speculator_for(self, drafter: DFlashDrafter) -> BatchSpeculator:
        """The batched decoder of the held-out prompts (up to EVAL_ROWS a round), made at
        the first evaluation and kept: its caches and CUDA graphs read the drafter's and the
        target's weights where they are, and both are updated in place."""
        from dflash_train.decode.batch_decode import BatchSpeculator, capacity_for

        assert self._prompt_ids is not None
        kept = self._speculator
        if kept is None or not kept.fits(drafter, self._prompt_ids, self.tokens):
            self._speculator = None  # the old caches go before the new ones are made
            size = drafter.config.block_size
            capacity = capacity_for(self._prompt_ids, self.tokens, size)
            rows = min(len(self._prompt_ids), EVAL_ROWS)
            self._speculator = BatchSpeculator(self.run.targets[0], drafter, rows, capacity)
        return self._speculator

    def _unless_stopping(self) -> None:
        if self.run.stop.is_set():
            raise EvalInterrupted

    def _weights_now(self) -> DFlashDrafter:
        """The training drafter's current weights in a drafter on the target's device and
        dtype (made once, refilled every evaluation)."""
        from dflash_train.model.drafter import DFlashDrafter

        target = self.run.targets[0]
        dtype = target.embed_tokens.weight.dtype
        if self._drafter is None:
            self._drafter = DFlashDrafter(self.run.drafter.config).to(target.device, dtype).eval()
        self._drafter.load_state_dict(self.run.drafter.state_dict())
        return self._drafter

    def _warn(self, code: str, message: str, **fields: Any) -> None:
        self._say("warning", code, message, **fields)

    def _say(self, level: str, code: str, message: str, **fields: Any) -> None:
        print(message, file=sys.stderr)
        if self.run.monitor is not None:
            self.run.monitor.emit("event", level=level, code=code, message=message, **fields)
