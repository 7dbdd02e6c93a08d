"""Profiles: the TOML config file, its errors (naming the field), atomic writes, remember()."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_tui.sources.console_options import form_defaults
from dflash_tui.sources.profiles import (
    Config,
    LaunchDefaults,
    Profile,
    ProfileError,
    add_profile,
    config_path,
    load_config,
    remember,
    save_config,
)
from dflash_tui.sources.transport import LocalTransport, SshTransport

GOOD = """
default_profile = "gpu1"

[profiles.gpu1]
host = "gpu1.example"
port = 2222
user = "root"
container = "200"
jump = "ops@bastion:22"
run_dir = "/data/runs/r1"
python = "/opt/venv/bin/python"
theme = "dflash-dark"

[profiles.gpu1.launch]
target_model = "Qwen/Qwen3-8B"
data_dir = "/data/ds"
target_gpus = "0,1,2,3"
drafter_gpus = "4"
epochs = 6
lr = 6e-4
hs_queue_depth = 64
hs_min_ready = 30
extra_args = ["--max-steps", "100"]

[profiles.laptop]
run_dir = "/tmp/run"
watch = true
"""


def test_reads_profiles_and_builds_transports(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(GOOD)
    config = load_config(path)
    gpu1 = config.get()
    assert gpu1.name == "gpu1" and gpu1.port == 2222
    assert gpu1.command_prefix() == ("pct", "exec", "200", "--")
    assert gpu1.launch.train_args() == [
        "--target-model",
        "Qwen/Qwen3-8B",
        "--data-dir",
        "/data/ds",
        "--target-gpus",
        "0,1,2,3",
        "--drafter-gpus",
        "4",
        "--epochs",
        "6",
        "--lr",
        "0.0006",
        "--hs-queue-depth",
        "64",
        "--hs-min-ready",
        "30",
        "--max-steps",
        "100",
    ]
    transport = gpu1.transport(known_hosts=tmp_path / "known_hosts")
    assert isinstance(transport, SshTransport)
    assert transport.description == "root@gpu1.example:2222 via ops@bastion:22 (pct exec 200)"
    laptop = config.get("laptop")
    assert laptop.watch and isinstance(laptop.transport(), LocalTransport)
    with pytest.raises(ProfileError, match="'nope': not in the config"):
        config.get("nope")


def test_missing_file_is_an_empty_config(tmp_path: Path) -> None:
    config = load_config(tmp_path / "absent.toml")
    assert config.profiles == {}
    assert config.get().name == "local"


def test_config_path_honours_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASH_CONFIG", str(tmp_path / "mine.toml"))
    assert config_path() == tmp_path / "mine.toml"
    monkeypatch.delenv("DFLASH_CONFIG")
    assert config_path().name == "config.toml" and "dflash" in str(config_path())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[profiles.a]\nport = "22"', "profiles.a.port: expected an integer, got str"),
        ("[profiles.a]\nport = 70000", "profiles.a.port: 70000 is out of range"),
        ("[profiles.a]\nwatch = 1", "profiles.a.watch: expected true or false"),
        ("[profiles.a]\ncolour = 1", "profiles.a.colour: unknown setting"),
        ("[profiles.a.launch]\nepochs = 1.5", "profiles.a.launch.epochs: expected an integer"),
        ("[profiles.a.launch]\nepochs = true", "profiles.a.launch.epochs: expected an integer"),
        ("[profiles.a.launch]\nextra_args = [1]", r"profiles.a.launch.extra_args\[0\]"),
        ('[profiles.a]\nrun_dir = "a\\nb"', "profiles.a.run_dir: contains a newline"),
        ('[profiles.a]\ncontainer = "1"\nexec_prefix = ["x"]', "container or exec_prefix"),
        ("profiles = 3", "profiles: expected a table"),
        ("[profiles.a\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


ANY_OPTIONS = """
[profiles.a.launch]
num_anchors = 64
distill = 0.5
target_gpus = [0, 1]
compile_target = false
extra_args = ["--seed", "3"]
"""


def test_a_launch_table_takes_any_train_option(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(ANY_OPTIONS)
    launch = load_config(path).get("a").launch
    assert launch.num_anchors == 64 and launch.target_gpus == (0, 1) and launch.lr is None
    assert launch.train_args() == [
        "--num-anchors", "64", "--distill", "0.5", "--target-gpus", "0,1",
        "--compile-target", "false", "--seed", "3",
    ]  # fmt: skip
    form = form_defaults(launch)
    assert form["target_gpus"] == "0,1" and form["lr"] == "6e-4"
    assert form["extra"] == "--num-anchors 64 --distill 0.5 --compile-target false --seed 3"
    save_config(Config({"a": load_config(path).get("a")}), path)
    assert load_config(path).get("a").launch == launch


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("num_anchors = 0", "profiles.a.launch.num_anchors: 0 is out of range 1.."),
        ('attention = "fast"', "profiles.a.launch.attention: expected one of 'auto', 'sdpa'"),
        ('target_gpus = "gpu0"', "profiles.a.launch.target_gpus: 'gpu0' is not a device"),
        ("target_gpus = [true]", r"profiles.a.launch.target_gpus\[0\]: expected a device"),
        ('lr = "fast"', "profiles.a.launch.lr: expected a number, got str"),
        ('output_dir = "/r"', "profiles.a.launch.output_dir: unknown setting"),
        ("lrr = 1", "profiles.a.launch.lrr: unknown setting"),
    ],
)
def test_a_launch_option_is_checked_by_the_option_table(
    tmp_path: Path, entry: str, message: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f"[profiles.a.launch]\n{entry}\n")
    with pytest.raises(ProfileError, match=message):
        load_config(path)


def test_save_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "config.toml"
    config = Config(
        {
            "box": Profile(
                "box",
                host="h",
                exec_prefix=("docker", "exec", "trainer"),
                launch=LaunchDefaults(epochs=2, extra_args=("--seed", "3")),
            )
        },
        "box",
    )
    save_config(config, path)
    assert load_config(path) == config
    assert not [p for p in path.parent.iterdir() if p.name != "config.toml"]


def test_remember_theme_and_min_ready_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(GOOD)
    remember("gpu1", "theme", "dflash-light", path)
    remember("gpu1", "hs_min_ready", 12, path)
    remember("fresh", "theme", "dflash-high-contrast", path)
    config = load_config(path)
    gpu1 = config.get("gpu1")
    assert gpu1.theme == "dflash-light" and gpu1.launch.hs_min_ready == 12
    assert gpu1.launch.hs_queue_depth == 64 and gpu1.container == "200"
    assert config.get("fresh").theme == "dflash-high-contrast"
    assert config.default_profile == "gpu1"
    with pytest.raises(ProfileError, match="hs_min_ready: expected an integer"):
        remember("gpu1", "hs_min_ready", "many", path)
    with pytest.raises(ProfileError, match="colour: not a remembered setting"):
        remember("gpu1", "colour", "red", path)
    assert load_config(path).get("gpu1").launch.hs_min_ready == 12


def test_remember_and_add_profile_keep_comments_and_layout(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    text = "# top\n" + GOOD.replace("port = 2222", "port = 2222  # sshd on the box")
    path.write_text(text)
    remember("gpu1", "hs_min_ready", 12, path)
    expected = text.replace("hs_min_ready = 30", "hs_min_ready = 12")
    assert path.read_text() == expected
    add_profile(Profile("new", host="n.example"), path)
    assert path.read_text().startswith(expected)
    assert load_config(path).get("new").host == "n.example"


def test_a_write_that_would_not_load_leaves_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(GOOD + "\n[profiles.bad]\nport = 0\n")
    before = path.read_text()
    with pytest.raises(ProfileError, match=r"bad.port: 0 is out of range"):
        remember("gpu1", "theme", "dflash-light", path)
    assert path.read_text() == before


def test_keys_table_is_read_and_a_bad_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    text = "# mine\n" + GOOD + '\n[keys]\nstop = "ctrl+s"  # my muscle memory\n'
    path.write_text(text)
    config = load_config(path)
    assert config.keys == {"stop": "ctrl+s"} and config.default_profile == "gpu1"
    remember("gpu1", "theme", "dflash-light", path)
    assert path.read_text() == text.replace('theme = "dflash-dark"', 'theme = "dflash-light"')
    path.write_text('[keys]\nstop = ""\n')
    with pytest.raises(ProfileError, match=r"keys.stop: expected a key name"):
        load_config(path)
