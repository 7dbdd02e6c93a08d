"""The run configuration: `TrainConfig`, its option table, and the loader that resolves it
from defaults, a TOML file, the environment and the command line. Standard library only
(docs/contracts.md): the console imports it to build its forms and check overrides."""

from __future__ import annotations

from dflash_train.config.loader import ResolvedConfig, load_config, resolve
from dflash_train.config.options import Option
from dflash_train.config.train_config import (
    GROUPS,
    OPTIONS,
    ConfigError,
    TrainConfig,
    check_config,
    parse_option,
)

__all__ = [
    "GROUPS",
    "OPTIONS",
    "ConfigError",
    "Option",
    "ResolvedConfig",
    "TrainConfig",
    "check_config",
    "load_config",
    "parse_option",
    "resolve",
]
