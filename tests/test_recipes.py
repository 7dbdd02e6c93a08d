"""The named recipes (dflash_train/config/recipes.py) are where the tests, the demo, the
console's launch form and README's commands take their options from: README's
`dflash-train train` and `launch` commands are recipes, each whole, so a recipe changed
there or a command changed in README fails here until the other follows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from dflash_train.config import ConfigError, TrainConfig, parse_option
from dflash_train.config.cli_options import parse_flags
from dflash_train.config.recipes import PLACES, QWEN27B_8GPU, RECIPES, Recipe, recipe

ROOT = Path(__file__).resolve().parents[1]
ENV_WORD = re.compile(r"[A-Z][A-Z0-9_]*=\S*")


def shell_commands(markdown: str) -> list[list[str]]:
    """The commands of the ```bash blocks as words: continuation lines joined, comments
    and leading environment assignments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            while words and ENV_WORD.fullmatch(words[0]):
                words = words[1:]
            if words:
                commands.append(words)
    return commands


def train_options(words: list[str]) -> dict[str, Any] | None:
    """The checked options a `dflash-train train|launch` command gives, but its places; None
    for another command, or one whose options are in a --config file."""
    if words[:2] == ["dflash-train", "train"]:
        flags = words[2:]
    elif words[:2] == ["dflash-train", "launch"]:
        flags = words[words.index("--") + 1 :]
    else:
        return None
    if "--config" in flags:
        return None
    given = parse_flags(flags)
    return {name: parse_option(name, raw) for name, raw in given.items() if name not in PLACES}


def recipe_named_by(options: dict[str, Any]) -> list[str]:
    return [r.name for r in RECIPES.values() if r.values == options]


def test_readme_train_and_launch_commands_are_recipes() -> None:
    commands = shell_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    found = [options for words in commands if (options := train_options(words)) is not None]
    # train, launch, then the measured CPU run, in README's order.
    assert [recipe_named_by(options) for options in found] == [
        ["cpu_readme"],
        ["cpu_readme"],
        ["cpu_trainer_demo"],
    ]


def test_the_27b_command_of_the_configuration_guide_is_its_recipe() -> None:
    """docs/configuration.md spells some defaults out and names its own model path: the
    config it trains is the recipe's."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    found = [o for words in shell_commands(text) if (o := train_options(words)) is not None]
    assert len(found) == 1
    options = {k: v for k, v in found[0].items() if k != "target_model"}
    assert TrainConfig.from_values(options) == TrainConfig.from_values(QWEN27B_8GPU.values)


def test_a_recipe_is_checked_by_the_option_table_and_names_no_place() -> None:
    with pytest.raises(ConfigError, match=r"num_anchors \(recipe bad\): 0 is out of range 1\.\."):
        Recipe("bad", "", (("num_anchors", "0"),))
    with pytest.raises(ConfigError, match="recipe bad: data_dir: a place, given by the caller"):
        Recipe("bad", "", (("data_dir", "/data"),))
    with pytest.raises(ConfigError, match=r"recipe 'gpu': unknown \(known: cpu_tiny, "):
        recipe("gpu")


def test_argv_and_but_keep_the_typed_words_in_order() -> None:
    readme = recipe("cpu_readme")
    assert readme.argv(leave_out=("target_model", "target_gpus", "drafter_gpus"))[-4:] == [
        "--epochs",
        "6",
        "--lr",
        "2e-3",
    ]
    longer = readme.but("longer", "", epochs="8", seed="3")
    assert longer.argv()[-6:] == ["--epochs", "8", "--lr", "2e-3", "--seed", "3"]
    assert longer.values["lr"] == 2e-3 and readme.values["epochs"] == 6
