"""Hostile input: shell-injection strings (`;`, `$(...)`, backticks, both quotes, newlines,
pipes, redirections, $IFS tricks) typed into every user field: host, user, jump host,
container id, profile host, run dir, python path, launch form fields and extra args, train
arguments, environment values, restart overrides and hs_min_ready. Asserted: each is
refused with a one-line error naming the field, or reaches the box as exactly the argv
word it was (the box side here is a recorder standing in for the trainer's Python, behind
real OpenSSH, its login shell and the pct shim); a canary file proves nothing ran. Hosts
are tried under an ~/.ssh/config whose ProxyCommand expands %h through a shell, which is
shown to execute such a host name when it reaches the SSH library unchecked."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Awaitable
from pathlib import Path

import asyncssh
import pytest

from dflash_train.protocol import Reply
from dflash_tui import cli
from dflash_tui.screens.min_ready_prompt import check_min_ready
from dflash_tui.sources.launch_fields import train_args as form_train_args
from dflash_tui.sources.launch_fields import validate_form
from dflash_tui.sources.session import InputError, Session
from tests.reliability.console_side import ssh_transport, trusted
from tests.sshd import ClientKey, OpenSshServer

TEMPLATES = [
    "; touch {c}", "$(touch {c})", "`touch {c}`", "' ; touch {c} ; '", '" ; touch {c} ; "',
    "&& touch {c}", "| touch {c}", "\ntouch {c}", "$IFS;touch${{IFS}}{c}", "\\'; touch {c}; #",
    "' \"$(touch {c})\" '", ">{c}", "x\r\ntouch {c}", "${{IFS}}`touch {c}`", "*; touch {c} &",
]  # fmt: skip
RECORDER = """#!{python}
import json, sys
with open({log!r}, "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
command = sys.argv[3] if len(sys.argv) > 3 else "?"
print(json.dumps({{"v": 1, "command": command, "ok": False, "error_code": "recorded",
                   "error": "recorded"}}))
"""
FORM = {
    "target_model": "smollm2", "target_gpus": "cpu", "drafter_gpus": "cpu", "pipeline": "async",
    "epochs": "1", "lr": "6e-4", "hs_queue_depth": "8", "hs_min_ready": "2", "max_steps": "",
    "extra": "", "data_dir": "/data",
}  # fmt: skip


def evils(canary: Path) -> list[str]:
    return [t.format(c=canary) for t in TEMPLATES]


class Tally:
    def __init__(self) -> None:
        self.refused = 0
        self.inert = 0

    def refuse(self, field: str, message: str) -> None:
        assert "\n" not in message and field in message, (field, message)
        self.refused += 1


async def test_box_fields_are_refused_or_inert_argv(
    openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    canary = tmp_path / "CANARY"
    log = tmp_path / "argv.jsonl"
    recorder = tmp_path / "recorder"
    recorder.write_text(RECORDER.format(python=sys.executable, log=str(log)))
    recorder.chmod(0o755)
    assert openssh_server.host_key is not None
    known = trusted(tmp_path / "known_hosts", openssh_server.port, openssh_server.host_key)
    transport = ssh_transport(openssh_server.port, known, client_key)
    tally = Tally()
    expected: list[list[str]] = []
    run_dir = str(tmp_path / "run")

    def session(run: str = run_dir, python: str = str(recorder)) -> Session:
        return Session(
            transport, run_dir=run, python=python, read_only=False, on_line=lambda line: None
        )

    async def sent(call: Awaitable[Reply], argv: list[str]) -> None:
        reply = await call
        assert reply.error_code == "recorded", reply
        expected.append(["-m", "dflash_train", *argv])
        tally.inert += 1

    async def refused(field: str, call: Awaitable[Reply]) -> None:
        with pytest.raises(InputError) as caught:
            await call
        tally.refuse(field, str(caught.value))

    wait = ["--wait", "300"]
    for evil in evils(canary):
        plain = "\n" not in evil and "\r" not in evil
        # The run directory.
        if plain:
            odd = f"{tmp_path}/run {evil}"
            await sent(session(odd).status(), ["status", odd])
        else:
            with pytest.raises(InputError) as caught:
                session(f"{tmp_path}/{evil}")
            tally.refuse("run_dir", str(caught.value))
        # Train arguments, environment values and restart overrides.
        if plain:
            await sent(
                session().launch(["--data-dir", evil], env={"NOTE": evil}),
                ["launch", run_dir, *wait, "--env", f"NOTE={evil}", "--", "--data-dir", evil],
            )
            await sent(
                session().restart(overrides={"lr": evil}),
                ["restart", run_dir, *wait, "--", "--lr", evil],
            )
        else:
            await refused("launch argument", session().launch(["--data-dir", evil]))
            await refused("environment variable NOTE", session().launch([], env={"NOTE": evil}))
            await refused("restart override lr", session().restart(overrides={"lr": evil}))
        await refused("environment variable", session().launch([], env={evil: "1"}))
        await refused("restart override", session().restart(overrides={evil: "1"}))
        # hs_min_ready, typed in the console's prompt or sent as a setting.
        with pytest.raises(ValueError) as caught:
            check_min_ready(evil, {"hs_queue_depth": 8, "hs_min_ready": 2})
        tally.refused += 1
        await refused("hs_min_ready", session().set_setting("hs_min_ready", evil))
        await refused("", session().set_setting(evil, "3"))
        # The launch form: every field at once, then the free-text extra arguments.
        values, errors = validate_form({name: evil for name in FORM})
        assert set(errors) >= {"target_gpus", "drafter_gpus", "pipeline", "epochs", "lr"}
        tally.refused += len(errors)
        values, errors = validate_form({**FORM, "data_dir": evil, "target_model": evil})
        if plain:
            assert not errors, errors
            argv = form_train_args(values)
            await sent(session().launch(argv), ["launch", run_dir, *wait, "--", *argv])
        else:
            tally.refused += len(errors)
        values, errors = validate_form({**FORM, "extra": f"--note {shlex.quote(evil)}"})
        assert not errors, errors
        argv = form_train_args(values)
        assert argv[-2:] == ["--note", evil]
        if plain:
            await sent(session().launch(argv), ["launch", run_dir, *wait, "--", *argv])
        else:
            await refused("launch argument", session().launch(argv))
        # The interpreter path on the box.
        if plain:
            reply = await session(python=f"/nonexistent/python{evil}").status()
            assert not reply.ok and reply.error_code == "no_trainer"  # exit 127
            tally.inert += 1
        else:
            with pytest.raises(InputError) as caught:
                session(python=f"/nonexistent/{evil}")
            tally.refuse("python", str(caught.value))
    await transport.close()
    await asyncio.sleep(0.2)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    assert received == expected  # every word arrived exactly as typed
    assert not canary.exists()
    assert tally.inert == 78 and tally.refused >= 200, vars(tally)


# `box` is named, as the operator's own box would be (the console refuses a destination
# that is no profile, no host that resolves and no ssh_config Host).
HOSTILE_SSH_CONFIG = """Host box
    HostName 127.0.0.1

Host *
    ProxyCommand sh -c "echo %h %r > /dev/null"
"""


async def test_destination_fields_are_refused_before_any_ssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(HOSTILE_SSH_CONFIG)
    monkeypatch.setenv("HOME", str(home))
    config = tmp_path / "dflash.toml"
    monkeypatch.setenv("DFLASH_CONFIG", str(config))
    canary = tmp_path / "CANARY"

    # The hazard is real: a host name that reaches the SSH library runs through that shell.
    proof = tmp_path / "PROOF"
    with pytest.raises((OSError, asyncssh.Error)):
        await asyncssh.connect(f"box;touch {proof};", known_hosts=None, connect_timeout=5)
    assert proof.exists()

    tried = accepted = 0
    for evil in evils(canary):
        one_line = evil.replace("\n", " ").replace("\r", " ")
        cases = [
            ([f"root@box{evil}"], "host"),
            ([f"{evil}@box"], "user"),
            (["box", "--jump", f"jump{evil}"], "jump"),
            (["box", "--container", f"200{evil}"], "--container"),
            (["box", "--run-dir", f"/runs/{evil}"], "run_dir"),
            (["box", "--python", f"/usr/bin/python3{evil}"], "python"),
            (["evil"], "host"),
        ]
        config.write_text(f"[profiles.evil]\nhost = {json.dumps('box' + one_line)}\n")
        for argv, field in cases:
            tried += 1
            args = cli.build_parser().parse_args(argv)
            try:
                # What `dflash-tui ARGV` does before it starts the app and connects.
                cli.build_console(args, cli.exec_prefix(args))
            except ValueError as exc:
                assert field in str(exc) and "\n" not in str(exc), (argv, exc)
                continue
            # Accepted only where the text travels as one inert argv word (checked by the
            # test above), never for anything that names the destination.
            assert field in ("run_dir", "python") and "\n" not in evil, argv
            accepted += 1
    assert tried == len(TEMPLATES) * 7 and accepted <= 2 * len(TEMPLATES)
    assert not canary.exists()
