"""The `prepare` command line, generated from its option table (prepare_config.py), and the
check `launch --prepare` runs on a prepare's words before it starts anything. Standard
library only, like the rest of the config package."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from dflash_train.config.prepare_config import OPTIONS


def _help(name: str) -> str:
    spec = OPTIONS[name]
    if spec.default is None or spec.kind == "bool":
        return spec.help
    return f"{spec.help} (default {spec.text(spec.default)})"


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    for name, spec in OPTIONS.items():
        flag = "--target-model" if name == "target" else spec.flag
        if spec.kind == "bool":
            parser.add_argument(flag, dest=name, action="store_true", help=_help(name))
            continue
        parser.add_argument(
            flag,
            dest=name,
            action="append" if spec.repeatable else "store",
            required=spec.required,
            default=argparse.SUPPRESS,
            metavar=spec.metavar or ("|".join(spec.choices) if spec.choices else spec.kind.upper()),
            help=_help(name),
        )


class _Refused(Exception):
    pass


class _CheckingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(message)


def check_args(words: Sequence[str]) -> str | None:
    """Why `prepare WORDS` would be refused at once (unknown flag, bad value), or None;
    `launch --prepare` asks before it starts anything."""
    from dflash_train.config.prepare_config import PrepareError, from_words

    parser = _CheckingParser(prog="dflash-train prepare", add_help=False)
    add_prepare_arguments(parser)
    try:
        args = parser.parse_args(list(words))
        if getattr(args, "run_dir", None) is not None:
            return "run-dir: launch sets it (RUN_DIR)"
        from_words(given_options(args)).validate()
    except (_Refused, PrepareError) as exc:
        return str(exc)
    return None


def given_options(args: argparse.Namespace) -> dict[str, object]:
    """The option flags present on the command line, as their raw words."""
    return {k: v for k, v in vars(args).items() if k in OPTIONS and v is not False}
