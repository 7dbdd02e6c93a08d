"""Bad input: `set` on a running trainer with out-of-range, negative, zero, non-integer, huge
and unknown keys, typed into the console, given to the box's `dflash-train set`, and
written straight into control.json behind the CLI's back. Asserted: each gets a clear
one-line error naming the setting, the console sends nothing it refused, and the running
trainer's values are unchanged (then one good change is applied, to show the path works)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dflash_train import protocol
from dflash_train.rundir import atomic_write_text
from dflash_tui.sources.session import InputError
from tests.reliability import box
from tests.reliability.conftest import LiveRun
from tests.reliability.console_side import Recorder, ssh_transport, trusted
from tests.sshd import ClientKey, InProcessServer

DEPTH, MIN_READY = 6, 2  # what the shared run was launched with
BAD_VALUES = [
    "0", "-1", "-2147483648", "7", "4097", "99999999999999999999999999999", "1e3", "3.5",
    "0x10", "abc", "", "   ", "2 3", "NaN", "inf", "true", "null", "[3]", '"3"', "--3",
]  # fmt: skip
BAD_DEPTHS = ["0", "-6", "1", "4097", "six", "1e9"]
UNKNOWN_KEYS = ["hs_min_readyx", "lr", "HS_MIN_READY", "hs-min-ready", "__class__", "x" * 300]
EXPECTED_CODES = {"bad_value", "out_of_range", "unknown_setting"}


def bad_inputs() -> list[tuple[str, str]]:
    return (
        [("hs_min_ready", v) for v in BAD_VALUES]
        + [("hs_queue_depth", v) for v in BAD_DEPTHS]
        + [(k, "3") for k in UNKNOWN_KEYS]
    )


def control_bytes(run_dir: Path) -> bytes | None:
    path = run_dir / "control.json"
    return path.read_bytes() if path.exists() else None


def settings_now(run_dir: Path) -> dict[str, int]:
    """The values the trainer itself reports in its newest queue line."""
    queue = [ln for ln in box.lines(run_dir) if ln.kind == "queue"][-1]
    return {"hs_queue_depth": queue["hs_queue_depth"], "hs_min_ready": queue["hs_min_ready"]}


def fresh_queue_line(run_dir: Path, after_seq: int) -> protocol.StatusLine:
    return box.wait_line(
        run_dir, lambda ln: ln.kind == "queue" and ln.seq > after_seq, what="a queue line"
    )


async def test_bad_set_is_refused_and_the_trainer_keeps_its_values(
    live_run: LiveRun, inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    run_dir = live_run.run_dir
    fresh_queue_line(run_dir, box.lines(run_dir)[-1].seq)
    assert settings_now(run_dir) == {"hs_queue_depth": DEPTH, "hs_min_ready": MIN_READY}
    control_before = control_bytes(run_dir)

    # 1. The console refuses before sending anything.
    known = trusted(tmp_path / "known_hosts", inproc_server.port, inproc_server.host_key)
    transport = ssh_transport(inproc_server.port, known, client_key)
    console = Recorder()
    session = console.session(
        transport,
        run_dir,
        read_only=False,
        settings_in_force=lambda: {"hs_queue_depth": DEPTH, "hs_min_ready": MIN_READY},
    )
    for key, value in bad_inputs():
        with pytest.raises(InputError) as caught:
            await session.set_setting(key, value)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(key[:40]), message
    assert inproc_server.received() == []
    await transport.close()

    # 2. The box refuses the same inputs when they reach it directly.
    for key, value in bad_inputs():
        # `--` first: a value such as "--3" must reach the command as a value.
        reply = box.control("set", str(run_dir), "--wait", "5", "--", key, value)
        assert not reply.ok and reply.error_code in EXPECTED_CODES, (key, value, reply)
        assert reply.error and "\n" not in reply.error and reply.error.startswith(key[:40])
    assert control_bytes(run_dir) == control_before  # nothing was written for the trainer to act on

    # 3. Hostile control.json contents written behind the CLI: the trainer rejects each.
    rev = 1000
    hostile: list[str] = []
    for settings in (
        {"hs_min_ready": -3}, {"hs_min_ready": DEPTH + 1}, {"hs_queue_depth": 0},
        {"hs_min_ready": "3"}, {"hs_min_ready": 2.5}, {"hs_min_ready": True},
        {"hs_min_ready": 10**30}, {"lr": 1},
    ):  # fmt: skip
        rev += 1
        hostile.append(json.dumps({"rev": rev, "settings": settings}))
    hostile += ['{"rev": 2000, "settings": {"hs_min_ready": 3', "\x00\xff garbage", "[]"]
    for text in hostile:
        mark = box.lines(run_dir)[-1].seq
        atomic_write_text(run_dir / "control.json", text)
        answer = box.wait_line(
            run_dir,
            lambda ln, m=mark: (
                ln.kind == "event"
                and ln.seq > m
                and ln["code"] in ("control_rejected", "control_applied")
            ),
            what=f"the answer to {text!r}",
        )
        assert answer["code"] == "control_rejected" and answer["level"] == "warning", answer
        assert answer["message"] and "\n" not in answer["message"]
    mark = box.lines(run_dir)[-1].seq
    fresh_queue_line(run_dir, mark)
    assert settings_now(run_dir) == {"hs_queue_depth": DEPTH, "hs_min_ready": MIN_READY}
    events = [ln for ln in box.lines(run_dir) if ln.kind == "event"]
    assert not [ln for ln in events if ln["code"] == "control_applied"]

    # 4. A good value still goes through the same path, after all that.
    started = time.monotonic()
    good = box.control("set", str(run_dir), "hs_min_ready", "3", "--wait", "30")
    assert good.ok and good.data["settings"]["hs_min_ready"] == 3, good
    assert time.monotonic() - started < 30
    fresh_queue_line(run_dir, box.lines(run_dir)[-1].seq)
    assert settings_now(run_dir)["hs_min_ready"] == 3
    back = box.control("set", str(run_dir), "hs_min_ready", str(MIN_READY), "--wait", "30")
    assert back.ok, back
