"""Several drafter devices: one process per device (torchrun-compatible env vars). When
`train` is started plainly with several drafter devices it becomes rank 0 and starts the
other ranks itself. DDP runs over NCCL on GPUs and gloo on CPU; a small gloo group lets the
ranks agree, on the host, when to stop."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def rank_from_env() -> RankInfo | None:
    """The rank set by torchrun or by `spawn_other_ranks`; None when not started as a rank."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    rank = int(os.environ["RANK"])
    return RankInfo(rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank)))


class RankPrefixedStream:
    """What a rank of a run of several writes to the train.log all ranks share: each line
    reaches it whole, in one write, with "[rank N] " in front (nothing for rank 0). Without
    the prefix an operator reads each message twice with no way to tell whose it is (seen
    on 2 H200s). print() writes the text and its newline apart, which under
    PYTHONUNBUFFERED (launch sets it) are two writes another rank's line can land between:
    "[rank 1] run_end: completed at step 3run_end: completed at step 3" (seen in the suite)."""

    def __init__(self, stream: Any, rank: int) -> None:
        self._stream = stream
        self._prefix = f"[rank {rank}] " if rank else ""
        self._partial = ""  # the text after the last newline, held until its own comes
        self._mid_line = False  # a flush wrote part of the line: its rest takes no prefix

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        if lines:
            first, *rest = lines
            whole = [f"{self._head()}{first}\n", *(f"{self._prefix}{line}\n" for line in rest)]
            self._mid_line = False
            self._stream.write("".join(whole))
        return len(text)

    def flush(self) -> None:
        # Asked for (a progress bar redrawing its line with "\r", or the interpreter's
        # exit): what there is of the line goes out now.
        if self._partial:
            self._stream.write(self._head() + self._partial)
            self._partial = ""
            self._mid_line = True
        self._stream.flush()

    def _head(self) -> str:
        return "" if self._mid_line else self._prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # A rank must not outlive rank 0 (say it was SIGKILLed): the kernel sends it SIGTERM.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn_other_ranks(train_argv: Sequence[str], world_size: int) -> list[subprocess.Popen[bytes]]:
    """Make this process rank 0 (sets its env) and start ranks 1..world_size-1 with the same
    train arguments. They share stdout/stderr (train.log) and the process group."""
    env_common = {
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "MASTER_PORT": os.environ.get("MASTER_PORT", str(_free_port())),
    }
    os.environ.update(env_common, RANK="0", LOCAL_RANK="0")
    children = []
    for rank in range(1, world_size):
        env = {**os.environ, **env_common, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        argv = [sys.executable, "-m", "dflash_train", "train", *train_argv]
        children.append(subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent))
    return children


class RankGroup:
    """The process group of a distributed run plus a gloo side group for host decisions."""

    def __init__(self, info: RankInfo, device: Any) -> None:
        import datetime

        import torch.distributed as dist

        self.info = info
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(minutes=30)
        dist.init_process_group(
            backend, rank=info.rank, world_size=info.world_size, timeout=timeout
        )
        self._host = dist.new_group(backend="gloo", timeout=timeout)

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag becomes true on every rank if it is true on any. CPU-only collective:
        it never waits for the GPU."""
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._host)
        return tuple(bool(v) for v in tensor.tolist())

    def union(self, values: Sequence[int]) -> list[int]:
        """The sorted union of every rank's `values` (batch positions consumed so far)."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.info.world_size
        dist.all_gather_object(gathered, list(values), group=self._host)
        return sorted({v for part in gathered for v in part})

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def shard_positions(positions: Sequence[int], rank: int, world_size: int) -> list[int]:
    """This rank's share of the epoch's batch positions. Every rank gets the same count
    (DDP needs equal steps), so up to world_size-1 trailing batches sit out this epoch."""
    usable = len(positions) - len(positions) % world_size
    return list(positions[:usable][rank::world_size])


def shard_devices(devices: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Target devices of this rank: a disjoint share when there are enough, else shared."""
    if len(devices) >= world_size:
        return list(devices[rank::world_size])
    return [devices[rank % len(devices)]]
