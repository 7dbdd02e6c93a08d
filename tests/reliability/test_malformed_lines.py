"""Bad input: 1,300 malformed lines interleaved with 700 good ones are appended to the status
stream of a run the real console app follows over SSH: truncated JSON, wrong types,
missing fields, NaN constants, 2 MiB lines, binary garbage, invalid UTF-8, non-objects,
empty lines, unknown kinds, future schema versions, plus replays of earlier good lines.
Asserted: the app does not crash, every good line is applied exactly once, every bad
line is skipped and counted by reason, and the events pane shows the count."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

from dflash_train import protocol
from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.widgets.events_log import EventsLog
from tests.reliability.console_side import BOX_PYTHON, ssh_transport, trusted
from tests.sshd import ClientKey, InProcessServer
from tests.tui.console_harness import wait_until

RUN = "malformed"
GOOD = 700
BAD = 1300
HUGE = 2 * protocol.MAX_LINE_BYTES


def good_line(seq: int, step: int) -> bytes:
    return protocol.encode_line(
        "step", seq=seq, run=RUN, step=step, epoch=0, epoch_progress=step / GOOD, loss=2.0,
        acc=0.5, tau=2.0, lr=1e-4, grad_norm=1.0, tokens=step * 10, ktok_s=1.0,
    ).encode()  # fmt: skip


def envelope(seq: int, kind: str, v: int = 1) -> dict[str, object]:
    return {"v": v, "seq": seq, "t": time.time(), "run": RUN, "kind": kind}


def bad_line(rng: random.Random, seq: int) -> tuple[bytes, str | None, bool]:
    """(line, the reject code the console must count, whether it used up `seq`). A code of
    None: a replay of an old good line, which the box drops as already sent."""
    choice = rng.randrange(12)
    step = {"step": 1, "epoch": 0, "epoch_progress": 0.1, "loss": 1.0, "acc": 0.5, "tau": 1.0}
    step |= {"lr": 1e-4, "grad_norm": 1.0, "tokens": 1, "ktok_s": 1.0}
    if choice == 0:
        full = json.dumps({**envelope(seq, "step"), **step})
        return full[: rng.randrange(len(full) // 2, len(full) - 1)].encode(), "malformed_json", True
    if choice == 1:
        wrong = {**step, rng.choice(list(step)): rng.choice(["x", [1], {"a": 1}, True])}
        return json.dumps({**envelope(seq, "step"), **wrong}).encode(), "wrong_type", True
    if choice == 2:
        fields = dict(step)
        del fields[rng.choice(list(step))]
        return json.dumps({**envelope(seq, "step"), **fields}).encode(), "missing_field", True
    if choice == 3:
        text = json.dumps({**envelope(seq, "step"), **step}).replace('"loss": 1.0', '"loss": NaN')
        return text.encode(), "malformed_json", True
    if choice == 4:
        kind = rng.choice(["stepx", "hello", "", "STEP", "run_start2"])
        return json.dumps({**envelope(seq, kind), **step}).encode(), "unknown_kind", True
    if choice == 5:
        return (
            json.dumps({**envelope(seq, "step", v=rng.randrange(2, 99)), **step}).encode(),
            ("newer_version"),
            True,
        )
    if choice == 6:
        garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        garbage = garbage.replace(b"\n", b" ").replace(b"\r", b" ")
        return b"\xff\xfe" + garbage, "not_utf8", False
    if choice == 7:
        return rng.choice([b"[1, 2, 3]", b'"step"', b"42", b"null", b"true"]), "not_object", False
    if choice == 8:
        return rng.choice([b"", b"   ", b"\t"]), "empty", False
    if choice == 9:
        return b"{" * rng.randrange(1, 5000), "malformed_json", False
    if choice == 10:
        event = {**envelope(seq, "event"), "level": "info", "code": "x", "message": "y" * HUGE}
        # The box's tail does not send it: its notice arrives, counted as `oversized`.
        return json.dumps(event).encode(), "oversized", True
    return b"", None, False  # a replay; the caller substitutes an earlier good line


def build_stream(seed: int = 6) -> tuple[list[bytes], Counter[str], int]:
    rng = random.Random(seed)
    kinds = ["good"] * GOOD + ["bad"] * BAD
    rng.shuffle(kinds)
    kinds.insert(0, kinds.pop(kinds.index("good")))  # a good line first: the run is known
    lines: list[bytes] = []
    expected: Counter[str] = Counter()
    good_sent: list[bytes] = []
    seq = step = huge = 0
    for kind in kinds:
        if kind == "good":
            line = good_line(seq, step)
            good_sent.append(line)
            lines.append(line.rstrip(b"\n"))
            seq += 1
            step += 1
            continue
        line, code, used = bad_line(rng, seq)
        while code == "oversized" and huge >= 6:  # a few 2 MiB lines are enough
            line, code, used = bad_line(rng, seq)
        huge += code == "oversized"
        if code is None:
            line = rng.choice(good_sent).rstrip(b"\n")
        else:
            expected[code] += 1
        seq += used
        lines.append(line)
    return lines, expected, step


async def test_malformed_lines_are_counted_and_good_ones_all_applied(
    inproc_server: InProcessServer, client_key: ClientKey, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stream = run_dir / "status.jsonl"
    lines, expected, good_steps = build_stream()
    assert len(lines) == GOOD + BAD and good_steps == GOOD
    known = trusted(tmp_path / "known_hosts", inproc_server.port, inproc_server.host_key)
    transport = ssh_transport(inproc_server.port, known, client_key)
    options = ConsoleOptions(
        target_name="box", run_dir=str(run_dir), python=BOX_PYTHON, follow_gpus=False
    )
    app = DflashApp(transport, options)
    async with app.run_test(size=(160, 48)) as pilot:
        # The first line alone, so the first attach's history summary holds just that.
        stream.write_bytes(lines[0] + b"\n")
        deadline = time.monotonic() + 30
        while app.state.step != 0:
            assert time.monotonic() < deadline, "the console never showed the run"
            await pilot.pause(0.05)
        # The rest appended in bursts while the console follows, as a live writer would.
        with stream.open("ab") as fh:
            for start in range(1, len(lines), 100):
                fh.write(b"".join(line + b"\n" for line in lines[start : start + 100]))
                fh.flush()
                await asyncio.sleep(0.05)
        deadline = time.monotonic() + 90
        while app.state.step != GOOD - 1 or sum(app.state.rejected_lines.values()) < sum(
            expected.values()
        ):
            assert time.monotonic() < deadline, (app.state.step, app.state.rejected_lines)
            await pilot.pause(0.1)
        # The events pane's subtitle follows on a later redraw.
        total, oversized = sum(expected.values()), expected["oversized"]
        want = f"rejected lines: {total} ({total - oversized} malformed, {oversized} oversized)"
        events = app.screen.query_one(EventsLog)
        await wait_until(pilot, lambda: str(events.border_subtitle) == want)
        assert app.is_running
    state = app.state
    markers = sum(1 for e in state.events if e.code == "history_end")
    assert state.run_id == RUN and state.lines_applied - markers == GOOD
    assert [s for s, _ in state.metrics["loss"]] == list(range(GOOD))
    assert state.rejected_lines == expected, (state.rejected_lines, expected)
    assert len(expected) >= 9  # every family of bad line was tried
