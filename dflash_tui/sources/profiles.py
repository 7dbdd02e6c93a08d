"""Connection profiles in the console's TOML config file (platformdirs' user config dir, or
$DFLASH_CONFIG): where the box is, how to reach its trainer, the run directory, and the
default launch arguments. Bad entries fail with a one-line error naming the field;
writes are atomic and go through tomlkit, which edits the user's document in place: their
comments, order and layout survive every write."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import platformdirs
import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Table

from dflash_tui.sources.alerts import DEFAULT_CHANNELS, check_channels
from dflash_tui.sources.session import DEFAULT_TRAINER, check_inert
from dflash_tui.sources.transport import DEFAULT, LocalTransport, Transport

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def atomic_write_text(path: Path, text: str) -> None:
    """The whole new file or the old one, never half: written beside it, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as tmp:
        tmp.write(text)
        tmp.flush()
        os.fsync(tmp.fileno())
    try:
        os.replace(tmp.name, path)
    except OSError:
        Path(tmp.name).unlink(missing_ok=True)
        raise


CONFIG_ENV = "DFLASH_CONFIG"


class ProfileError(ValueError):
    """One line naming the file, the field and what is wrong with it."""


@dataclass(frozen=True)
class LaunchDefaults:
    """Arguments for `dflash-train train` that a launch starts from."""

    target_model: str | None = None
    data_dir: str | None = None
    target_gpus: str | None = None
    drafter_gpus: str | None = None
    epochs: int | None = None
    lr: float | None = None
    hs_queue_depth: int | None = None
    hs_min_ready: int | None = None
    max_length: int | None = None
    extra_args: tuple[str, ...] = ()

    def train_args(self) -> list[str]:
        args: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "extra_args" and value is not None:
                args += [f"--{f.name.replace('_', '-')}", str(value)]
        return args + list(self.extra_args)


@dataclass(frozen=True)
class Profile:
    name: str
    host: str | None = None  # None: the box is this machine
    port: int | None = None
    user: str | None = None
    container: str | None = None  # a Proxmox container id: commands go through pct exec
    exec_prefix: tuple[str, ...] = ()
    jump: str | None = None
    run_dir: str = "runs/dflash"
    python: str = DEFAULT_TRAINER
    watch: bool = False
    theme: str | None = None
    launch: LaunchDefaults = field(default_factory=LaunchDefaults)
    # How alerts reach the operator: any of "bell", "toast", "osc" (desktop notification).
    alerts: tuple[str, ...] = DEFAULT_CHANNELS
    # A NAME=VALUE file on the box (mode 0600) for the trainer's secrets, e.g. W&B keys.
    env_file: str | None = None

    def command_prefix(self) -> tuple[str, ...]:
        if self.container is not None:
            return ("pct", "exec", self.container, "--")
        return self.exec_prefix

    def transport(self, *, known_hosts: str | os.PathLike[str] | None = None) -> Transport:
        if self.host is None:
            return LocalTransport(self.command_prefix())
        from dflash_tui.sources.ssh_transport import SshTransport  # imports asyncssh

        return SshTransport(
            self.host,
            port=self.port,
            username=self.user,
            exec_prefix=self.command_prefix(),
            jump=self.jump,
            known_hosts=DEFAULT if known_hosts is None else known_hosts,
        )


def config_path() -> Path:
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_config_dir("dflash")) / "config.toml"


def _check(where: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProfileError(f"{where}: expected {what}, got a boolean")
    if not isinstance(value, kind):
        raise ProfileError(f"{where}: expected {what}, got {type(value).__name__} {value!r}")
    if isinstance(value, str):
        try:
            check_inert(where, value)
        except ValueError as exc:
            raise ProfileError(str(exc)) from None
    return value


_TEXT = (str, "text")
_INT = (int, "an integer")
_NUMBER = ((int, float), "a number")
_PROFILE_FIELDS: dict[str, tuple[Any, str]] = {
    "host": _TEXT,
    "user": _TEXT,
    "container": _TEXT,
    "jump": _TEXT,
    "run_dir": _TEXT,
    "python": _TEXT,
    "theme": _TEXT,
    "env_file": _TEXT,
    "port": _INT,
    "watch": (bool, "true or false"),
}
_LAUNCH_FIELDS: dict[str, tuple[Any, str]] = {
    "target_model": _TEXT,
    "data_dir": _TEXT,
    "target_gpus": _TEXT,
    "drafter_gpus": _TEXT,
    "epochs": _INT,
    "lr": _NUMBER,
    "hs_queue_depth": _INT,
    "hs_min_ready": _INT,
    "max_length": _INT,
}


def _text_list(where: str, value: Any) -> tuple[str, ...]:
    _check(where, value, list, "a list of strings")
    return tuple(_check(f"{where}[{i}]", v, str, "text") for i, v in enumerate(value))


def _parse_launch(where: str, table: Any) -> LaunchDefaults:
    _check(where, table, dict, "a table")
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key == "extra_args":
            values[key] = _text_list(f"{where}.extra_args", raw)
        elif key in _LAUNCH_FIELDS:
            kind, what = _LAUNCH_FIELDS[key]
            values[key] = _check(f"{where}.{key}", raw, kind, what)
        else:
            raise ProfileError(f"{where}.{key}: unknown setting")
    return LaunchDefaults(**values)


def parse_profile(name: str, table: Any, *, where: str = "") -> Profile:
    where = where or f"profiles.{name}"
    _check(where, table, dict, "a table")
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key == "launch":
            values[key] = _parse_launch(f"{where}.launch", raw)
        elif key == "exec_prefix":
            values[key] = _text_list(f"{where}.exec_prefix", raw)
        elif key == "alerts":
            try:
                values[key] = check_channels(f"{where}.alerts", _text_list(f"{where}.alerts", raw))
            except ValueError as exc:
                raise ProfileError(str(exc)) from None
        elif key in _PROFILE_FIELDS:
            kind, what = _PROFILE_FIELDS[key]
            values[key] = _check(f"{where}.{key}", raw, kind, what)
        else:
            raise ProfileError(f"{where}.{key}: unknown setting")
    port = values.get("port")
    if port is not None and not 1 <= port <= 65535:
        raise ProfileError(f"{where}.port: {port} is out of range 1..65535")
    if values.get("container") is not None and values.get("exec_prefix"):
        raise ProfileError(f"{where}: give container or exec_prefix, not both")
    return Profile(name, **values)


@dataclass(frozen=True)
class Config:
    profiles: Mapping[str, Profile]
    default_profile: str | None = None
    # [keys]: a key binding's id to the key that replaces its own (keymap.remaps checks ids).
    keys: Mapping[str, str] = field(default_factory=dict)

    def get(self, name: str | None = None) -> Profile:
        name = name or self.default_profile
        if name is None:
            return self.profiles.get("local", Profile("local"))
        if name not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise ProfileError(f"profile {name!r}: not in the config (known: {known})")
        return self.profiles[name]


def load_config(path: Path | None = None) -> Config:
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config({})
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    return _parse_config(text, path)


def _parse_config(text: str, path: Path) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    default = data.get("default_profile")
    if default is not None:
        _check(f"{path}: default_profile", default, str, "text")
    tables = data.get("profiles", {})
    _check(f"{path}: profiles", tables, dict, "a table of profiles")
    unknown = set(data) - {"default_profile", "profiles", "keys"}
    if unknown:
        raise ProfileError(f"{path}: {sorted(unknown)[0]}: unknown setting")
    keys = data.get("keys", {})
    _check(f"{path}: keys", keys, dict, "a table of key bindings")
    for name, key in keys.items():
        if not isinstance(key, str) or not key.strip() or " " in key:
            raise ProfileError(f"{path}: keys.{name}: expected a key name such as \"ctrl+s\"")
    try:
        profiles = {name: parse_profile(name, table) for name, table in tables.items()}
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    return Config(profiles, default, keys)


def _profile_table(profile: Profile) -> dict[str, Any]:
    table: dict[str, Any] = {}
    defaults = Profile(profile.name)
    for f in fields(profile):
        value = getattr(profile, f.name)
        if f.name in ("name", "launch") or value == getattr(defaults, f.name):
            continue
        table[f.name] = list(value) if isinstance(value, tuple) else value
    launch = {
        f.name: list(v) if isinstance(v := getattr(profile.launch, f.name), tuple) else v
        for f in fields(profile.launch)
        if getattr(profile.launch, f.name) not in (None, ())
    }
    if launch:
        table["launch"] = launch
    return table


def save_config(config: Config, path: Path | None = None) -> None:
    """Write `config` whole (a new file's layout: tomlkit's)."""
    data: dict[str, Any] = {}
    if config.default_profile is not None:
        data["default_profile"] = config.default_profile
    data["profiles"] = {name: _profile_table(p) for name, p in config.profiles.items()}
    _write_checked(path or config_path(), tomlkit.dumps(data))


def _write_checked(path: Path, text: str) -> Config:
    """Replace the file only with text that `load_config` reads back: a bad entry elsewhere
    in the file fails the write, naming its field, and leaves the file as it was."""
    config = _parse_config(text, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    return config


def _edit_config(path: Path | None, edit: Callable[[Table], None]) -> Config:
    """Parse the file with tomlkit, let `edit` change the document and its `profiles`
    table in place, and write it back: everything `edit` did not touch stays byte for byte."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    try:
        document = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    profiles = document.get("profiles")
    if profiles is None:
        profiles = tomlkit.table(is_super_table=True)
        document["profiles"] = profiles
    elif not isinstance(profiles, dict):
        raise ProfileError(f"{path}: profiles: expected a table of profiles")
    edit(profiles)
    return _write_checked(path, tomlkit.dumps(document))


def _new_entry(profile: Profile) -> Table:
    table = _profile_table(profile)
    parse_profile(profile.name, table)
    entry = tomlkit.table()
    for key, value in table.items():
        entry[key] = value
    return entry


REMEMBERED = {"theme": "theme", "hs_min_ready": "launch.hs_min_ready"}


def remember(
    profile: str,
    key: str,
    value: str | int,
    path: Path | None = None,
    *,
    new: Profile | None = None,
) -> Profile:
    """Store what the operator last chose (the theme, the last hs_min_ready) in the
    profile, creating it from `new` when absent (for a `user@host` console: its
    destination, so the name keeps meaning that host); other entries are kept as they were."""
    if key not in REMEMBERED:
        raise ProfileError(f"{key}: not a remembered setting (known: {', '.join(REMEMBERED)})")
    if key == "theme":
        _check("theme", value, str, "text")
    else:
        _check(key, value, int, "an integer")

    def edit(profiles: Table) -> None:
        if profile not in profiles:
            profiles[profile] = _new_entry(new or Profile(profile))
        entry = profiles[profile]
        if key == "theme":
            entry["theme"] = value
        elif "launch" in entry:
            entry["launch"]["hs_min_ready"] = value
        else:
            entry["launch"] = {"hs_min_ready": value}

    return _edit_config(path, edit).get(profile)


def add_profile(profile: Profile, path: Path | None = None) -> None:
    """Append a profile to the config file, keeping the user's comments, order and layout
    (tomlkit edits the document in place); the result is checked as `load_config` reads it
    before it replaces the file."""

    def edit(profiles: Table) -> None:
        if profile.name in profiles:
            raise ProfileError(f"profile {profile.name!r}: already in {path or config_path()}")
        profiles[profile.name] = _new_entry(profile)

    _edit_config(path, edit)
