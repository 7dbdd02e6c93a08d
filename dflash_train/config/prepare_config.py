"""`PrepareConfig`: every option of `dflash-train prepare`, each field carrying its type,
default, bounds and help (the same `option()` machinery as train's table), so the command
line, the checks and the launch form read one table. Standard library only: the console
imports it."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_train.config.options import Option, OptionError, option, parse_devices

RESPONSES = ("regenerate", "keep")
# Prompts per unit of work: a unit is answered by one worker, written when it is done, and
# is what a resume skips. Fixed, not derived from the device count, so one worker and
# eight cut the prompts the same way and write the same samples.
DEFAULT_CHUNK = 4096


class PrepareError(ValueError):
    """A one-line, operator-facing reason prepare cannot run."""


class PrepareStopped(PrepareError):
    """SIGTERM or SIGINT ended the prepare; the finished chunks stay for a resume."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def _devices_rule(value: str) -> None:
    if value != "all":
        parse_devices(value)


def _kwargs_rule(value: str) -> None:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise OptionError(f"not JSON ({exc.args[0].split(':')[0]})") from None
    if not isinstance(parsed, dict):
        raise OptionError(
            f"expected a JSON object such as '{{\"enable_thinking\": false}}', got {value!r}"
        )


@dataclass(frozen=True)
class PrepareConfig:
    target: str = option(
        "str", None, "HF model dir, 'smollm2', or 'random:<preset>'", required=True, metavar="M"
    )
    prompts: str | tuple[str, ...] = option(
        "str",
        None,
        "'builtin' (train split), a .txt file (a prompt a line), a .jsonl or .parquet file of "
        "prompts or chat data (OpenAI messages, ShareGPT or role/content conversations), a "
        "directory of such files, or synth:N (the target writes N prompts; synth:N@builtin or "
        "synth:N@FILE opens each with the first words of one of those prompts); end with *K "
        "to answer each K times; repeat the flag to mix sources",
        required=True,
        repeatable=True,
        metavar="SPEC",
    )
    # The loader turns the word into a Path (from_words).
    out: Path = option("str", None, "dataset directory to write", required=True, metavar="DIR")  # noqa: RUF009
    samples: int | None = option(
        "int", None, "samples to write (default: one per prompt; more cycles)", minimum=1
    )
    max_new_tokens: int = option("int", 256, "answer tokens at most per turn", minimum=1)
    batch_size: int | None = option(
        "int",
        None,
        "rows generated together (default: 16 on a CPU; on a GPU sized from its free memory)",
        minimum=1,
    )
    temperature: float = option("float", 0.0, "0 = greedy", minimum=0.0)
    seed: int = option("int", 0, "seeds sampling and the --samples order")
    heldout: int | None = option(
        "int",
        None,
        "prompts held out of training, answered into OUT/heldout.jsonl for the run's "
        "evaluations (default: 2 %% of the prompts rounded down, at most 64; with builtin, "
        "its eval split)",
        minimum=0,
        metavar="N",
    )
    devices: str | None = option(
        "str",
        None,
        "one worker per device: cpu, GPU indices (0,1,...,7), or all (default: the first "
        "GPU when there is one, else cpu; cpu,cpu runs two CPU workers)",
        metavar="LIST",
        rule=_devices_rule,
    )
    num_shards: int = option("int", 1, "Arrow files to split the dataset into", minimum=1)
    chunk_size: int = option(
        "int",
        DEFAULT_CHUNK,
        "prompts per unit of work (answered by one worker, written when done, skipped on a "
        "resume); one worker and many write the same samples for the same value",
        minimum=1,
    )
    overwrite: bool = option("bool", False, "replace an existing dataset directory")
    resume: bool = option(
        "bool",
        False,
        "continue an interrupted prepare (the same arguments continue it anyway, --overwrite "
        "included); refuses when none is in progress",
    )
    responses: str = option(
        "choice",
        "regenerate",
        "regenerate: the target writes every assistant turn given the conversation so far; "
        "keep: the data's own assistant turns are used as they are",
        choices=RESPONSES,
    )
    system: str | None = option(
        "str", None, "a system prompt for every conversation that has none", metavar="TEXT"
    )
    chat_template_kwargs: str | None = option(
        "str",
        None,
        "JSON object passed to the chat template, e.g. '{\"enable_thinking\": false}'",
        metavar="JSON",
        rule=_kwargs_rule,
    )
    # Answer no new batch once this many seconds have passed since prepare started (the
    # target's load and prompt synthesis count); what was answered is written.
    max_seconds: float | None = option(
        "float",
        None,
        "start no new generation batch after this many seconds (load and synthesis count); "
        "the samples answered by then are written, the reply counts the rest",
        above=0.0,
    )
    then_train: bool = option(
        "bool",
        False,
        "once every chunk is written, start the training run RUN_DIR's config.json records "
        "(`launch RUN_DIR --prepare -- PREPARE_ARGS -- TRAIN_ARGS` sets it); a failed or "
        "stopped prepare never starts it",
    )
    run_dir: str | None = option(
        "str",
        None,
        "run under the control plane: hold RUN_DIR's lock and write its status stream "
        "(`dflash-train launch RUN_DIR --prepare` sets it)",
        metavar="RUN_DIR",
    )

    @property
    def prompt_specs(self) -> tuple[str, ...]:
        return (self.prompts,) if isinstance(self.prompts, str) else tuple(self.prompts)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return json.loads(self.chat_template_kwargs) if self.chat_template_kwargs else {}

    def validate(self) -> None:
        """Every field against its option, then the output directory; raises PrepareError
        naming the flag."""
        for name, spec in OPTIONS.items():
            value = getattr(self, name)
            if name == "out":
                value = str(value)
            if name == "prompts":
                if not self.prompt_specs:
                    raise PrepareError("prompts: none given")
                continue
            if value is None:
                if spec.required:
                    raise PrepareError(f"{flag_name(name)}: required")
                continue
            reason = _refusal(spec, value)
            if reason and spec.kind in ("int", "float"):
                raise PrepareError(f"{flag_name(name)}: {value} {reason}")
            if reason:
                raise PrepareError(f"{flag_name(name)}: {reason}")
        if self.then_train and self.run_dir is None:
            raise PrepareError("then-train: needs --run-dir (launch --prepare sets both)")
        # Missing folders above --out are made (as `--out data/smol` in a fresh checkout
        # expects); the nearest one that exists must take them.
        parent = Path(self.out).absolute().parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise PrepareError(f"out: {parent} is not a directory")
        if not os.access(parent, os.W_OK):
            raise PrepareError(f"out: directory {parent} is not writable")

    def to_record(self) -> dict[str, Any]:
        """JSON-ready values (prepare.json's `config`, the work dir's fingerprint)."""
        record = dataclasses.asdict(self)
        record["out"] = str(self.out)
        return record


def flag_name(name: str) -> str:
    return name.replace("_", "-")


def _refusal(spec: Option, value: Any) -> str:
    """Why `value` breaks the option's bounds, in words ('' when it does not)."""
    if spec.kind in ("int", "float") and not isinstance(value, bool):
        if spec.minimum is not None and value < spec.minimum:
            return (
                "must not be negative"
                if spec.minimum == 0
                else f"must be at least {spec.minimum:g}"
            )
        if spec.above is not None and value <= spec.above:
            return "must be positive" if spec.above == 0 else f"must be above {spec.above:g}"
        return ""
    try:
        spec.parse(value)
    except OptionError as exc:
        return str(exc)
    return ""


def _table() -> dict[str, Option]:
    return {
        f.name: dataclasses.replace(f.metadata["option"], name=f.name, group="prepare")
        for f in dataclasses.fields(PrepareConfig)
    }


# Every prepare option by name: the CLI and the launch form read it.
OPTIONS: dict[str, Option] = _table()


def from_words(values: dict[str, Any]) -> PrepareConfig:
    """A config from raw option values by name (command-line words, lists for repeatable
    options), each parsed by its option; raises PrepareError naming the flag."""
    checked: dict[str, Any] = {}
    for name, raw in values.items():
        spec = OPTIONS[name]
        if spec.repeatable:
            words = [raw] if isinstance(raw, str) else list(raw)
            parsed = tuple(_parse(spec, word) for word in words)
            checked[name] = parsed[0] if len(parsed) == 1 else parsed
            continue
        checked[name] = _parse(spec, raw)
    if "out" in checked:
        checked["out"] = Path(checked["out"])
    return PrepareConfig(**checked)


def _parse(spec: Option, raw: object) -> Any:
    try:
        return spec.parse(raw)
    except OptionError as exc:
        raise PrepareError(f"{flag_name(spec.name)}: {exc}") from None
