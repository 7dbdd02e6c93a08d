"""Replay of a finished run: the timeline's state at any cursor equals a fresh reduction of
the stream up to it (both ways), rotated and half-written streams, the session that refuses
every control call before the transport sees it, and the app's cursor keys."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.widgets import Footer

from dflash_train import protocol
from dflash_tui.cli_args import UsageError
from dflash_tui.sources.replay import ReplayError, ReplaySession, Timeline, read_stream_file
from dflash_tui.sources.session import ReadOnlyError
from dflash_tui.sources.state import RunState
from dflash_tui.subcommands import build_replay, replay_parser
from dflash_tui.widgets.header import RunHeader
from dflash_tui.widgets.replay_bar import ReplayBar
from tests.tui.console_harness import RecordingTransport, wait_until
from tests.tui.synthetic_stream import lines as synthetic_lines
from tests.tui.synthetic_stream import write_stream


def stream(steps: int) -> list[bytes]:
    return [text.strip().encode() for text in synthetic_lines(steps)]


def reduced(raws: list[bytes], upto: int) -> RunState:
    state = RunState()
    for raw in raws[: upto + 1]:
        line = protocol.decode_line(raw)
        assert isinstance(line, protocol.StatusLine)
        state.apply(line)
    return state


def facts(state: RunState) -> tuple[object, ...]:
    return (
        state.run_id,
        state.step,
        state.epoch,
        state.latest("loss"),
        list(state.metrics["loss"]),
        state.series("loss", 64),  # the plotted, whole-run series
        [e.seq for e in state.events],
        state.settings,
        [g["util"] for g in state.gpus],
        state.queue,
        state.end,
    )


def test_every_cursor_matches_a_fresh_reduction_both_ways() -> None:
    raws = stream(700)  # ~870 lines: several snapshots (one every 256 lines)
    timeline = Timeline(raws)
    order = [len(raws) - 1, 3, 600, 599, 257, 256, 255, 0, 800, 12]
    for index in order:
        state = timeline.seek(index)
        assert facts(state) == facts(reduced(raws, index)), index
        assert timeline.clock() == timeline.time(index)


def test_cursor_moves_by_steps_and_marks() -> None:
    timeline = Timeline(stream(300))
    timeline.seek(0)
    first = timeline.next_step(1)
    assert timeline.kind(first) == "step" and timeline.line(first)["step"] == 0
    timeline.seek(first)
    assert timeline.line(timeline.next_step(1))["step"] == 1
    mark = timeline.next_mark(1)
    assert timeline.kind(mark) == "event" and timeline.line(mark)["code"] == "epoch_end"
    timeline.seek(timeline.end)
    assert timeline.next_step(1) == timeline.end  # nothing further: stays at the end
    back = timeline.next_mark(-1)
    assert timeline.kind(back) == "event" and back < timeline.end
    timeline.seek(back)
    assert timeline.kind(timeline.next_mark(-1)) == "event"  # the control ack before it


def test_cursor_moves_by_a_prepares_progress_lines() -> None:
    """A prepare has no step lines: ←/→ walk its progress lines (the H200 prepare's 165)."""
    path = Path(__file__).parents[2] / "bench/results/prepare_launch_h200_2026-12-05"
    timeline = Timeline(read_stream_file(path / "status.jsonl"))
    timeline.seek(0)
    visited = []
    while (found := timeline.next_step(1)) != timeline.end:
        visited.append(timeline.line(found)["answers_done"])
        timeline.seek(found)
    assert len(visited) == 165 and visited == sorted(visited) and visited[-1] == 112_000
    assert timeline.kind(timeline.next_step(-1)) == "prepare"


def test_rotated_and_half_written_streams(tmp_path: Path) -> None:
    raws = stream(20)
    rotated = tmp_path / "status.a1b2c3d4e5f6.jsonl"
    # A line still being written at the end, and one broken line inside.
    rotated.write_bytes(b"\n".join([*raws[:5], b"{not json", *raws[5:]]) + b'\n{"v": 1, "seq"')
    read = read_stream_file(rotated)
    assert len(read) == len(raws) + 1
    timeline = Timeline(read)
    assert len(timeline) == len(raws)
    state = timeline.seek(timeline.end)
    assert state.step == 19 and sum(state.rejected_lines.values()) == 1
    with pytest.raises(ReplayError, match="no status line"):
        Timeline([b"{not json"])


async def test_the_replay_session_sends_nothing_but_the_read(tmp_path: Path) -> None:
    write_stream(tmp_path / "run", 10)
    transport = RecordingTransport()
    session = ReplaySession(
        transport,
        run_dir=str(tmp_path / "run"),
        python="python3",
        read_only=False,  # asked for control: a replay ignores it
        on_line=lambda line: None,
    )
    assert session.read_only
    calls = [
        session.launch(["--epochs", "1"]),
        session.stop(),
        session.restart(fresh=True, overrides={}),
        session.set_setting("hs_min_ready", "3"),
    ]
    for call in calls:
        with pytest.raises(ReadOnlyError, match="replay"):
            await call
    with pytest.raises(ReadOnlyError, match="replay"):  # the one door every command uses
        await session._call("stop", ["stop", "run"], 1.0)
    assert transport.commands == []


async def test_replay_over_the_box_tail_reads_the_whole_stream(tmp_path: Path) -> None:
    import sys

    run_dir = tmp_path / "run"
    write_stream(run_dir, 40)
    transport = RecordingTransport()
    session = ReplaySession(
        transport, run_dir=str(run_dir), python=sys.executable, on_line=lambda line: None
    )
    raws = await session.load()
    assert raws == (run_dir / "status.jsonl").read_bytes().splitlines()
    assert [argv[3:] for argv in transport.commands] == [["tail", str(run_dir), "--from-seq", "-1"]]
    missing = ReplaySession(
        transport, run_dir=str(tmp_path / "nope"), python=sys.executable, on_line=print
    )
    with pytest.raises(ReplayError, match="not a directory"):
        await missing.load()


async def test_replay_app_cursor_keys_and_no_control(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    write_stream(run_dir, 300)
    app = build_replay(replay_parser().parse_args([str(run_dir)]))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, lambda: app.timeline is not None)
        timeline = app.timeline
        assert timeline is not None and timeline.position == timeline.end
        assert app.state.step == 299 and app.read_only and app.session.read_only
        await pilot.press("home")
        assert app.state.step is None and app.state.run_id is not None
        await pilot.press("right", "right", "right")
        assert app.state.step == 2
        await pilot.press("]")
        assert timeline.kind(timeline.position) == "event" and app.state.step == 50
        # The epoch's event follows step 50's line: one step back is that line, then 49.
        await pilot.press("left")
        assert timeline.kind(timeline.position) == "step" and app.state.step == 50
        await pilot.press("left")
        assert app.state.step == 49
        await pilot.press("[")
        assert timeline.position < timeline.next_step(1)
        for key in ("l", "S", "R", "m"):
            toasts = len(app.toasts)
            await pilot.press(key)
            assert app.screen is app.main_screen(), key
            # Said, not silently ignored.
            assert len(app.toasts) == toasts + 1 and "replay is read-only" in app.toasts[-1][1]
        await pilot.press("end")
        bar = app.screen.query_one(ReplayBar)
        # The bar is redrawn on the app's refresh tick, not on the key.
        await wait_until(pilot, lambda: app.state.step == 299 and "step 299" in str(bar.render()))
        footer = app.screen.query_one(Footer)
        assert bar.region.height == 1 and bar.region.bottom <= footer.region.y  # seen
        shown = str(bar.render())
        assert f"line {len(timeline):,}/{len(timeline):,}" in shown and "step 299" in shown
        header = str(app.screen.query_one(RunHeader).render())
        assert "READ-ONLY" in header and "RUNNING" in header
        # The last update is the run's own time at the cursor, not "0 s ago".
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timeline.time(timeline.end)))
        assert f"run time {at}" in header and "ago" not in header
    assert not [w for w in app.workers if w.group == "control"]


async def test_a_rotated_stream_is_read_through_the_box_tail(tmp_path: Path) -> None:
    """A new run id in the same run dir rotates the old stream to status.<run>.jsonl; the
    box's `tail --stream` reads it (what `replay` does over SSH for such a path)."""
    import sys

    run_dir = tmp_path / "run"
    write_stream(run_dir, 30)
    rotated = run_dir / "status.a1b2c3d4e5f6.jsonl"
    (run_dir / "status.jsonl").rename(rotated)
    write_stream(run_dir, 5)  # the newer run's stream
    transport = RecordingTransport()

    def session(name: str) -> ReplaySession:
        return ReplaySession(
            transport,
            run_dir=str(run_dir),
            stream_name=name,
            python=sys.executable,
            on_line=lambda line: None,
        )

    assert await session(rotated.name).load() == rotated.read_bytes().splitlines()
    assert transport.commands[-1][-2:] == ["--stream", rotated.name]
    with pytest.raises(ReplayError, match="not a rotated stream"):
        await session("../../etc/passwd.jsonl").load()
    with pytest.raises(ReplayError, match="does not exist"):
        await session("status.0ther.jsonl").load()

    args = replay_parser().parse_args([str(rotated), "root@gpu-box", "--container", "200"])
    app = build_replay(args)
    assert isinstance(app.session, ReplaySession)
    assert app.session.stream_name == rotated.name and app.session.run_dir == str(run_dir)
    with pytest.raises(UsageError, match=r"neither status\.jsonl nor a rotated"):
        build_replay(replay_parser().parse_args(["/r/notes.jsonl", "root@gpu-box"]))
