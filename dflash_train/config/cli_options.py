"""The `train` command line, generated from the option table: one `--flag` per option (its
help says the default, bounds and environment variable), plus `--config FILE` and
`--print-config`. Flags are parsed as words; the option table checks them."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import NoReturn

from dflash_train.config.loader import ResolvedConfig, load_config
from dflash_train.config.train_config import (
    GROUP_TITLES,
    GROUPS,
    OPTIONS,
    ConfigError,
    TrainConfig,
)

CONTROL_DESTS = ("config", "print_config")


def _help(name: str) -> str:
    spec = OPTIONS[name]
    details = [] if spec.default is None else [f"default {spec.text(spec.default)}"]
    if spec.bounds() and not spec.choices:
        details.append(spec.bounds())
    if spec.live:
        details.append("live")
    if spec.env:
        details.append(f"env {spec.env}")
    return f"{spec.help} ({'; '.join(details)})" if details else spec.help


def add_option_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help="options from a TOML file (or a recorded config.json); flags given here win",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config and each value's source as JSON, then exit",
    )
    for group in GROUPS:
        section = parser.add_argument_group(GROUP_TITLES[group])
        for name, spec in OPTIONS.items():
            if spec.group != group:
                continue
            metavar = spec.metavar or ("|".join(spec.choices) if spec.choices else None)
            if spec.kind == "bool":
                metavar = "true|false"
            section.add_argument(
                spec.flag,
                dest=name,
                action="append" if spec.repeatable else "store",
                default=argparse.SUPPRESS,
                metavar=metavar or spec.kind.upper(),
                help=_help(name),
            )


def given_options(args: argparse.Namespace) -> dict[str, object]:
    """The option flags present on the command line, as their raw words."""
    return {k: v for k, v in vars(args).items() if k in OPTIONS}


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def resolve_train_args(
    train_args: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    output_dir: str | None = None,
    check: bool = True,
) -> ResolvedConfig:
    """The config `dflash-train train TRAIN_ARGS` would run with; raises ConfigError.
    `output_dir` is given by the caller (launch sets it from RUN_DIR)."""
    parser = _RaisingParser(prog="dflash-train train", add_help=False)
    add_option_arguments(parser)
    args = parser.parse_args(list(train_args))
    if args.print_config:
        raise ConfigError("--print-config: not for a launch")
    cli = given_options(args)
    if output_dir is not None:
        cli["output_dir"] = output_dir
    return load_config(cli, config_file=args.config, environ=environ, check=check)


def parse_flags(words: Sequence[str]) -> dict[str, object]:
    """`--option VALUE` words (a restart's `-- --lr 1e-4`) as raw values by option name;
    raises ConfigError for an unknown flag or a stray word."""
    parser = _RaisingParser(prog="dflash-train train", add_help=False)
    add_option_arguments(parser)
    args = parser.parse_args(list(words))
    if args.config is not None or args.print_config:
        raise ConfigError("--config: not an override (give options one by one)")
    return given_options(args)


def config_args(config: TrainConfig) -> list[str]:
    """Flags that give `config` on a command line: every option that differs from its
    default, the run dir and run id left out (launch sets them), the resume point last."""
    words: list[str] = []
    for name, spec in OPTIONS.items():
        value = config.get(name)
        if name not in ("output_dir", "run_id", "resume_from") and value != spec.default:
            for item in value if spec.repeatable and isinstance(value, tuple) else (value,):
                words += [spec.flag, spec.text(item)]
    if config.run.resume_from:
        words += ["--resume-from", config.run.resume_from]
    return words
