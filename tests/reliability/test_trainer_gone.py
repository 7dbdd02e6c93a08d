"""Fault: the trainer dies without a run_end (SIGKILL, as the OOM killer or a careless
`pkill -9 -f` would). The box's `tail --follow` sees the run lock go free and says so on
the channel the console already reads; the console over OpenSSH (through the pct shim)
reads CRASHED, rings the bell and shows the train.log tail, having sent nothing but one
`status`: the marker, not a poll, is what makes it prompt (2.8 s after `kill -KILL` in
tmux, docs/reliability.md; a wall-clock bound here would measure the machine). A run that
ends with its run_end gets no such marker. And a trainer whose run dir is deleted under it
stops itself, writing nothing there."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from dflash_train import protocol
from dflash_train.control.trainer_watch import TrainerWatch
from dflash_train.rundir import RunLock
from dflash_train.stream.writer import StatusWriter
from dflash_train.training.process import EXIT_ORPHANED
from dflash_tui.app import ConsoleOptions, DflashApp
from dflash_tui.sources.transport import CommandResult, SshTransport
from tests.reliability import box
from tests.reliability.console_side import BOX_PYTHON, PCT_PREFIX, trusted
from tests.sshd import LOOPBACK, ClientKey, OpenSshServer
from tests.tui.console_harness import wait_until
from tests.tui.fleet_box import start_live_run

RUN_ID = "gone0001"


def delete_while_written(path: Path, within: float = 60.0) -> None:
    """`rm -rf` of a dir a process is writing into, as an operator would run it again: a
    file the trainer adds (its checkpoint in flight) while rmtree empties a directory makes
    that directory "not empty" once, and one it renames (a finished checkpoint's folder)
    is "not found" though the tree is still there (seen in the suite: run.lock and the
    checkpoint folder were left, and read as recreated); delete again until the tree is
    gone."""
    deadline = time.monotonic() + within
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            if not path.exists():
                return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} still there after {within:.0f} s of rm -rf")


class CountingSsh(SshTransport):
    """The console's real transport, counting every command it sends."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.sent: list[str] = []

    def _record(self, argv: Sequence[str]) -> None:
        words = list(argv)
        self.sent.append(words[words.index("dflash_train") + 1])

    async def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self._record(argv)
        return await super().run(argv, timeout=timeout)

    def stream(self, argv: Sequence[str]):  # type: ignore[no-untyped-def]
        self._record(argv)
        return super().stream(argv)


def ended(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


async def test_sigkilled_trainer_reads_crashed_from_the_tail_over_openssh(
    openssh_server: OpenSshServer, client_key: ClientKey, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    trainer = start_live_run(run_dir, RUN_ID, interval=0.3)
    (run_dir / "train.log").write_text("step 12 ok\nloading batch 13\n")
    assert openssh_server.host_key is not None
    known = trusted(tmp_path / "known_hosts", openssh_server.port, openssh_server.host_key)
    transport = CountingSsh(
        LOOPBACK,
        port=openssh_server.port,
        username="root",
        exec_prefix=PCT_PREFIX,
        known_hosts=known,
        config_path=None,
        client_keys=[client_key.private_path],
        keepalive_interval=2,
        connect_timeout=5,
    )
    options = ConsoleOptions(
        target_name="box", run_dir=str(run_dir), python=BOX_PYTHON, follow_gpus=False
    )
    app = DflashApp(transport, options)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: (app.state.step or 0) >= 5, timeout=60)
            assert app.badge() == "running" and app.bells == 0
            sent_before = list(transport.sent)
            os.kill(trainer.pid, signal.SIGKILL)
            trainer.wait(10)
            await wait_until(
                pilot,
                lambda: app.badge() == "crashed" and app.bells == 1 and bool(app.log_tail),
                timeout=30,
            )
            assert app.state.run_state == "crashed"
            assert "loading batch 13" in app.log_tail
            # The marker came on the open tail: nothing sent since but one `status`.
            assert transport.sent[len(sent_before) :] == ["status"], transport.sent
            assert "train.log" in app.export_screenshot()
    finally:
        ended(trainer)


def test_tail_sends_the_marker_once_for_a_dead_holder_and_none_after_run_end(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    with followed_live_run(run_dir) as (trainer, read):
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(10)
        while True:
            line = protocol.decode_line(read())
            assert isinstance(line, protocol.StatusLine), line
            if protocol.is_marker(line):
                break
        assert line["code"] == protocol.TRAINER_GONE and line.run == RUN_ID
        assert line["pid"] == trainer.pid and line["level"] == "error"
        last = protocol.decode_line((run_dir / "status.jsonl").read_bytes().splitlines()[-1])
        assert isinstance(last, protocol.StatusLine) and line.seq == last.seq

    # Without a run_end the marker comes once the lock the watch saw held is free past the
    # grace period, and once only; a trainer that wrote its run_end first is not gone.
    assert watch_answers(tmp_path / "no-end", ends=False) == [False, False, False, True, False]
    assert watch_answers(tmp_path / "ended", ends=True) == [False] * 5
    # Events the control plane appends after the run_end, under the run lock (an
    # evaluation by hand, a failed restart): that holder leaving is no trainer gone.
    assert watch_answers(tmp_path / "appended", ends=True, appended=True) == [False] * 6


def test_tail_says_so_when_the_run_dir_is_deleted_under_its_trainer(tmp_path: Path) -> None:
    """The lock file goes with the run dir, so the lock reads free; the stream is gone too,
    so there is no newest line to stamp the marker with: it carries the newest the tail
    sent, the pid the lock named while held, and says the run dir was deleted (before this,
    the console read RUNNING for a minute, then STALLED, of a run that was gone)."""
    run_dir = tmp_path / "run"
    with followed_live_run(run_dir) as (trainer, read):
        delete_while_written(run_dir)
        deleted_at = time.monotonic()
        sent = None
        while True:
            line = protocol.decode_line(read())
            assert isinstance(line, protocol.StatusLine), line
            if protocol.is_marker(line):
                break
            # The writer goes on into its unlinked file, and the tail reads on from it.
            assert time.monotonic() - deleted_at < 30, "no marker 30 s after the deletion"
            sent = line
        assert line["code"] == protocol.TRAINER_GONE and line["level"] == "error"
        assert sent is not None and (line.run, line.seq) == (RUN_ID, sent.seq)
        assert line["pid"] == trainer.pid
        assert line["message"] == (
            f"the run directory was deleted: the trainer (pid {trainer.pid}) stops itself "
            "without a run_end"
        )


@contextlib.contextmanager
def followed_live_run(run_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], LineReader]]:
    """A live run and `tail --follow` of it, past the run_start the tail sent. The tail
    probes the run lock before it sends lines, so its watch has seen this holder alive (a
    holder it never saw is not judged: acting before that once hung readline for 600 s)."""
    trainer = start_live_run(run_dir, RUN_ID, interval=0.05)
    tail = subprocess.Popen(
        [sys.executable, "-m", "dflash_train", "tail", str(run_dir), "--follow", "--poll", "0.1"],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert tail.stdout is not None
        read = LineReader(tail.stdout.fileno())
        first = protocol.decode_line(read())
        assert isinstance(first, protocol.StatusLine) and first.kind == "run_start", first
        yield trainer, read
    finally:
        ended(trainer)
        tail.kill()
        tail.wait(10)


class LineReader:
    """Lines from a pipe, each within `timeout` seconds, else the test fails (a marker that
    never comes must not hang the suite on readline)."""

    def __init__(self, fd: int, timeout: float = 60.0) -> None:
        self.fd, self.timeout, self.pending = fd, timeout, b""

    def __call__(self) -> bytes:
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            assert ready, f"no line from the tail within {self.timeout:.0f} s"
            chunk = os.read(self.fd, 65536)
            assert chunk, "the tail closed its output"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line


def test_the_watch_names_a_deleted_run_dir_once_and_a_missing_stream_never(
    tmp_path: Path,
) -> None:
    now = [0.0]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stream, lock = run_dir / "status.jsonl", run_dir / "run.lock"
    watch = TrainerWatch(lock, stream, clock=lambda: now[0])
    writer = StatusWriter(stream, RUN_ID)
    writer.write("heartbeat")
    answers = []
    with RunLock(lock):
        for at in (1.0, 2.0):
            now[0] = at
            answers.append(watch.check((RUN_ID, 0)))
        shutil.rmtree(run_dir)
        for at in (3.0, 5.5, 7.0):
            now[0] = at
            answers.append(watch.check((RUN_ID, 0)))
    writer.close()
    assert answers[:3] == [None, None, None] and answers[4] is None
    marker = protocol.decode_line(answers[3] or b"")
    assert isinstance(marker, protocol.StatusLine) and marker["pid"] == os.getpid()
    assert marker["message"].startswith("the run directory was deleted")
    # A stream not written yet in a run dir that is there: nothing to judge.
    other = tmp_path / "other"
    other.mkdir()
    quiet = TrainerWatch(other / "run.lock", other / "status.jsonl", clock=lambda: now[0])
    with RunLock(other / "run.lock"):
        now[0] = 10.0
        assert quiet.check((RUN_ID, 0)) is None
    for at in (13.0, 16.0):  # free, then free past the grace period
        now[0] = at
        assert quiet.check((RUN_ID, 0)) is None


@pytest.mark.parametrize(
    ("locked", "expected"), [(True, [False, False, True, False]), (False, [False] * 4)]
)
def test_a_holder_seen_only_when_its_line_came_is_still_judged(
    tmp_path: Path, locked: bool, expected: list[bool]
) -> None:
    """The lock was free at every periodic probe (taken after one, freed before the next),
    but its holder's line came through the follow loop, which probes then: gone once the
    lock is free past the grace period, once. A line from a writer without the lock (a
    test's synthetic stream) arms nothing."""
    now = [0.0]
    stream, lock = tmp_path / "status.jsonl", tmp_path / "run.lock"
    watch = TrainerWatch(lock, stream, clock=lambda: now[0])
    writer = StatusWriter(stream, RUN_ID)
    answers = []
    for at in (1.0, 2.0, 4.5, 6.0):
        now[0] = at
        answers.append(watch.check() is not None)
        if at == 1.0:
            with RunLock(lock) if locked else contextlib.nullcontext():
                writer.write("heartbeat")  # the line the follow loop reads
                watch.saw_lines()
    writer.close()
    assert answers == expected


def watch_answers(where: Path, *, ends: bool, appended: bool = False) -> list[bool]:
    """Whether the watch answered a marker: before any holder, while held, within the grace
    period after, past it, and once more."""
    now = [0.0]
    stream, lock = where / "status.jsonl", where / "run.lock"
    watch = TrainerWatch(lock, stream, clock=lambda: now[0])
    answers = []

    def check(at: float) -> None:
        now[0] = at
        answers.append(watch.check() is not None)

    writer = StatusWriter(stream, RUN_ID)
    writer.write("heartbeat")
    check(1.0)
    with RunLock(lock):
        check(2.0)
        if ends:
            writer.write("run_end", reason="signal", exit_code=0)
    writer.close()
    check(3.0)
    if appended:
        with RunLock(lock):
            check(4.0)
            after = StatusWriter(stream, RUN_ID)
            after.write("event", level="error", code="restart_failed", message="restart failed")
            after.close()
    check(6.0)
    check(9.0)
    return answers


# The monitor's periodic look finds the deletion; with a save every step, the save after
# the deletion comes first (as an epoch's end did in a clean-clone CI and recreated the run
# dir with a checkpoint in it).
@pytest.mark.parametrize("save_every", ["0", "1"], ids=["periodic-look", "save-every-step"])
def test_trainer_whose_run_dir_is_deleted_stops_itself_writing_nothing(
    tmp_path: Path, prepared_data_dir: Path, smollm2_spec: str, save_every: str
) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"  # outside the run dir, so it outlives it
    args = box.tiny_train_args(
        smollm2_spec, prepared_data_dir, "--max-steps", "100000", "--save-every", save_every
    )
    with log.open("wb") as err:
        trainer = subprocess.Popen(
            [*box.TRAINER, "train", *args, "--output-dir", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env={**os.environ, **box.trainer_env()},
        )
    try:
        box.wait_line(run_dir, lambda ln: ln.kind == "step", what="a step")
        delete_while_written(run_dir)
        deleted_at = time.monotonic()
        code = trainer.wait(60)
        took = time.monotonic() - deleted_at
    finally:
        ended(trainer)
    assert code == EXIT_ORPHANED, log.read_text()[-2000:]
    assert took < 60
    assert "was deleted or replaced" in log.read_text()
    assert not run_dir.exists()  # no checkpoint, no run_end: nothing recreated it


def test_the_marker_names_the_pid_seen_holding_not_a_later_brief_holder(tmp_path: Path) -> None:
    """A control-plane command can take the lock for a moment after the trainer died (and
    write nothing): the lock file then names that command's pid, not the trainer's."""
    now = [0.0]
    stream, lock = tmp_path / "status.jsonl", tmp_path / "run.lock"
    watch = TrainerWatch(lock, stream, clock=lambda: now[0])
    writer = StatusWriter(stream, RUN_ID)
    writer.write("heartbeat")
    with RunLock(lock):
        now[0] = 1.0
        assert watch.check() is None
    take_and_leave = (
        "import os, sys\nfrom pathlib import Path\nfrom dflash_train.rundir import RunLock\n"
        "with RunLock(Path(sys.argv[1])):\n    print(os.getpid())"
    )
    brief = subprocess.run(
        [sys.executable, "-c", take_and_leave, str(lock)],
        capture_output=True,
        text=True,
        check=True,
    )
    other = int(brief.stdout)
    assert lock.read_text().strip() == str(other)
    answers = []
    for at in (2.0, 4.5):
        now[0] = at
        answers.append(watch.check())
    writer.close()
    assert answers[0] is None
    marker = protocol.decode_line(answers[1] or b"")
    assert isinstance(marker, protocol.StatusLine)
    assert marker["pid"] == os.getpid() != other
