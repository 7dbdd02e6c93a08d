"""Where a run's options come from, in order of precedence: the defaults, then a config file
(TOML, or the JSON a run directory records), then the environment variables some options
name, then the command line (or a restart's `--set`). The result is a checked `TrainConfig`
and the source of every value."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_train.config.train_config import (
    GROUPS,
    OPTIONS,
    ConfigError,
    TrainConfig,
    check_config,
    parse_option,
    unknown_option,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - py3.10
    import tomli as tomllib

DEFAULT = "default"


@dataclass(frozen=True)
class Layer:
    """Raw values by option name from one source. `where` names a value in an error
    ("--lr", "in run.toml", "$DFLASH_STALL_AFTER"); `source` goes into --print-config."""

    source: str
    values: Mapping[str, object]
    where: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # per-name source, if it differs


@dataclass(frozen=True)
class ResolvedConfig:
    config: TrainConfig
    sources: Mapping[str, str]

    def record(self) -> dict[str, Any]:
        """What --print-config prints and a run directory records; readable as a config file."""
        return {"config": self.config.to_record(), "sources": dict(self.sources)}

    def to_json(self) -> str:
        return json.dumps(self.record(), indent=2)


def resolve(layers: Iterable[Layer], *, check: bool = True) -> ResolvedConfig:
    """The layers' values over the defaults, later layers winning; raises ConfigError."""
    values: dict[str, Any] = {}
    sources = dict.fromkeys(OPTIONS, DEFAULT)
    for layer in layers:
        for name, raw in layer.values.items():
            values[name] = parse_option(name, raw, layer.where.get(name, ""))
            sources[name] = layer.sources.get(name, layer.source)
    config = TrainConfig.from_values(values)
    if check:
        check_config(config)
    return ResolvedConfig(config, sources)


def _file_values(path: Path) -> dict[str, object]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config: {path}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config: {path}: not UTF-8 text") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"config: {path}: {reason}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path}: expected a table of options")
    # A recorded resolved config ({"config": ..., "sources": ...}) reads as its config.
    if set(data) == {"config", "sources"} and isinstance(data["config"], dict):
        data = data["config"]
    return _flatten(data, path)


def _flatten(data: Mapping[str, object], path: Path) -> dict[str, object]:
    """Top-level options and `[group]` tables as one mapping; a key given twice, in the
    wrong table or unknown is refused by name."""
    flat: dict[str, object] = {}
    for key, value in data.items():
        if key in GROUPS and isinstance(value, dict):
            for name, inner in value.items():
                spec = OPTIONS.get(name)
                if spec is None:
                    raise _in(unknown_option(name), f"in {path} [{key}]")
                if spec.group != key:
                    raise ConfigError(f"{name} (in {path} [{key}]): belongs in [{spec.group}]")
                _put(flat, name, inner, path)
        elif key in OPTIONS:
            _put(flat, key, value, path)
        elif isinstance(value, dict):
            tables = ", ".join(GROUPS)
            raise ConfigError(f"[{key}] (in {path}): unknown table (tables: {tables})")
        else:
            raise _in(unknown_option(key), f"in {path}")
    return flat


def _put(flat: dict[str, object], name: str, value: object, path: Path) -> None:
    if name in flat:
        raise ConfigError(f"{name} (in {path}): given twice")
    flat[name] = value


def _in(error: ConfigError, where: str) -> ConfigError:
    name, _, reason = str(error).partition(": ")
    return ConfigError(f"{name} ({where}): {reason}")


def file_layer(path: str | Path) -> Layer:
    file = Path(path).expanduser()
    values = _file_values(file)
    return Layer(f"file:{file}", values, dict.fromkeys(values, f"in {file}"))


def environment_layer(environ: Mapping[str, str] | None = None) -> Layer:
    """The options an environment variable may set (an empty variable sets nothing). This
    is the one place a training option is read from the environment."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    where: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name, spec in OPTIONS.items():
        if spec.env and env.get(spec.env, "").strip():
            values[name] = env[spec.env]
            where[name] = f"${spec.env}"
            sources[name] = f"env:{spec.env}"
    return Layer("env", values, where, sources)


def cli_layer(values: Mapping[str, object], source: str = "cli", where: str = "") -> Layer:
    """Values from command-line flags (an error names the flag) or from another source
    named by `where` (a restart's `--set`)."""
    if where:
        return Layer(source, values, dict.fromkeys(values, where))
    return Layer(source, values, {name: OPTIONS[name].flag for name in values if name in OPTIONS})


def record_layer(record: Mapping[str, object], path: str | Path) -> Layer:
    """A run directory's recorded config; its values keep the sources recorded with them."""
    config = record.get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"config: {path}: no recorded config")
    values = _flatten(config, Path(path))
    recorded = record.get("sources")
    sources = {
        k: str(v)
        for k, v in (recorded.items() if isinstance(recorded, dict) else ())
        if k in values
    }
    return Layer(f"record:{path}", values, dict.fromkeys(values, f"recorded in {path}"), sources)


def load_config(
    cli: Mapping[str, object],
    *,
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    check: bool = True,
) -> ResolvedConfig:
    """defaults < config file < environment < command line."""
    layers = [] if config_file is None else [file_layer(config_file)]
    layers += [environment_layer(environ), cli_layer(cli)]
    return resolve(layers, check=check)
