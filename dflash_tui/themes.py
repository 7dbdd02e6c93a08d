"""The console's colour themes: TOML files of textual.theme.Theme arguments, found in the
installed package (dflash_tui/themes) or, in a source checkout, the repository's themes/."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

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
