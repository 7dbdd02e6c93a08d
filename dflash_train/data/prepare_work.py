"""The working directory of an unfinished prepare, `.<out>.prepare/` beside the dataset: the
plan (what was asked, fingerprinted), the jobs cut into chunks, and one finished part per
chunk. A part is written atomically when its chunk is answered, so a prepare killed at any
moment and started again skips exactly the finished chunks: no prompt is answered into the
dataset twice and none is lost. The dataset itself appears only when every chunk is done."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_train.config.prepare_config import PrepareConfig, PrepareError
from dflash_train.data.conversations import Conversation, Message
from dflash_train.rundir import atomic_write_text

if TYPE_CHECKING:
    from dflash_train.data.writer import Sample

PLAN = "plan.json"
CHUNKS = "chunks"
PARTS = "parts"
PART_INFO = "part.json"
LOCK = "lock"
# What decides the samples: a resume with any of these changed would mix two data sets.
FINGERPRINT_FIELDS = (
    "target",
    "prompts",
    "samples",
    "max_new_tokens",
    "temperature",
    "seed",
    "chunk_size",
    "responses",
    "system",
    "chat_template_kwargs",
)


def work_dir_of(out: Path) -> Path:
    out = out.absolute()
    return out.with_name(f".{out.name}.prepare")


def fingerprint(config: PrepareConfig, sources: Sequence[str]) -> dict[str, Any]:
    """The fields that decide the samples plus each input file's size and mtime."""
    record = config.to_record()
    files = {}
    for path in sources:
        with contextlib.suppress(OSError):
            st = Path(path).stat()
            files[str(Path(path).absolute())] = [st.st_size, st.st_mtime_ns]
    kept = {k: record[k] for k in FINGERPRINT_FIELDS}
    if isinstance(kept["prompts"], tuple):
        kept["prompts"] = list(kept["prompts"])
    return {**kept, "files": files}


@dataclass(frozen=True)
class Job:
    """One sample to make: which conversation, and in which pass over the prompts."""

    index: int
    prompt_index: int
    conversation: Conversation
    repeat: int


def job_record(job: Job) -> dict[str, Any]:
    return {
        "index": job.index,
        "prompt_index": job.prompt_index,
        "repeat": job.repeat,
        "messages": [[m.role, m.content] for m in job.conversation],
    }


def job_from_record(record: dict[str, Any]) -> Job:
    conversation: Conversation = tuple(Message(role, text) for role, text in record["messages"])
    return Job(record["index"], record["prompt_index"], conversation, record["repeat"])


@dataclass
class WorkDir:
    root: Path
    _lock_fd: int | None = None

    @property
    def plan_file(self) -> Path:
        return self.root / PLAN

    def plan(self) -> dict[str, Any] | None:
        try:
            plan = json.loads(self.plan_file.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return None
        return plan if isinstance(plan, dict) else None

    def lock(self) -> None:
        """Hold the work dir for this prepare; a second one on the same `--out` is refused."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PrepareError(f"out: another prepare is writing {self.root}") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def clear(self) -> None:
        """Forget an earlier plan and its parts (--overwrite), keeping our lock file."""
        for child in self.root.iterdir():
            if child.name != LOCK:
                shutil.rmtree(child) if child.is_dir() else child.unlink()

    def write_plan(
        self, plan: dict[str, Any], jobs: Sequence[Job], chunk_size: int, files: dict[str, str]
    ) -> int:
        """Chunk files first, the plan last: a plan on disk means its chunks are complete."""
        chunks = self.root / CHUNKS
        chunks.mkdir(parents=True, exist_ok=True)
        count = 0
        for count, start in enumerate(range(0, len(jobs), chunk_size), start=1):
            lines = "".join(
                json.dumps(job_record(job)) + "\n" for job in jobs[start : start + chunk_size]
            )
            atomic_write_text(self.chunk_file(count - 1), lines)
        for name, text in files.items():
            atomic_write_text(self.root / name, text)
        atomic_write_text(self.plan_file, json.dumps({**plan, "chunks": count}, indent=1) + "\n")
        return count

    def chunk_file(self, chunk: int) -> Path:
        return self.root / CHUNKS / f"chunk_{chunk:06d}.jsonl"

    def read_chunk(self, chunk: int) -> list[Job]:
        text = self.chunk_file(chunk).read_text(encoding="utf-8")
        return [job_from_record(json.loads(line)) for line in text.splitlines() if line]

    def part_dir(self, chunk: int) -> Path:
        return self.root / PARTS / f"chunk_{chunk:06d}"

    def done_chunks(self) -> dict[int, dict[str, Any]]:
        """Finished chunks and what their worker recorded (a part is whole once renamed)."""
        done: dict[int, dict[str, Any]] = {}
        parts = self.root / PARTS
        if not parts.is_dir():
            return done
        for path in sorted(parts.glob("chunk_*")):
            info_file = path / PART_INFO
            if path.name.endswith(".tmp") or not info_file.is_file():
                continue
            done[int(path.name.removeprefix("chunk_"))] = json.loads(info_file.read_text("utf-8"))
        return done

    def write_part(self, chunk: int, samples: Sequence[Sample], info: dict[str, Any]) -> None:
        from dflash_train.data.writer import write_dataset

        dest = self.part_dir(chunk)
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_dataset(samples, dest, info, 1, info_name=PART_INFO)

    def remove(self) -> None:
        self.unlock()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def holding(work: WorkDir) -> Iterator[WorkDir]:
    work.lock()
    try:
        yield work
    finally:
        work.unlock()
