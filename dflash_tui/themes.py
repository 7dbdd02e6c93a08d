"""The console's colour themes: TOML files of textual.theme.Theme arguments, found in the
installed package (dflash_tui/themes) or, in a source checkout, the repository's themes/."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from textual.app import App
from textual.theme import Theme

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

DEFAULT_THEME = "dflash-dark"
_THEME_ARGS = {f.name for f in fields(Theme)}


class ThemeFileError(ValueError):
    """A theme file that cannot be used, with the file and the reason."""


def themes_dir() -> Path:
    """The wheel puts the files next to this module; an editable checkout keeps them at the
    repository root, one level up."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "themes", here.parent / "themes"):
        if candidate.is_dir() and any(candidate.glob("*.toml")):
            return candidate
    raise FileNotFoundError(f"no themes/*.toml next to {here} or in {here.parent}")


def load_theme(path: Path) -> Theme:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ThemeFileError(f"{path.name}: {exc}") from None
    unknown = sorted(set(data) - _THEME_ARGS)
    if unknown:
        raise ThemeFileError(f"{path.name}: unknown theme keys {unknown}")
    if "name" not in data or "primary" not in data:
        raise ThemeFileError(f"{path.name}: 'name' and 'primary' are required")
    return Theme(**data)


def load_themes(directory: Path | None = None) -> list[Theme]:
    """Every theme in the folder, sorted by name so `t` cycles in a stable order."""
    folder = directory if directory is not None else themes_dir()
    return sorted((load_theme(p) for p in folder.glob("*.toml")), key=lambda t: t.name)


def install(app: App[Any], wanted: str | None) -> list[str]:
    """Register every theme with `app` and switch to `wanted` (the default one when it is
    unknown); returns the names in the order `t` cycles them."""
    names = []
    for theme in load_themes():
        app.register_theme(theme)
        names.append(theme.name)
    wanted = wanted or DEFAULT_THEME
    app.theme = wanted if wanted in app.available_themes else DEFAULT_THEME
    return names


PALETTE_ROLES = ("primary", "secondary", "accent", "warning", "error", "success")


def palette(app: App[Any]) -> dict[str, str]:
    """The theme's colours by role, as Rich styles name them."""
    variables = app.theme_variables
    # Textual's ANSI theme names colours "ansi_blue"; Rich styles know them as "blue".
    return {name: variables.get(name, "").removeprefix("ansi_") for name in PALETTE_ROLES}
