"""`TrainConfig`: every option of a training run, grouped (what to train, run, optimiser,
model, pipeline), each field carrying its type, default, bounds and help. The table of
options, the command line, the TOML file, restart overrides and the console's forms all
come from these dataclasses. Standard library only: the console imports it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dflash_train import protocol
from dflash_train.config.options import Option, OptionError, option


class ConfigError(ValueError):
    """One line naming the option (or file, or key) at fault and the reason."""


# A run id names the run's checkpoint folder (checkpoint_layout.py checks it the same way).
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _run_id_rule(value: str) -> None:
    if not RUN_ID_PATTERN.fullmatch(value) or value in (".", ".."):
        raise OptionError(
            f"{value!r} is not 1-64 letters, digits, '_', '-' or '.' starting with a letter "
            "or digit (it names the run's checkpoint folder)"
        )


def _mask_token_rule(value: str) -> None:
    """`auto`, `learned` or a token id (mask_token.py reads it)."""
    if value not in ("auto", "learned") and not value.isdigit():
        raise OptionError(f"expected auto, learned or a token id, got {value!r}")


@dataclass(frozen=True)
class TrainWhat:
    """What to train: the frozen target, the prepared data, where the run lives."""

    target_model: str = option(
        "str", None, "HF model dir, smollm2, or random:<preset>", required=True, metavar="M"
    )
    data_dir: str | tuple[str, ...] = option(
        "str",
        None,
        "dataset written by `prepare`; repeat the flag to train on several (one tokenizer), "
        "DIR*K to take DIR's samples K times an epoch",
        required=True,
        repeatable=True,
    )
    output_dir: str = option("str", None, "the run directory", required=True)


@dataclass(frozen=True)
class RunOptions:
    run_id: str | None = option(
        "str", None, "default: a fresh id", env="DFLASH_RUN_ID", metavar="ID", rule=_run_id_rule
    )
    resume_from: str | None = option(
        "str", None, "a checkpoint dir, or latest", metavar="PATH|latest"
    )
    init_from: str | None = option(
        "str", None, "start the drafter from these weights (an export or a checkpoint dir) "
        "with a fresh optimizer and schedule; its shape must match", metavar="PATH",
    )  # fmt: skip
    save_every: int = option("int", 500, "steps between checkpoints; 0: epoch ends only", minimum=0)
    keep_checkpoints: int = option("int", 3, "newest checkpoints kept", minimum=1)
    max_bad_steps: int = option("int", 20, "non-finite steps in a row that end the run", minimum=1)
    log_every: int = option("int", 1, "steps per `step` line", minimum=1)
    eval_every: int | None = option(
        "int", None, "steps between held-out evaluations, each checkpointed first "
        "(default: at every checkpoint; 0: off)", minimum=0, metavar="STEPS",
    )  # fmt: skip
    eval_prompts: int = option("int", 16, "held-out prompts decoded per evaluation", minimum=1)
    eval_tokens: int = option("int", 128, "new tokens at most per held-out prompt", minimum=1)
    eval_data: str | None = option(
        "str", None, "the held-out set: a prepared data dir (its heldout.jsonl), a .jsonl "
        "file, or builtin (default: DATA_DIR/heldout.jsonl, the first of the data dirs that "
        "has one)", metavar="DIR|FILE",
    )  # fmt: skip
    wandb_project: str | None = option("str", None, "log to this W&B project (offline w/o key)")
    wandb_entity: str | None = option("str", None, "the W&B team or user (default: the key's)")
    wandb_name: str | None = option("str", None, "the W&B run's display name (default: run id)")
    wandb_tags: str | None = option("str", None, "W&B tags, comma-separated", metavar="A,B")
    wandb_group: str | None = option("str", None, "the W&B group the run belongs to")
    profile_interval: float = option(
        "float", 30.0, "seconds between `profile` lines", minimum=0.5, env="DFLASH_PROFILE_INTERVAL"
    )
    stall_after: float = option(
        "float",
        300.0,
        "seconds without progress before the trainer warns and falls silent",
        minimum=1.0,
        env="DFLASH_STALL_AFTER",
    )


@dataclass(frozen=True)
class OptimiserOptions:
    epochs: int = option("int", 6, "passes over the data", minimum=1)
    max_steps: int | None = option("int", None, "stop after this many steps", minimum=1)
    lr: float = option("float", 6e-4, "peak learning rate (AdamW)", above=0.0)
    warmup_ratio: float = option(
        "float", 0.04, "share of the steps spent warming up", minimum=0.0, below=1.0
    )
    weight_decay: float = option("float", 0.01, "AdamW weight decay", minimum=0.0)
    grad_clip: float = option("float", 1.0, "gradient norm clip", above=0.0)
    distill: float = option(
        "float",
        0.0,
        "share of each label taken from the target's own next-token distribution (0: the "
        "greedy token alone); runs the target to its last layer",
        minimum=0.0,
        maximum=1.0,
    )
    seed: int = option("int", 0, "seeds weights, batch order, anchors and the pool")


@dataclass(frozen=True)
class ModelOptions:
    """The drafter's shape and the data it is fed."""

    block_size: int = option("int", 16, "tokens per draft block (slot 0 is the anchor)", minimum=2)
    num_anchors: int = option("int", 512, "blocks per sequence per step", minimum=1)
    draft_layers: int = option("int", 5, "drafter decoder layers", minimum=1)
    target_layers: int | None = option(
        "int", None, "k context layers (default 5, fewer when the target is too shallow)", minimum=1
    )
    max_length: int = option("int", 2048, "tokens per sample, longer ones are cut", minimum=1)
    tokens_per_batch: int = option("int", 16384, "tokens per batch, padding included", minimum=1)
    num_buckets: int = option("int", 8, "length buckets for batching", minimum=1)
    mask_token: str = option(
        "str",
        "auto",
        "block mask: auto (a real token id, never in the data), a token id, or learned "
        "(a vector no inference engine loads)",
        metavar="auto|ID|learned",
        rule=_mask_token_rule,
    )
    attention: str = option(
        "choice",
        "auto",
        "drafter attention: flex (block-sparse), sdpa (dense mask), or auto: flex where the "
        "GPU runs it, else sdpa",
        choices=("auto", "sdpa", "flex"),
        env="DFLASH_ATTENTION",
    )
    compile_drafter: bool = option(
        "bool", True, "torch.compile the drafter layers' pointwise work: norms, rotary, SwiGLU, "
        "residuals (CUDA drafters only)",
        env="DFLASH_COMPILE_DRAFTER",
    )  # fmt: skip
    ce_kernel: str = option(
        "choice", "auto", "the lm_head loss's chunk kernel on a GPU: liger (Liger-Kernel's "
        "cross-entropy, the liger extra), inductor (compiled), or auto: liger where it is "
        "installed; a distilled loss always runs inductor's",
        choices=("auto", "inductor", "liger"),
    )  # fmt: skip


@dataclass(frozen=True)
class PipelineOptions:
    pipeline: str = option(
        "choice", "async", "async: target workers feed a pool; sync: one step at a time",
        choices=("sync", "async"),
    )  # fmt: skip
    target_gpus: tuple[str, ...] | None = option(
        "devices",
        None,
        "one target replica and worker per entry (default: the drafter devices)",
        metavar="cpu|0,1,...",
    )
    drafter_gpus: tuple[str, ...] | None = option(
        "devices",
        None,
        "one rank per entry, DDP when several (default: GPU 0, else cpu)",
        metavar="cpu|5,6,...",
    )
    compile_target: bool = option(
        "bool", True, "torch.compile the target's decoder layers (CUDA targets only)",
        env="DFLASH_COMPILE_TARGET",
    )  # fmt: skip
    target_dtype: str = option(
        "choice", "bf16", "the target's decoder linears: bf16, or fp8 (torchao float8 with "
        "rowwise scales, CUDA 8.9+; opt-in: it shifts the hidden states a little)",
        choices=("bf16", "fp8"),
    )  # fmt: skip
    hs_queue_depth: int | None = option(
        "int", None, "most hidden-state batches held ready (default 8, live)", minimum=1,
        maximum=protocol.LIVE_SETTINGS["hs_queue_depth"].maximum, live=True,
    )  # fmt: skip
    hs_min_ready: int | None = option(
        "int", None, "ready batches before the drafter draws one (default 2, live)", minimum=1,
        maximum=protocol.LIVE_SETTINGS["hs_min_ready"].maximum, live=True,
    )  # fmt: skip


# Group name (a TOML table, a section of --print-config) -> its dataclass, in help order.
GROUPS: dict[str, type] = {
    "train": TrainWhat,
    "run": RunOptions,
    "optimiser": OptimiserOptions,
    "model": ModelOptions,
    "pipeline": PipelineOptions,
}
GROUP_TITLES = {
    "train": "what to train",
    "run": "run",
    "optimiser": "optimiser",
    "model": "drafter and data",
    "pipeline": "pipeline",
}


# Options a restart sets itself (same or new run id, where to resume, the run dir), never
# taken as an operator's override.
RESTART_OWNED = ("run_id", "resume_from", "output_dir")


def _table() -> dict[str, Option]:
    table: dict[str, Option] = {}
    for group, cls in GROUPS.items():
        for f in dataclasses.fields(cls):
            table[f.name] = dataclasses.replace(f.metadata["option"], name=f.name, group=group)
    return table


# Every option by name: the one table the CLI, the file loader and the console read.
OPTIONS: dict[str, Option] = _table()


def unknown_option(name: str) -> ConfigError:
    import difflib

    close = difflib.get_close_matches(name, OPTIONS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(f"{name}: unknown option{hint}")


def parse_option(name: str, raw: object, where: str = "") -> Any:
    """The checked value of one option; raises ConfigError naming it (and where it came from)."""
    spec = OPTIONS.get(name)
    if spec is None:
        raise unknown_option(name)
    try:
        return spec.parse(raw)
    except OptionError as exc:
        label = f"{name} ({where})" if where else name
        raise ConfigError(f"{label}: {exc}") from None


@dataclass(frozen=True)
class TrainConfig:
    train: TrainWhat = dataclasses.field(default_factory=TrainWhat)
    run: RunOptions = dataclasses.field(default_factory=RunOptions)
    optimiser: OptimiserOptions = dataclasses.field(default_factory=OptimiserOptions)
    model: ModelOptions = dataclasses.field(default_factory=ModelOptions)
    pipeline: PipelineOptions = dataclasses.field(default_factory=PipelineOptions)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> TrainConfig:
        """From already checked values by option name; the others keep their defaults."""
        for name in values:
            if name not in OPTIONS:
                raise unknown_option(name)
        groups = {}
        for group, group_cls in GROUPS.items():
            mine = {k: v for k, v in values.items() if OPTIONS[k].group == group}
            groups[group] = group_cls(**mine)
        return cls(**groups)

    def get(self, name: str) -> Any:
        spec = OPTIONS.get(name)
        if spec is None:
            raise unknown_option(name)
        return getattr(getattr(self, spec.group), name)

    def values(self) -> dict[str, Any]:
        """Every option by name, in table order."""
        return {name: self.get(name) for name in OPTIONS}

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with checked values changed."""
        return TrainConfig.from_values({**self.values(), **changes})

    def to_record(self) -> dict[str, dict[str, Any]]:
        """Grouped JSON-ready values: the shape of a config file."""
        record: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        for name, value in self.values().items():
            spec = OPTIONS[name]
            record[spec.group][name] = spec.to_json(value)
        return record

    def flat_record(self) -> dict[str, Any]:
        """Flat JSON-ready values (run_start's `config`)."""
        return {name: OPTIONS[name].to_json(value) for name, value in self.values().items()}

    def live_settings(self) -> dict[str, int]:
        """The live settings to start with: the given ones over the protocol's defaults."""
        given = {k: self.get(k) for k in protocol.LIVE_SETTINGS}
        return {**protocol.DEFAULT_SETTINGS, **{k: v for k, v in given.items() if v is not None}}

    def changed_from(self, other: TrainConfig) -> dict[str, dict[str, Any]]:
        """name -> {"from", "to"} (JSON-ready) for every option that differs."""
        mine, theirs = self.values(), other.values()
        return {
            name: {"from": OPTIONS[name].to_json(theirs[name]), "to": OPTIONS[name].to_json(v)}
            for name, v in mine.items()
            if v != theirs[name]
        }


def check_config(config: TrainConfig) -> None:
    """The required options and the checks between fields; raises ConfigError."""
    for name, spec in OPTIONS.items():
        if spec.required and not config.get(name):
            raise ConfigError(f"{name}: required (give {spec.flag} or set {name} in a config file)")
    try:
        protocol.validate_settings(config.live_settings(), {})
    except protocol.SettingError as exc:
        raise ConfigError(str(exc)) from None
