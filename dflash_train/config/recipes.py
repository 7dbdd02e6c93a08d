"""Named training recipes: the options that make one known kind of run, each value written as
one types it and checked by the option table when this module loads. The tests, the demo,
the console's launch form, README's examples and the benchmarks that measure them take
their options from here. A recipe names no data or run directory (the caller gives those);
options it leaves out keep the table's defaults. Standard library only: the console
imports it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_train.config.train_config import OPTIONS, ConfigError, parse_option

# Where a run reads and writes: never part of a recipe.
PLACES = ("data_dir", "output_dir", "run_id", "resume_from", "init_from")


@dataclass(frozen=True)
class Recipe:
    name: str
    purpose: str
    words: tuple[tuple[str, str], ...]  # (option name, value as typed), in flag order

    def __post_init__(self) -> None:
        for name, text in self.words:
            if name in PLACES:
                raise ConfigError(f"recipe {self.name}: {name}: a place, given by the caller")
            parse_option(name, text, where=f"recipe {self.name}")

    @property
    def texts(self) -> dict[str, str]:
        """Option name -> the value as typed."""
        return dict(self.words)

    @property
    def values(self) -> dict[str, Any]:
        """Option name -> the checked value."""
        return {name: parse_option(name, text) for name, text in self.words}

    def argv(self, *, leave_out: Sequence[str] = ()) -> list[str]:
        """The recipe as `dflash-train train` flags (but the options in `leave_out`)."""
        return [
            word
            for name, text in self.words
            if name not in leave_out
            for word in (OPTIONS[name].flag, text)
        ]

    def but(self, name: str, purpose: str, **changes: str) -> Recipe:
        """Another recipe: this one with `changes` (option name -> value as typed)."""
        words = [(k, changes.pop(k, text)) for k, text in self.words]
        return Recipe(name, purpose, (*words, *changes.items()))


def _recipe(name: str, purpose: str, **words: str) -> Recipe:
    return Recipe(name, purpose, tuple(words.items()))


CPU_TINY = _recipe(
    "cpu_tiny",
    "the tests' smallest real run: one drafter layer fed by one target layer, 4-token "
    "blocks, ~6 batches an epoch of the tiny data; about a step a second on two shared cores",
    target_gpus="cpu",
    drafter_gpus="cpu",
    draft_layers="1",
    target_layers="1",
    block_size="4",
    num_anchors="8",
    tokens_per_batch="512",
    max_length="128",
    num_buckets="2",
    # Held-out evaluation only where a test asks for it: each costs seconds on a CPU.
    eval_every="0",
)
CPU_DEMO = _recipe(
    "cpu_demo",
    "`dflash-tui demo`: SmolLM2 on this machine's CPU, small enough that two cores make "
    "visible progress, enough epochs that it keeps going",
    target_model="smollm2",
    target_gpus="cpu",
    drafter_gpus="cpu",
    epochs="1000",
    draft_layers="1",
    max_length="256",
    block_size="8",
    num_anchors="8",
    tokens_per_batch="768",
    num_buckets="2",
    save_every="100",
    keep_checkpoints="2",
    # A held-out evaluation every 40 steps (checkpointed first), sized for two cores: ~12 s
    # beside ~70 s of steps. Not at every checkpoint: the demo data's epochs are 4 steps and
    # each ends with one, so an evaluation at each took two thirds of the demo's time.
    eval_every="40",
    eval_prompts="4",
    eval_tokens="48",
)
CPU_README = _recipe(
    "cpu_readme",
    "README's CPU run: one draft layer, 8-token blocks, 1,024-token batches "
    "(bench/cpu_recipe.py measures its first step and step time)",
    target_model="smollm2",
    target_gpus="cpu",
    drafter_gpus="cpu",
    draft_layers="1",
    block_size="8",
    num_anchors="32",
    tokens_per_batch="1024",
    max_length="512",
    # The held-out evaluation sized for a CPU (the defaults, 16 x 128, take minutes there),
    # every 100 steps (each checkpointed first) rather than at the checkpoints only, every
    # 500: on two idle cores with README's data (8 held out), step 100 came 182 s after
    # run_start and its evaluation took 47.6 s (the next 32.4 s: greedy decoding is kept).
    eval_prompts="4",
    eval_tokens="64",
    eval_every="100",
    epochs="6",
    lr="2e-3",
)
CPU_TRAINER_DEMO = CPU_README.but(
    "cpu_trainer_demo",
    "README's measured CPU run (docs/trainer-demo.md has its exact calls): the README "
    "recipe for 8 epochs, measured before the in-run held-out evaluation existed",
    epochs="8",
    eval_every="0",
)
QWEN27B_8GPU = _recipe(
    "qwen27b_8gpu",
    "Qwen3.5-27B on an 8-GPU box: five target replicas, three drafter ranks (DDP), a pool "
    "of up to 90 hidden-state batches drawn from at 30 ready; the rest the table's defaults",
    target_gpus="0,1,2,3,4",
    drafter_gpus="5,6,7",
    hs_queue_depth="90",
    hs_min_ready="30",
)

RECIPES: Mapping[str, Recipe] = {
    r.name: r for r in (CPU_TINY, CPU_DEMO, CPU_README, CPU_TRAINER_DEMO, QWEN27B_8GPU)
}


def recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        known = ", ".join(RECIPES)
        raise ConfigError(f"recipe {name!r}: unknown (known: {known})") from None
