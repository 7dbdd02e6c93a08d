"""What a console is told about where it points (ConsoleOptions), and how a profile becomes
one: the launch form's defaults and the store for what the operator last chose. `dflash-tui
PROFILE`, the fleet's Enter and the demo all build their options here. Imports no Textual."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dflash_tui.sources.alerts import DEFAULT_CHANNELS
from dflash_tui.sources.launch_fields import form_fields
from dflash_tui.sources.profiles import LaunchDefaults, Profile, ProfileError, remember


@dataclass(frozen=True)
class ConsoleOptions:
    """Everything the app needs to know about where it points, gathered by the CLI
    (`console_options` below, for a profile)."""

    target_name: str
    run_dir: str
    read_only: bool = False
    python: str | None = None
    launch_defaults: Mapping[str, str] = field(default_factory=dict)
    theme: str | None = None
    remember: Callable[[str, Any], None] | None = None
    follow_gpus: bool = True
    history_points: int = 400
    # How alerts reach the operator (the profile's `alerts`): bell, toast, osc.
    alerts: tuple[str, ...] = DEFAULT_CHANNELS
    # A NAME=VALUE file on the box for the trainer (W&B keys): only its path is sent.
    env_file: str | None = None


def form_defaults(launch: LaunchDefaults) -> dict[str, str]:
    """A profile's launch defaults as the launch form's text fields."""
    return form_fields(launch.texts(), launch.extra_args)


def console_options(profile: Profile, target_name: str) -> ConsoleOptions:
    """A profile's console, as `dflash-tui PROFILE` and the fleet's Enter both open it."""
    return ConsoleOptions(
        target_name=target_name,
        run_dir=profile.run_dir,
        read_only=profile.watch,
        python=profile.python,
        launch_defaults=form_defaults(profile.launch),
        theme=profile.theme,
        remember=remember_in(profile),
        alerts=profile.alerts,
        env_file=profile.env_file,
    )


def remember_in(profile: Profile) -> Callable[[str, Any], None]:
    # A profile first created by remembering holds only the destination: flags such as
    # --watch or --run-dir of this one session must not become the profile's defaults.
    destination_only = Profile(
        profile.name, host=profile.host, port=profile.port, user=profile.user
    )

    def store(key: str, value: Any) -> None:
        try:
            remember(profile.name, key, value, new=destination_only)
        except ProfileError as exc:
            raise OSError(str(exc)) from None

    return store
