"""prepare on several devices (two CPU workers stand in for two GPUs): the same samples as one
worker; killed mid-way (the whole prepare, or one worker) and run again, exactly the full
set, no prompt twice and none lost. Real processes, real signals, the real SmolLM2 target.
The reruns take one device (a box that lost a GPU): the device count is not part of what
decides the samples, and one in-process worker loads SmolLM2 once where two load it twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest

from dflash_train import protocol
from dflash_train.data.prepare import PrepareConfig, prepare_dataset
from dflash_train.data.prepare_pool import WORKERS_FILE
from dflash_train.data.prepare_work import PARTS, work_dir_of
from dflash_train.targets.frozen_target import Target

# Four chunks of one prompt: enough for both workers to take several, and for a kill to
# land between the first part and the last.
SAMPLES = 4
ARGS = ["--target-model", "smollm2", "--prompts", "builtin", "--samples", str(SAMPLES)]
ARGS += ["--max-new-tokens", "6", "--batch-size", "1", "--chunk-size", "1", "--heldout", "0"]
WAIT_S = 240.0


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _start(out: Path, devices: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "dflash_train", "prepare", *ARGS, "--out", str(out)]
    argv += ["--devices", devices]
    return subprocess.Popen(
        argv,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[str]) -> protocol.Reply:
    stdout, stderr = proc.communicate(timeout=WAIT_S)
    reply = protocol.decode_reply(stdout)
    assert isinstance(reply, protocol.Reply) and reply.ok, (stdout, stderr[-3000:])
    return reply


def _rows(out: Path) -> list[tuple[int, list[int], list[int]]]:
    table = datasets.load_from_disk(str(out))
    return list(zip(table["prompt_index"], table["input_ids"], table["loss_mask"], strict=True))


def _wait_for(condition, what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert proc.poll() is None, f"prepare exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        time.sleep(0.05)


def _kill_while_holding(record: Path, pid: int, chunk: int) -> bool:
    """SIGKILL worker `pid` if it still holds `chunk` once frozen (SIGSTOP) and once the
    workers record has settled (the parent rewrites it when a result comes in, so a read
    just before may be stale); otherwise let it go on. True when it was killed."""
    os.kill(pid, signal.SIGSTOP)
    seen, stable = None, 0
    deadline = time.monotonic() + WAIT_S
    while stable < 3:  # unchanged over ~0.6 s: no result of the frozen worker still due
        assert time.monotonic() < deadline, "the workers record never settled"
        time.sleep(0.2)
        now = record.read_text() if record.is_file() else ""
        stable = stable + 1 if now == seen else 0
        seen = now
    workers = json.loads(seen) if seen else []
    if any(w["pid"] == pid and w["chunk"] == chunk for w in workers):
        os.kill(pid, signal.SIGKILL)
        return True
    os.kill(pid, signal.SIGCONT)
    return False


@pytest.fixture(scope="module")
def one_worker(
    tmp_path_factory: pytest.TempPathFactory, smollm2: Target
) -> list[tuple[int, list[int], list[int]]]:
    """The samples one worker writes (in-process, the session's loaded target)."""
    out = tmp_path_factory.mktemp("one") / "data"
    config = PrepareConfig(
        target="smollm2", prompts="builtin", out=out, samples=SAMPLES, max_new_tokens=6,
        batch_size=1, chunk_size=1, devices="cpu", heldout=0,
    )  # fmt: skip
    prepare_dataset(config, target=smollm2)
    return _rows(out)


def test_two_workers_write_the_samples_one_does_a_killed_worker_s_chunk_again(
    tmp_path: Path, one_worker: list[tuple[int, list[int], list[int]]]
) -> None:
    """One run for both claims (each CLI run loads SmolLM2 twice: CI time)."""
    out = tmp_path / "data"
    record = work_dir_of(out) / WORKERS_FILE

    def busy_worker() -> dict[str, int] | None:
        try:
            workers = json.loads(record.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return next((w for w in workers if w["worker"] == 1 and w["chunk"] is not None), None)

    proc = _start(out, "cpu,cpu")
    while True:
        _wait_for(lambda: busy_worker() is not None, "a chunk handed to worker 1", proc)
        victim = busy_worker()
        assert victim is not None
        if _kill_while_holding(record, victim["pid"], victim["chunk"]):
            break
    reply = _finish(proc)
    assert victim["chunk"] in reply.data["retried_chunks"]
    assert _rows(out) == one_worker
    workers = reply.data["workers"]
    # Which worker answers how many chunks depends on which loads first.
    assert {w["worker"] for w in workers} <= {0, 1} and {w["device"] for w in workers} == {"cpu"}
    assert sum(w["chunks"] for w in workers) == SAMPLES
    assert sum(w["samples"] for w in workers) == SAMPLES
    info = json.loads((out / "prepare.json").read_text())
    assert info["workers"] == workers and info["chunks"] == SAMPLES
    assert not work_dir_of(out).exists(), "the work dir goes once the dataset is written"


def test_sigkill_mid_way_then_resume_gives_exactly_the_full_set(
    tmp_path: Path, one_worker: list[tuple[int, list[int], list[int]]]
) -> None:
    out = tmp_path / "data"
    parts = work_dir_of(out) / PARTS
    proc = _start(out, "cpu,cpu")
    _wait_for(lambda: parts.is_dir() and any(parts.glob("chunk_*[0-9]")), "first part", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    written = sorted(p.name for p in parts.glob("chunk_*[0-9]"))
    assert 1 <= len(written) < SAMPLES, written
    assert not out.exists(), "no dataset until every chunk is answered"

    reply = _finish(_start(out, "cpu"))
    assert _rows(out) == one_worker, "no prompt twice, none lost, the same answers"
    assert reply.data["resumed_chunks"] == len(written)
    answered = sum(w["chunks"] for w in reply.data["workers"])
    assert answered == SAMPLES, "prepare.json counts the earlier call's chunks too"


def test_two_workers_out_of_time_write_what_they_answered(tmp_path: Path) -> None:
    """--max-seconds with two workers, as with one: the chunks started in time are written and
    the rest is unanswered, not "failed twice" (seen on an H200: the whole prepare failed)."""
    out = tmp_path / "data"
    argv = [sys.executable, "-m", "dflash_train", "prepare", *ARGS, "--out", str(out)]
    argv += ["--devices", "cpu,cpu", "--max-seconds", "0.001"]
    done = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=WAIT_S)
    reply = protocol.decode_reply(done.stdout)
    assert isinstance(reply, protocol.Reply) and reply.ok, (done.stdout, done.stderr[-3000:])
    # Out of time at once: each worker still answers the chunk it was handed when ready (a
    # dataset is never empty), no further one.
    written = reply.data["stats"]["samples"]
    assert 1 <= written <= 2 and reply.data["unanswered"] == SAMPLES - written
    assert reply.data["retried_chunks"] == []
    assert len(_rows(out)) == written


def test_sigterm_of_a_plain_prepare_replies_stopped_and_a_rerun_finishes(
    tmp_path: Path, one_worker: list[tuple[int, list[int], list[int]]]
) -> None:
    """A plain CLI prepare (no --run-dir) answers SIGTERM as a launched one does: its workers
    end, the finished chunks stay, and the one-line reply says how to go on (it died
    without a reply before)."""
    out = tmp_path / "data"
    parts = work_dir_of(out) / PARTS
    proc = _start(out, "cpu,cpu")
    _wait_for(lambda: parts.is_dir() and any(parts.glob("chunk_*[0-9]")), "first part", proc)
    proc.send_signal(signal.SIGTERM)  # the prepare alone, not its process group
    stdout, stderr = proc.communicate(timeout=WAIT_S)
    reply = protocol.decode_reply(stdout)
    assert isinstance(reply, protocol.Reply), (stdout, stderr[-3000:])
    assert (reply.ok, reply.error_code, proc.returncode) == (False, "stopped", 128 + 15)
    assert "SIGTERM" in (reply.error or "") and "run it again" in (reply.error or "")
    assert not (work_dir_of(out) / WORKERS_FILE).exists(), "its workers were ended"
    written = sorted(p.name for p in parts.glob("chunk_*[0-9]"))
    assert 1 <= len(written) < SAMPLES, written

    again = _finish(_start(out, "cpu"))
    assert _rows(out) == one_worker and again.data["resumed_chunks"] == len(written)


def test_a_chunk_whose_worker_dies_twice_is_reported_and_a_rerun_finishes(
    tmp_path: Path, one_worker: list[tuple[int, list[int], list[int]]]
) -> None:
    """A worker killed on a chunk: the chunk is retried once on a new worker; killed again,
    the prepare fails naming the chunk, keeps every finished chunk, and a rerun completes."""
    out = tmp_path / "data"
    record = work_dir_of(out) / WORKERS_FILE
    killed: list[int] = []

    def holder(chunk: int | None) -> dict[str, int] | None:
        try:
            workers = json.loads(record.read_text())
        except (FileNotFoundError, ValueError):
            return None
        busy = [w for w in workers if w["chunk"] is not None and w["pid"] not in killed]
        return next((w for w in busy if chunk is None or w["chunk"] == chunk), None)

    proc = _start(out, "cpu,cpu")
    chunk: int | None = None  # the first kill's, whichever chunk that worker holds
    while len(killed) < 2:

        def handed(wanted: int | None = chunk) -> bool:
            return holder(wanted) is not None

        _wait_for(handed, f"chunk {chunk} handed out", proc)
        victim = holder(chunk)
        assert victim is not None
        if _kill_while_holding(record, victim["pid"], victim["chunk"]):
            killed.append(victim["pid"])
            chunk = victim["chunk"]
    stdout, stderr = proc.communicate(timeout=WAIT_S)
    reply = protocol.decode_reply(stdout)
    assert isinstance(reply, protocol.Reply) and not reply.ok, (stdout, stderr[-3000:])
    assert f"chunk {chunk} failed twice" in (reply.error or ""), reply.error
    assert "run again to retry" in (reply.error or "")
    assert not out.exists(), "no dataset with a chunk missing"

    again = _finish(_start(out, "cpu"))
    assert _rows(out) == one_worker, "the rerun answers the failed chunk, no prompt twice"
    assert again.data["resumed_chunks"] >= 1
