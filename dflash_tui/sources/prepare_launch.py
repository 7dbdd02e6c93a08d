"""The launch form's "prepare first" field: `prepare` flags (prompts, devices, samples...) that
turn the launch into one that prepares the data, then trains on it. The form's target and
data dir fields give prepare its --target-model and --out; the launch becomes
`launch RUN_DIR --prepare -- PREPARE_ARGS -- TRAIN_ARGS`, and the box starts the training
only once the data is complete (a failed prepare never starts it). Checked by prepare's own
option table; no Textual here."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from typing import NoReturn

from dflash_train.config.prepare_cli import add_prepare_arguments, given_options
from dflash_train.config.prepare_config import PrepareError, from_words

NAME = "prepare"
LABEL = "prepare first"
PLACEHOLDER = "blank: the data dir exists; or --prompts chat.jsonl --devices all"
HELP = (
    "`dflash-train prepare` flags: the box prepares the data dir with the target, then trains "
    "on it (training starts only once the data is complete)"
)
# Set from the form's own fields, never typed here.
FROM_FORM = ("--target-model", "--out", "--run-dir", "--then-train")
PREPARE = "--prepare"


class PrepareFieldError(ValueError):
    """The one-line reason shown under the field."""


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def prepare_words(text: str, target: str = "smollm2", out: str = "data") -> list[str]:
    """The flags as typed, checked by prepare's table with the form's target and data dir
    (paths are the box's: only their form is checked here); raises PrepareFieldError."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise PrepareFieldError(f"cannot split: {exc}") from None
    taken = [w for w in words if w.split("=", 1)[0] in FROM_FORM]
    if taken:
        raise PrepareFieldError(f"{taken[0].split('=', 1)[0]}: the form sets it")
    parser = _Parser(prog="prepare", add_help=False)
    add_prepare_arguments(parser)
    try:
        args = parser.parse_args(["--target-model", target or "smollm2", "--out", out, *words])
        from_words(given_options(args))
    except (_Refused, PrepareError) as exc:
        raise PrepareFieldError(str(exc)) from None
    return words


def check_prepare(text: str) -> str:
    if text.strip():
        prepare_words(text)
    return text.strip()


def launch_argv(values: Mapping[str, str], train: Sequence[str]) -> list[str]:
    """What follows `launch RUN_DIR`: TRAIN_ARGS alone, or, with a prepare asked for,
    `--prepare -- PREPARE_ARGS -- TRAIN_ARGS`."""
    text = values.get(NAME, "").strip()
    if not text:
        return list(train)
    target, out = values.get("target_model", ""), values.get("data_dir", "")
    words = prepare_words(text, target, out)
    return [PREPARE, "--", "--target-model", target, "--out", out, *words, "--", *train]
