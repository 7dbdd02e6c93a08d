"""docs/console-config.md says what the config file takes: its sample loads as it stands,
and every key the loader accepts (profile fields, the top level, the keymap's ids) is in
its tables."""

from __future__ import annotations

import re
from pathlib import Path

from dflash_tui import keymap
from dflash_tui.sources import profiles

DOC = Path(__file__).resolve().parents[2] / "docs" / "console-config.md"


def test_the_sample_loads_and_every_key_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    sample = re.search(r"```toml\n(.*?)```", text, re.S)
    assert sample is not None
    config = profiles._parse_config(sample.group(1), DOC)
    assert config.default_profile in config.profiles and config.keys
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    accepted = set(profiles._PROFILE_FIELDS) | {"exec_prefix", "alerts", "default_profile"}
    assert accepted <= documented, accepted - documented
    for entry in keymap.KEYMAP:
        assert f"`{entry.id}`" in text, entry.id
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "docs/console-config.md" in readme
