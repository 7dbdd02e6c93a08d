"""`dflash-train logs` and the env file, on a real trainer (random tiny target, the session's
prepared data): the follower shows what the trainer writes across a SIGKILL of its group
and a restart; the env file (mode 0600 only) reaches both trainers and no value of it is
written anywhere. Then the follower itself: rotation, truncation, bounded lines."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

from control_harness import SMALL_TRAIN, cli, dflash_argv, end_trainer, trainer_env_args

from dflash_train.control.logs import LogFollower, last_lines, visible
from dflash_train.rundir import lock_is_held, read_json

SECRET = "s3cret-from-the-env-file-0123456789"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


class Printed:
    """What a follower printed, read as it comes (raw reads: select() cannot see lines a
    buffered reader already holds); `wait_for` moves past each needle it finds."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.data = b""
        self.pos = 0

    def wait_for(self, needle: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (found := self.data.find(needle, self.pos)) < 0:
            assert time.monotonic() < deadline, f"{needle!r} not in {self.data[-500:]!r}"
            ready, _, _ = select.select([self.fd], [], [], 1)
            if ready:
                self.data += os.read(self.fd, 1 << 16)
        self.pos = found + len(needle)


def test_logs_follow_a_real_trainer_and_the_env_file_survives_a_restart(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    env_file = tmp_path / "env"
    env_file.write_text(f"# W&B and friends\nexport MY_TOKEN='{SECRET}'\nFROM_FILE=yes\n")
    env_file.chmod(0o644)
    start = [str(run_dir), "--wait", "240", *trainer_env_args(), "--env-file", str(env_file)]
    train = ["--target-model", "random:tiny", "--data-dir", str(prepared_data_dir), *SMALL_TRAIN]
    rc, reply = cli("launch", *start, "--", *train)
    assert rc == 1 and reply.error_code == "bad_env_file" and "mode 0644" in (reply.error or "")
    assert not run_dir.joinpath("run.json").exists()  # refused before anything started
    env_file.chmod(0o600)
    follow = None
    try:
        rc, reply = cli("launch", *start, "--", *train, timeout=300)
        assert rc == 0 and reply.ok, reply
        assert reply.data["message"].startswith("launched: training in ")
        first = reply.data["pid"]
        assert {"MY_TOKEN": SECRET, "FROM_FILE": "yes"}.items() <= _environ(first).items()
        follow = subprocess.Popen(
            dflash_argv("logs", str(run_dir), "--lines", "3", "--follow", "--poll", "0.1"),
            stdout=subprocess.PIPE,
        )
        printed = Printed(follow)
        # The trainer's own lines, as they come: its step lines (the start-up lines may
        # be more than 3 lines back by now on a loaded machine).
        printed.wait_for(b"  loss ", 60)

        os.killpg(reply.data["pgid"], signal.SIGKILL)  # a crash: no run_end, no goodbye
        deadline = time.monotonic() + 15
        while lock_is_held(run_dir / "run.lock") and time.monotonic() < deadline:
            time.sleep(0.1)
        rc, again = cli("restart", str(run_dir), "--wait", "240", timeout=300)
        assert rc == 0 and again.ok, again
        assert again.data["message"].startswith("restarted: ")
        # The same follower, never restarted, sees the new start in the same train.log.
        printed.wait_for(f"dflash-train launch {again.data['run_id']}".encode(), 60)
        printed.wait_for(b"Batches per epoch", 60)
        # Kept across the restart: the file is named again and read afresh on the box.
        assert {"MY_TOKEN": SECRET, "FROM_FILE": "yes"}.items() <= _environ(
            again.data["pid"]
        ).items()
        assert again.data["env_dropped"] == []
        record = read_json(run_dir / "run.json")
        assert isinstance(record, dict) and record["env_file"] == str(env_file)
        written = [p.read_bytes() for p in run_dir.rglob("*") if p.is_file()]
        assert not any(SECRET.encode() in blob for blob in written)
        assert SECRET not in reply.to_json() + again.to_json()

        # The trainer goes on writing while `logs` reads: what it printed is the last 4 lines
        # of the file as it stood at some moment between the two reads around it.
        before = len((run_dir / "train.log").read_bytes().splitlines())
        done = subprocess.run(dflash_argv("logs", str(run_dir), "--lines", "4"),
                              capture_output=True, timeout=60, check=True)  # fmt: skip
        lines = (run_dir / "train.log").read_bytes().splitlines()
        tails = [lines[end - 4 : end] for end in range(before, len(lines) + 1)]
        assert done.stdout.splitlines() in tails
    finally:
        if follow is not None:
            follow.kill()
            follow.wait()
        end_trainer(run_dir)


def test_follower_survives_rotation_and_truncation_and_bounds_lines(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"one\ntwo\nthree\npartial")
    lines, offset = last_lines(log, 2)
    assert lines == [b"two", b"three"] and offset == len(b"one\ntwo\nthree\n")
    follower = LogFollower(log, offset=offset)
    assert follower.poll() == []  # half a line is never sent
    with log.open("ab") as fh:
        fh.write(b" line\nprogress 10%\rprogress 90%\r\n")
    assert follower.poll() == [b"partial line", b"progress 90%"]
    log.rename(tmp_path / "train.log.1")  # rotated: the old file's last words, then the new
    with (tmp_path / "train.log.1").open("ab") as fh:
        fh.write(b"last old\n")
    log.write_bytes(b"first new\n")
    assert follower.poll() == [b"last old", b"first new"]
    log.write_bytes(b"")  # truncated
    assert follower.poll() == []
    log.write_bytes(b"after\n")
    assert follower.poll() == [b"after"]
    with log.open("ab") as fh:
        fh.write(b"x" * 50_000)
        fh.flush()
        assert follower.poll() == []
        fh.write(b"y\n")
    (cut,) = follower.poll()
    assert cut.startswith(b"x" * 4096 + " … [".encode()) and cut.endswith(b" more bytes cut]")
    assert visible(b"z" * 5000).endswith(b"[904 more bytes cut]")
