"""Connection profiles in the console's TOML config file (platformdirs' user config dir, or
$DFLASH_CONFIG): where the box is, how to reach its trainer, the run directory, and the
default launch arguments. Bad entries fail with a one-line error naming the field;
writes are atomic and go through tomlkit, which edits the user's document in place: their
comments, order and layout survive every write."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import platformdirs
import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import Table

from dflash_train.config import OPTIONS, Option
from dflash_train.config.options import OptionError
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


class LaunchDefaults:
    """Arguments for `dflash-train train` that a launch starts from: any train option by its
    name (`launch.epochs`; None when not given), as the config file holds it, in the file's
    order, then `extra_args` as given. `_parse_launch` checks each by the trainer's table."""

    def __init__(self, extra_args: Sequence[str] = (), **options: Any) -> None:
        for name in options:
            if name not in OPTIONS:
                raise ProfileError(f"{name}: not a train option")
        # Lists (device lists) held as tuples: a profile is frozen and hashable.
        self.options: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in options.items()
        }
        self.extra_args = tuple(extra_args)

    def __getattr__(self, name: str) -> Any:
        if name in OPTIONS:
            return self.__dict__["options"].get(name)
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LaunchDefaults):
            return NotImplemented
        return (self.options, self.extra_args) == (other.options, other.extra_args)

    def __hash__(self) -> int:
        return hash((tuple(self.options.items()), self.extra_args))

    def __repr__(self) -> str:
        given = [f"{k}={v!r}" for k, v in self.options.items()]
        if self.extra_args:
            given.append(f"extra_args={self.extra_args!r}")
        return f"LaunchDefaults({', '.join(given)})"

    def texts(self) -> dict[str, str]:
        """Each option's value as a `dflash-train train` word."""
        return {name: _launch_text(value) for name, value in self.options.items()}

    def train_args(self) -> list[str]:
        args = [w for name, text in self.texts().items() for w in (OPTIONS[name].flag, text)]
        return args + list(self.extra_args)


def _launch_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):  # a device list: [0, 1] is "0,1"
        return ",".join(str(v) for v in value)
    return str(value)


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
# The TOML type each kind of train option takes in a launch table; the option's own rule
# (bounds, choices, devices) is the trainer's table's.
_LAUNCH_KINDS: dict[str, tuple[Any, str]] = {
    "int": _INT,
    "float": _NUMBER,
    "bool": (bool, "true or false"),
    "str": _TEXT,
    "choice": _TEXT,
    "devices": ((str, list), "a device list such as '0,1' or 'cpu'"),
}
# Where the run lives is the profile's run_dir; the launch gives it.
_NOT_IN_LAUNCH = ("output_dir",)


def _text_list(where: str, value: Any) -> tuple[str, ...]:
    _check(where, value, list, "a list of strings")
    return tuple(_check(f"{where}[{i}]", v, str, "text") for i, v in enumerate(value))


def _parse_launch(where: str, table: Any) -> LaunchDefaults:
    _check(where, table, dict, "a table")
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key == "extra_args":
            values[key] = _text_list(f"{where}.extra_args", raw)
        elif key in OPTIONS and key not in _NOT_IN_LAUNCH:
            values[key] = _launch_value(f"{where}.{key}", OPTIONS[key], raw)
        else:
            raise ProfileError(f"{where}.{key}: unknown setting")
    return LaunchDefaults(**values)


def _launch_value(where: str, spec: Option, raw: Any) -> Any:
    """The TOML value as given, once the option's table has accepted it."""
    kind, what = _LAUNCH_KINDS[spec.kind]
    _check(where, raw, kind, what)
    if isinstance(raw, list):
        for i, item in enumerate(raw):
            _check(f"{where}[{i}]", item, (str, int), "a device")
    try:
        spec.parse(raw)
    except OptionError as exc:
        raise ProfileError(f"{where}: {exc}") from None
    return raw


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
            raise ProfileError(f'{path}: keys.{name}: expected a key name such as "ctrl+s"')
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
    launch: dict[str, Any] = {
        name: list(v) if isinstance(v, tuple) else v for name, v in profile.launch.options.items()
    }
    if profile.launch.extra_args:
        launch["extra_args"] = list(profile.launch.extra_args)
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
