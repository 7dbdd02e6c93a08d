"""A run directory's resolved config (`config.json`): launch and restart write it just before
the trainer starts, and the trainer is started from it (`train --config RUN_DIR/config.json`).
A restart reads it back and applies its overrides to it; nothing rewrites argv."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_train import protocol
from dflash_train.config import OPTIONS, ConfigError, ResolvedConfig, resolve
from dflash_train.config.cli_options import parse_flags, resolve_train_args
from dflash_train.config.loader import Layer, cli_layer, environment_layer, record_layer
from dflash_train.config.train_config import RESTART_OWNED
from dflash_train.control.settings import reported_settings
from dflash_train.rundir import RunDir, atomic_write_json, read_json


@dataclass(frozen=True)
class OverrideError(ValueError):
    """`code` is the reply's error code: bad_override for a value, bad_train_args for a
    word after `--` that is no train option."""

    code: str
    message: str

    def __str__(self) -> str:
        return self.message


def write_run_config(run_dir: RunDir, resolved: ResolvedConfig) -> None:
    atomic_write_json(run_dir.config, resolved.record())


def with_values(resolved: ResolvedConfig, source: str, **values: Any) -> ResolvedConfig:
    """The config with checked values set by `source` (launch's run id, say); an option
    whose value does not change keeps its source."""
    config = resolved.config.replace(**values)
    changed = {k for k, v in values.items() if resolved.config.get(k) != v}
    return ResolvedConfig(config, {**resolved.sources, **dict.fromkeys(changed, source)})


def recorded_config(
    run_dir: RunDir, record: Mapping[str, Any], environ: Mapping[str, str]
) -> ResolvedConfig:
    """The config the run was started with: config.json, or, for a run launched before
    configs were recorded, its recorded train args. Raises ConfigError."""
    data = read_json(run_dir.config)
    if isinstance(data, dict):
        return resolve([record_layer(data, run_dir.config)], check=False)
    args = [str(a) for a in record.get("train_args") or ()]
    # Checked whole once the overrides are applied.
    return resolve_train_args(args, environ=environ, output_dir=str(run_dir.root), check=False)


def override_values(sets: Mapping[str, str], extra: Sequence[str]) -> dict[str, object]:
    """`--set KEY=VALUE` and `-- --option VALUE` overrides as raw values by option name
    (`--set` wins). Raises OverrideError."""
    try:
        values = parse_flags(extra)
    except ConfigError as exc:
        raise OverrideError("bad_train_args", f"train args: {exc}") from None
    for key, raw in sets.items():
        if key not in OPTIONS:
            raise OverrideError(
                "bad_override", f"{key}: unknown setting (no such train option; see train --help)"
            )
        values[key] = raw
    for key in values:
        if key in RESTART_OWNED:
            raise OverrideError("bad_override", f"{key}: set by restart itself, not an override")
    return values


def _resolved_layer(resolved: ResolvedConfig, source: str) -> Layer:
    values = resolved.config.flat_record()
    return Layer(source, values, dict.fromkeys(values, source), dict(resolved.sources))


def carried_settings(
    run_dir: RunDir, run_id: object, base: ResolvedConfig, overrides: Mapping[str, object]
) -> dict[str, int]:
    """The live settings the run's stream reports in force that differ from its recorded
    config and that no override names: what `set` changed on the box, which a restart
    keeps (control.json's answered values, as the trainer applied them)."""
    reported_run, values = reported_settings(run_dir)
    if reported_run is None or reported_run != run_id:
        return {}
    recorded = base.config.live_settings()
    return {k: v for k, v in values.items() if k not in overrides and recorded.get(k) != v}


def restarted_config(
    base: ResolvedConfig,
    overrides: Mapping[str, object],
    *,
    environ: Mapping[str, str],
    owned: Mapping[str, object],
    carried: Mapping[str, int] | None = None,
) -> ResolvedConfig:
    """The recorded config with the environment's options, the live settings `carried`
    from the running trainer and the overrides over it, and the values restart owns (run
    id, resume point); checked whole. Live settings are judged against the recorded and
    carried ones with the protocol's rules, so `hs_queue_depth=4` names the hs_min_ready
    it would strand. Raises OverrideError."""
    live = {k: v for k, v in overrides.items() if k in protocol.LIVE_SETTINGS}
    carried = dict(carried or {})
    try:
        protocol.validate_settings(
            {k: str(v) for k, v in live.items()}, {**base.config.live_settings(), **carried}
        )
        return resolve(
            [
                _resolved_layer(base, "record"),
                environment_layer(environ),
                Layer("live", carried, dict.fromkeys(carried, "live (set on the box)")),
                cli_layer(overrides, "set", where="--set"),
                Layer("restart", owned),
            ]
        )
    except (protocol.SettingError, ConfigError) as exc:
        raise OverrideError("bad_override", str(exc)) from None


def changed_options(
    new: ResolvedConfig, old: ResolvedConfig, carried: Mapping[str, int] | None = None
) -> dict[str, dict[str, Any]]:
    """What the operator's overrides changed (restart reports its own run id and resume
    point, and the live settings it carried, apart)."""
    changed = new.config.changed_from(old.config)
    apart = set(RESTART_OWNED) | set(carried or ())
    return {k: v for k, v in changed.items() if k not in apart}
