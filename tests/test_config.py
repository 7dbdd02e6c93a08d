"""The run configuration: precedence of defaults < file < environment < flags, refusal of
unknown or misplaced keys by name, and `train --print-config` resolving a real file in a
real process without importing torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_train.config import OPTIONS, ConfigError, TrainConfig, load_config
from dflash_train.config.cli_options import resolve_train_args

ROOT = Path(__file__).resolve().parents[1]

RUN_TOML = """
lr = 1e-3
[optimiser]
epochs = 3
warmup_ratio = 0.1
[run]
profile_interval = 10
stall_after = 100
[pipeline]
target_gpus = [0, 1]
hs_queue_depth = 40
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_flags_beat_environment_beats_file_beats_defaults(tmp_path: Path) -> None:
    toml = _write(tmp_path / "run.toml", RUN_TOML)
    resolved = load_config(
        {"target_model": "random:tiny", "data_dir": "d", "output_dir": "o", "lr": "2e-4"},
        config_file=toml,
        environ={"DFLASH_STALL_AFTER": "50", "DFLASH_ATTENTION": "", "UNRELATED": "x"},
    )
    config, sources = resolved.config, resolved.sources
    assert config.optimiser.lr == 2e-4 and sources["lr"] == "cli"
    assert config.optimiser.epochs == 3 and sources["epochs"] == f"file:{toml}"
    assert config.run.profile_interval == 10.0 and sources["profile_interval"] == f"file:{toml}"
    assert config.run.stall_after == 50.0 and sources["stall_after"] == "env:DFLASH_STALL_AFTER"
    assert config.model.attention == "auto" and sources["attention"] == "default"
    assert config.pipeline.target_gpus == ("cuda:0", "cuda:1")
    assert config.live_settings() == {"hs_queue_depth": 40, "hs_min_ready": 2}
    assert config.get("seed") == 0 and sources["seed"] == "default"
    assert set(sources) == set(OPTIONS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lrr = 1e-3\n", "lrr (in {path}): unknown option (did you mean lr?)"),
        ("[optimiser]\nlrr = 1e-3\n", "lrr (in {path} [optimiser]): unknown option"),
        ("[model]\nlr = 1e-3\n", "lr (in {path} [model]): belongs in [optimiser]"),
        ("[optimizer]\nlr = 1e-3\n", "[optimizer] (in {path}): unknown table"),
        ("lr = 1e-3\n[optimiser]\nlr = 2e-3\n", "lr (in {path}): given twice"),
        ('epochs = "six"\n', "epochs (in {path}): expected an integer, got 'six'"),
        ("warmup_ratio = 1.5\n", "warmup_ratio (in {path}): must be below 1, got 1.5"),
        ('drafter_gpus = "gpu0"\n', "drafter_gpus (in {path}): 'gpu0' is not a device"),
        ("lr = \n", "config: {path}: "),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path / "run.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_config({"target_model": "t", "data_dir": "d", "output_dir": "o"}, config_file=path)
    assert str(caught.value).startswith(message.format(path=path)), caught.value
    assert "\n" not in str(caught.value)


def test_checks_between_fields_and_required_options() -> None:
    base = ["--target-model", "t", "--data-dir", "d"]
    with pytest.raises(ConfigError, match=r"^output_dir: required \(give --output-dir"):
        resolve_train_args(base)
    with pytest.raises(ConfigError, match=r"^hs_min_ready: 9 is out of range 1..hs_queue_depth=4"):
        resolve_train_args([*base, "--hs-queue-depth", "4", "--hs-min-ready", "9"], output_dir="o")
    with pytest.raises(ConfigError, match=r"^stall_after \(\$DFLASH_STALL_AFTER\): expected a"):
        resolve_train_args(base, output_dir="o", environ={"DFLASH_STALL_AFTER": "soon"})


def test_values_round_trip_through_the_record() -> None:
    config = TrainConfig().replace(target_model="t", drafter_gpus=("cuda:5", "cpu"), lr=3e-4)
    assert (
        TrainConfig.from_values(
            {
                k: OPTIONS[k].parse(v) if v is not None else None
                for k, v in config.flat_record().items()
            }
        )
        == config
    )
    changed = config.replace(epochs=8).changed_from(config)
    assert changed == {"epochs": {"from": 6, "to": 8}}


def _run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """`dflash-train ARGV` in a fresh interpreter that reports which heavy modules it loaded."""
    code = (
        "import sys\n"
        "from dflash_train.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "heavy = [m for m in ('torch', 'transformers', 'textual') if m in sys.modules]\n"
        "sys.stderr.write(f'heavy={heavy}\\n')\n"
        "sys.exit(rc)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60
    )


def test_print_config_resolves_a_file_without_torch(tmp_path: Path) -> None:
    toml = _write(
        tmp_path / "run.toml", f'target_model = "random:tiny"\ndata_dir = "d"\n{RUN_TOML}'
    )
    argv = ["train", "--config", str(toml), "--output-dir", str(tmp_path / "r"), "--seed", "7"]
    done = _run_cli(*argv, "--print-config")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "heavy=[]"
    printed = json.loads(done.stdout)
    assert printed["config"]["optimiser"] == {
        "epochs": 3, "max_steps": None, "lr": 1e-3, "warmup_ratio": 0.1, "weight_decay": 0.01,
        "grad_clip": 1.0, "distill": 0.0, "seed": 7,
    }  # fmt: skip
    assert printed["config"]["pipeline"]["target_gpus"] == ["cuda:0", "cuda:1"]
    assert printed["sources"]["seed"] == "cli" and printed["sources"]["lr"] == f"file:{toml}"
    # What it prints is itself a config file that resolves to the same run.
    again = _write(tmp_path / "printed.json", done.stdout)
    second = _run_cli("train", "--config", str(again), "--print-config")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["config"] == printed["config"]

    bad = _write(tmp_path / "bad.toml", "[run]\nsave_evry = 5\n")
    refused = _run_cli("train", "--config", str(bad), "--print-config")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines()[0] == (
        f"dflash-train train: save_evry (in {bad} [run]): unknown option (did you mean save_every?)"
    )


def test_the_documented_27b_recipe_is_the_documented_command_line() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    toml_text = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)  # type: ignore[union-attr]
    command = re.search(r"It is the same run as\n\n```bash\n(.*?)```", doc, re.S).group(1)  # type: ignore[union-attr]
    words = command.replace("\\\n", " ").split()[2:]  # after `dflash-train train`
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp) / "run.toml", toml_text)
        from_file = load_config({}, config_file=path, environ={}).config
    from_flags = resolve_train_args(words, environ={}).config
    assert from_file == from_flags
    assert from_file.pipeline.target_gpus == tuple(f"cuda:{i}" for i in range(5))
    assert from_file.live_settings() == {"hs_queue_depth": 90, "hs_min_ready": 30}


def test_the_config_package_is_standard_library_only() -> None:
    """The console imports dflash_train.config: nothing but the standard library and
    protocol.py may come with it."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import dflash_train.config, dflash_train.config.cli_options\n"
        "new = sorted(set(sys.modules) - before)\n"
        "ours = {'dflash_train', 'dflash_train.protocol'}\n"
        "bad = [m for m in new if m not in ours and not m.startswith('dflash_train.config')\n"
        "       and m.split('.')[0] not in sys.stdlib_module_names]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_launch_form_checks_with_the_option_table() -> None:
    from dflash_tui.sources.launch_fields import LAUNCH_FIELDS, FieldError, check_field

    for field in LAUNCH_FIELDS:
        if field.flag is not None:
            assert field.flag == OPTIONS[field.name].flag
    assert next(f for f in LAUNCH_FIELDS if f.name == "epochs").placeholder == "6"
    # The form refuses what the trainer refuses, with the trainer's reason...
    for name, text in (("lr", "0"), ("epochs", "0"), ("pipeline", "fast")):
        with pytest.raises(ConfigError) as trainer:
            resolve_train_args([OPTIONS[name].flag, text], output_dir="o")
        with pytest.raises(FieldError) as form:
            check_field(name, text)
        assert str(trainer.value).endswith(str(form.value)), (trainer.value, form.value)
    # ...and takes what it takes (the trainer runs with any positive learning rate).
    assert check_field("lr", "2") == "2"


def test_every_subcommand_answers_help() -> None:
    """`dflash-train COMMAND --help` for every command: argparse expands each help text with
    %-formatting, so a bare '%' in one ('2 % of the prompts') crashed `prepare --help`."""
    from dflash_train.cli import SUBCOMMANDS

    for name in SUBCOMMANDS:
        done = subprocess.run(
            [sys.executable, "-m", "dflash_train", name, "--help"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, (name, done.stderr[-2000:])
        assert done.stdout.startswith(f"usage: dflash-train {name}"), (name, done.stdout[:200])
