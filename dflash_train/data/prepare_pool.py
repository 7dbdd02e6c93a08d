"""The workers of a multi-device prepare: one process per `--devices` entry, each with its own
target replica, handed chunk numbers one at a time (so a fast GPU answers more of them) and
reporting progress through its stdout pipe. A worker that dies while it holds a chunk is
started again on its device and the chunk is retried once; a chunk that fails twice is
reported, and its part stays unwritten for a later run to retry."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from dflash_train.config.prepare_config import PrepareConfig, PrepareError
from dflash_train.data.prepare_progress import PrepareProgress, WorkerSink
from dflash_train.rundir import atomic_write_json

if TYPE_CHECKING:
    from dflash_train.data.prepare_work import WorkDir

WORKERS_FILE = "workers.json"
# Starts of a device's worker after its first: more means the device itself is at fault.
RESTARTS_PER_DEVICE = 2
END_GRACE_S = 10.0


@dataclass
class Worker:
    number: int
    device: str
    proc: subprocess.Popen[str]
    sink: WorkerSink
    buffer: str = ""
    chunk: int | None = None
    ready: bool = False


@dataclass
class PoolOutcome:
    failed: dict[int, str] = field(default_factory=dict)
    retried: list[int] = field(default_factory=list)
    load_seconds: list[float] = field(default_factory=list)
    first_ready: float | None = None  # time.monotonic() when the first worker was ready


def _spawn(
    work: WorkDir,
    number: int,
    device: str,
    devices: Sequence[str],
    config: PrepareConfig,
    deadline: float | None,
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "dflash_train.data.prepare_worker", str(work.root), device]
    argv += [
        str(number),
        str(devices.count(device)),
        "none" if deadline is None else repr(deadline),
    ]
    argv.append(json.dumps(config.to_record()))
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )


def _record_workers(work: WorkDir, workers: dict[int, Worker]) -> None:
    """The live workers' pids, for an operator (and the tests) to find them."""
    record = [
        {"worker": w.number, "device": w.device, "pid": w.proc.pid, "chunk": w.chunk}
        for w in workers.values()
    ]
    atomic_write_json(work.root / WORKERS_FILE, record)


def run_pool(
    work: WorkDir,
    devices: Sequence[str],
    config: PrepareConfig,
    pending: Sequence[int],
    progress: PrepareProgress,
    deadline: float | None,
) -> PoolOutcome:
    outcome = PoolOutcome()
    queue = collections.deque(pending)
    failures: collections.Counter[int] = collections.Counter()
    restarts: collections.Counter[str] = collections.Counter()
    selector = selectors.DefaultSelector()
    workers: dict[int, Worker] = {}

    def start(number: int, device: str) -> None:
        proc = _spawn(work, number, device, devices, config, deadline)
        worker = Worker(number, device, proc, progress.worker(number, device))
        workers[number] = worker
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        selector.register(proc.stdout, selectors.EVENT_READ, worker)
        _record_workers(work, workers)

    def hand_out(worker: Worker) -> None:
        stdin = worker.proc.stdin
        assert stdin is not None
        if queue and not past(deadline, progress):
            worker.chunk = queue.popleft()
            with contextlib.suppress(BrokenPipeError):
                stdin.write(f"{worker.chunk}\n")
                stdin.flush()
        else:
            worker.chunk = None
            with contextlib.suppress(BrokenPipeError):
                stdin.close()
        _record_workers(work, workers)

    def gone(worker: Worker) -> None:
        selector.unregister(worker.proc.stdout)
        code = worker.proc.wait()
        del workers[worker.number]
        if worker.chunk is None and code == 0:
            return
        why = f"the worker on {worker.device} exited with {code}"
        if worker.chunk is not None:
            failures[worker.chunk] += 1
            if failures[worker.chunk] < 2:
                queue.appendleft(worker.chunk)
                outcome.retried.append(worker.chunk)
            else:
                outcome.failed[worker.chunk] = why
        print(f"prepare: {why} (chunk {worker.chunk})", file=sys.stderr)
        if queue and restarts[worker.device] < RESTARTS_PER_DEVICE:
            restarts[worker.device] += 1
            start(worker.number, worker.device)

    def handle(worker: Worker, message: dict[str, object]) -> None:
        event = message.get("event")
        if event == "ready":
            worker.ready = True
            worker.sink.tally.started = time.monotonic()  # its rate counts from here
            outcome.first_ready = outcome.first_ready or worker.sink.tally.started
            worker.sink.tally.batch_size = int(message["rows"])  # type: ignore[arg-type]
            worker.sink.tally.load_s = float(message["load_s"])  # type: ignore[arg-type]
            outcome.load_seconds.append(worker.sink.tally.load_s)
            hand_out(worker)
        elif event == "progress":
            progress.add(
                worker.sink.tally,
                tokens=int(message["tokens"]),  # type: ignore[arg-type]
                answers=int(message["answers"]),  # type: ignore[arg-type]
                truncated=int(message["truncated"]),  # type: ignore[arg-type]
            )
        elif event == "done":
            progress.chunk_done(worker.sink.tally, int(message["samples"]))  # type: ignore[arg-type]
            hand_out(worker)
        elif event == "error":
            raise PrepareError(str(message["message"]))

    try:
        for number, device in enumerate(devices):
            start(number, device)
        while workers:
            for key, _ in selector.select(timeout=1.0):
                worker: Worker = key.data
                stream: IO[str] = key.fileobj  # type: ignore[assignment]
                data = stream.read()
                if data == "":
                    gone(worker)
                    continue
                worker.buffer += data or ""
                *lines, worker.buffer = worker.buffer.split("\n")
                for line in lines:
                    if line.strip():
                        handle(worker, json.loads(line))
            progress.emit()
        # Past --max-seconds the rest is unanswered by design (as with one worker), not lost.
        if not past(deadline, progress):
            for chunk in queue:
                outcome.failed.setdefault(chunk, "no worker was left to answer it")
        return outcome
    finally:
        _end(workers.values())
        selector.close()
        with contextlib.suppress(FileNotFoundError):
            (work.root / WORKERS_FILE).unlink()


def past(deadline: float | None, progress: PrepareProgress) -> bool:
    """--max-seconds has run out, and something was answered (a dataset is never empty).
    Seen on an H200: two workers out of time read "chunk 4 failed twice (no worker was left
    to answer it)" for the chunks nobody was meant to start."""
    return deadline is not None and time.time() > deadline and progress.tokens > 0


def _end(workers: Sequence[Worker] | object) -> None:
    """TERM the workers still running (a stop, an error), KILL them after a grace period."""
    left = list(workers)  # type: ignore[call-overload]
    for worker in left:
        with contextlib.suppress(ProcessLookupError):
            worker.proc.send_signal(signal.SIGTERM)
    for worker in left:
        try:
            worker.proc.wait(END_GRACE_S)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait()
