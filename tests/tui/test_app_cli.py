"""The `dflash-tui` command line: help without a connection, destinations, exec prefixes,
profiles with flags on top, and the themes it ships."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dflash_tui import cli_args, themes
from dflash_tui.sources.console_options import form_defaults, remember_in
from dflash_tui.sources.profiles import LaunchDefaults, Profile, load_config, save_config

FLAGS = ["--run-dir", "/data/runs/r1"]


def parse(*argv: str):  # type: ignore[no-untyped-def]
    args = cli_args.build_parser().parse_args(list(argv))
    return args, cli_args.exec_prefix(args)


def test_help_works_without_connecting() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_tui.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--container", "--exec-prefix", "--run-dir", "--watch", "--theme", "--jump"):
        assert flag in done.stdout


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu-box", cli_args.HostSpec("gpu-box", None, None)),
        ("root@gpu-box", cli_args.HostSpec("gpu-box", "root", None)),
        ("root@10.0.0.5:2222", cli_args.HostSpec("10.0.0.5", "root", 2222)),
        ("[::1]:2200", cli_args.HostSpec("::1", None, 2200)),
    ],
)
def test_destinations(text: str, expected: cli_args.HostSpec) -> None:
    assert cli_args.parse_host(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [("box:ssh", "port 'ssh'"), ("box:70000", "1..65535"), ("root@", "no host name")],
)
def test_bad_destinations_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(cli_args.UsageError, match=message):
        cli_args.parse_host(text)


def test_container_and_exec_prefix() -> None:
    assert parse("box", "--container", "200")[1] == ["pct", "exec", "200", "--"]
    assert parse("box", "--exec-prefix", "docker exec -i 'my trainer'")[1] == [
        "docker",
        "exec",
        "-i",
        "my trainer",
    ]
    with pytest.raises(cli_args.UsageError, match="numeric container id"):
        parse("box", "--container", "200; rm -rf /")
    with pytest.raises(cli_args.UsageError, match="cannot split"):
        parse("box", "--exec-prefix", "docker 'open")


def test_container_and_exec_prefix_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse("box", "--container", "200", "--exec-prefix", "docker exec x")


def test_profile_with_flags_on_top(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("DFLASH_CONFIG", str(config))
    launch = LaunchDefaults(target_model="Qwen/Qwen3-8B", epochs=6, max_length=4096)
    box = Profile("box", host="gpu-box", container="200", run_dir="/r", launch=launch)
    save_config(load_config(config).__class__({"box": box}), config)
    args, prefix = parse("box", "--watch", "--theme", "dflash-light")
    profile = cli_args.choose_profile(args, prefix)
    assert (profile.host, profile.command_prefix(), profile.run_dir) == (
        "gpu-box",
        ("pct", "exec", "200", "--"),
        "/r",
    )
    assert profile.watch and profile.theme == "dflash-light"
    form = form_defaults(profile.launch)
    assert form["target_model"] == "Qwen/Qwen3-8B" and form["epochs"] == "6"
    assert form["extra"] == "--max-length 4096"
    args, prefix = parse("root@other:2222", "--exec-prefix", "docker exec t", *FLAGS)
    adhoc = cli_args.choose_profile(args, prefix)
    assert (adhoc.host, adhoc.user, adhoc.port) == ("other", "root", 2222)
    assert adhoc.command_prefix() == ("docker", "exec", "t") and adhoc.run_dir == "/data/runs/r1"


def test_remembering_for_a_host_keeps_it_a_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in tmux: `m` on a `root@host:port` console stored a profile of that name holding
    only hs_min_ready, and the next console for the same destination ran locally."""
    monkeypatch.setenv("DFLASH_CONFIG", str(tmp_path / "config.toml"))
    args, prefix = parse("root@127.0.0.1:2222", "--watch", "--run-dir", "/r")
    remember_in(cli_args.choose_profile(args, prefix))("hs_min_ready", 4)
    args, prefix = parse("root@127.0.0.1:2222")
    again = cli_args.choose_profile(args, prefix)
    assert (again.host, again.user, again.port) == ("127.0.0.1", "root", 2222)
    assert again.launch.hs_min_ready == 4
    assert not again.watch and again.run_dir != "/r"  # one session's flags are not stored


def test_unknown_theme_name_is_refused() -> None:
    with pytest.raises(cli_args.UsageError, match=r"unknown theme 'neon' \(known: dflash-dark"):
        cli_args.check_theme("neon")
    cli_args.check_theme("dflash-high-contrast")


def test_unknown_theme_file_keys_are_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('name = "x"\nprimary = "#fff"\nsparkle = true\n')
    with pytest.raises(themes.ThemeFileError, match="sparkle"):
        themes.load_themes(tmp_path)


def test_shipped_themes() -> None:
    names = [t.name for t in themes.load_themes()]
    assert names == ["dflash-dark", "dflash-high-contrast", "dflash-light"]
    assert themes.themes_dir().name == "themes"


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflash_tui.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def test_help_lists_every_subcommand_and_version_answers() -> None:
    done = _cli("--help")
    assert done.returncode == 0, done.stderr
    listed = done.stdout.split("subcommands (each takes --help):", 1)[1]
    for word in ("fleet", "replay", "serve", "demo", "paths"):
        assert f"\n  {word} " in listed
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("dflash-tui 0.")


def test_a_word_that_is_no_profile_host_or_subcommand_is_refused(tmp_path: Path) -> None:
    """Seen: `dflash-tui info` opened a console that reconnected to host 'info' forever."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DFLASH_CONFIG": str(tmp_path / "c")}
    done = _cli("info", env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "dflash-tui: error: no profile or host named 'info' "
        "(subcommands: fleet, replay, serve, demo, paths)"
    )
    assert not (tmp_path / "c").exists()


def test_ssh_config_aliases_count_as_hosts(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host *\n  User root\nHost gpu-* !gpu-old\n  HostName 10.0.0.5\n")
    assert cli_args._ssh_config_names("gpu-box", config)
    assert not cli_args._ssh_config_names("gpu-old", config)
    assert not cli_args._ssh_config_names("info", config)  # `Host *` names no host
    cli_args.check_host_exists("localhost")
    cli_args.check_host_exists("root@127.0.0.1:2222")


def test_paths_names_the_config_file_and_the_rest(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DFLASH_CONFIG": str(tmp_path / "c")}
    done = _cli("paths", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    names = [line.split()[0] for line in lines[::2]]
    assert names == ["config", "themes", "demo", "cache", "known_hosts", "ssh_config"]
    assert lines[0].split()[1:] == [str(tmp_path / "c"), "[not", "there", "yet]"]
    assert "$DFLASH_CONFIG is set" in lines[1]
    assert lines[8].split()[1] == str(tmp_path / ".ssh" / "known_hosts")


def test_a_local_console_never_imports_asyncssh() -> None:
    code = (
        "import sys\n"
        "import dflash_tui.cli, dflash_tui.app, dflash_tui.demo, dflash_tui.fleet_console\n"
        "from dflash_tui.sources.profiles import Profile\n"
        "Profile('local').transport()\n"
        "print('asyncssh' in sys.modules)\n"
        "Profile('box', host='gpu-box').transport()\n"
        "print('asyncssh' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
