"""The local transport and the line splitter, with real subprocesses; and the rule that
sources/ never pulls in Textual or torch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_train import protocol
from dflash_tui.sources.backoff import Backoff
from dflash_tui.sources.line_stream import LineStream
from dflash_tui.sources.transport import CommandTimeout, LocalTransport


def test_sources_import_neither_textual_nor_torch() -> None:
    code = (
        "import sys\n"
        "import dflash_tui.sources.transport, dflash_tui.sources.session\n"
        "import dflash_tui.sources.state, dflash_tui.sources.profiles\n"
        "import dflash_tui.sources.known_hosts, dflash_tui.sources.backoff\n"
        "bad = [m for m in ('textual', 'torch') if m in sys.modules]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def chunks_reader(chunks: list[bytes]):
    data = list(chunks)

    async def read(size: int) -> bytes:
        return data.pop(0) if data else b""

    return read


async def collect(stream: LineStream) -> list[bytes]:
    return [line async for line in stream]


async def test_line_stream_yields_complete_lines_only() -> None:
    stream = LineStream(chunks_reader([b"a\nb", b"c\n\nd", b"e\nhalf"]))
    assert await collect(stream) == [b"a", b"bc", b"", b"de"]
    assert stream.partial_at_eof == b"half"


async def test_line_stream_cuts_an_overlong_line_for_the_decoder() -> None:
    stream = LineStream(chunks_reader([b"x" * 30, b"y" * 30, b"z\nok\n"]), max_line=16)
    lines = await collect(stream)
    assert lines == [b"x" * 17, b"ok"]
    rejected = protocol.decode_line(b"x" * (protocol.MAX_LINE_BYTES + 1))
    assert isinstance(rejected, protocol.Rejected) and rejected.code == "too_long"


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    backoff = Backoff(initial=1, factor=2, cap=8, jitter=0.5)
    ceilings = [1, 2, 4, 8, 8, 8]
    for attempt, ceiling in enumerate(ceilings, start=1):
        for _ in range(20):
            assert ceiling / 2 <= backoff.delay(attempt) <= ceiling
    assert backoff.delay(10_000) <= 8
    with pytest.raises(ValueError, match="attempt"):
        backoff.delay(0)


async def test_local_run_passes_argv_without_a_shell(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    evil = [f"; touch {canary}", f"$(touch {canary})", f"`touch {canary}`", "'\"", "a b"]
    result = await LocalTransport().run(["printf", "%s\\n", *evil], timeout=10)
    assert result.rc == 0
    assert result.stdout.decode().splitlines() == evil
    assert not canary.exists()


async def test_local_exec_prefix_and_missing_program() -> None:
    transport = LocalTransport(exec_prefix=["env", "DFLASH_X=1"])
    assert transport.description == "local (env DFLASH_X=1)"
    result = await transport.run(
        ["sh", "-c", 'echo "$DFLASH_X"; echo oops >&2; exit 4'], timeout=10
    )
    assert (result.rc, result.stdout, result.stderr) == (4, b"1\n", b"oops\n")
    missing = await LocalTransport().run(["/nonexistent/dflash-train"], timeout=5)
    assert missing.rc == 127 and b"nonexistent" in missing.stderr


async def test_local_timeout_kills_the_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"no answer within 0\.5 s"):
        await LocalTransport().run(
            ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"], timeout=0.5
        )
    assert time.monotonic() - started < 5
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_local_stream_ends_its_command_on_exit(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; i=0; while :; do echo line$i; i=$((i+1)); sleep 0.05; done"
    async with LocalTransport().stream(["sh", "-c", script]) as lines:
        got = []
        async for line in lines:
            got.append(line)
            if len(got) == 3:
                break
    assert got == [b"line0", b"line1", b"line2"]
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_local_stream_reports_how_it_ended() -> None:
    script = "printf 'a\\nb\\npartial'; echo failing >&2; exit 3"
    async with LocalTransport().stream(["sh", "-c", script]) as lines:
        assert [line async for line in lines] == [b"a", b"b"]
    assert lines.end is not None
    assert lines.end.returncode == 3 and lines.end.stderr_tail == b"failing\n"
    assert lines.partial_at_eof == b"partial"
    # A missing command ends as it does through a shell (and `run`): exit 127, no lines.
    async with LocalTransport().stream(["/nonexistent/x"]) as missing:
        assert [line async for line in missing] == []
    assert missing.end is not None and missing.end.returncode == 127
    assert b"nonexistent" in missing.end.stderr_tail


async def test_local_stream_cancelled_consumer_leaves_no_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def consume() -> None:
        async with LocalTransport().stream(
            ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"]
        ) as s:
            async for _ in s:
                pass

    task = asyncio.create_task(consume())
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
