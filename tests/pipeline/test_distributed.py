"""Two drafter ranks on the CPU: `train --drafter-gpus cpu,cpu` starts the second rank
itself, DDP runs over gloo, the batches are split, and only rank 0 writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from dflash_train import protocol
from dflash_train.config.recipes import CPU_TINY
from dflash_train.training.run import gpu_roles


def test_two_gloo_ranks_train_and_rank0_writes(tmp_path: Path, prepared_data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "dflash_train", "train",
        "--target-model", "random:tiny",
        "--data-dir", str(prepared_data_dir),
        "--output-dir", str(run_dir),
        *CPU_TINY.argv(),
        "--drafter-gpus", "cpu,cpu",
        "--target-gpus", "cpu,cpu",
        "--pipeline", "sync",
        "--max-steps", "3",
        "--save-every", "2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("run_end: completed at step 3") == 2  # both ranks finished
    # Rank 1's messages say whose they are (both ranks write to the same train.log).
    assert "[rank 1] run_end: completed at step 3" in done.stderr.splitlines()
    assert "run_end: completed at step 3" in done.stderr.splitlines()
    lines = [
        protocol.decode_line(raw) for raw in (run_dir / "status.jsonl").read_bytes().splitlines()
    ]
    assert all(isinstance(line, protocol.StatusLine) for line in lines)
    kinds = [line.kind for line in lines]  # type: ignore[union-attr]
    assert kinds.count("run_start") == 1 and kinds.count("run_end") == 1
    start = lines[0]
    topology = start["topology"]
    assert topology["world_size"] == 2 and topology["drafter"] == ["cpu", "cpu"]
    # The whole run's devices, not rank 0's share (rank 0 got one of the two targets).
    assert topology["target"] == ["cpu", "cpu"]
    steps = [line for line in lines if line.kind == "step"]  # type: ignore[union-attr]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert lines[-1]["reason"] == "completed"
    # Each rank takes half of every epoch's batches.
    per_epoch = start["batches_per_epoch"] // 2
    assert start["total_steps"] == 3 and per_epoch >= 1
    own = run_dir / "checkpoints" / start.run  # the run's own folder
    saved = sorted(p.name for p in own.iterdir())
    assert saved[-1] == "step_0000003"
    state = torch.load(own / saved[-1] / "optimizer.pt", weights_only=False)
    assert state["state"], "rank 0 saved a stepped optimizer"


def test_gpu_roles_cover_every_rank_of_the_run() -> None:
    # Seen on 2x H200: DDP with a target replica and a drafter rank on each GPU reported GPU 1
    # with no role, because rank 0 named only its own share.
    assert gpu_roles(["cuda:0", "cuda:1"], ["cuda:0", "cuda:1"]) == {
        0: "target+drafter",
        1: "target+drafter",
    }
    assert gpu_roles(["cuda:0", "cuda:1", "cuda:2"], ["cuda:3", "cuda:4"]) == {
        0: "target", 1: "target", 2: "target", 3: "drafter", 4: "drafter",
    }  # fmt: skip
    assert gpu_roles(["cpu", "cpu"], ["cpu"]) == {}


def test_rank_prefix_marks_every_line_once_however_it_is_written() -> None:
    import io

    from dflash_train.pipeline.distributed import RankPrefixedStream

    sink = io.StringIO()
    stream = RankPrefixedStream(sink, 2)
    for piece in ("a", "\n", "b\nc", "\n", "", "d\n\n"):
        stream.write(piece)  # print() writes the text and the newline apart
    assert sink.getvalue() == "[rank 2] a\n[rank 2] b\n[rank 2] c\n[rank 2] d\n[rank 2] \n"
    assert stream.getvalue() == sink.getvalue()  # everything else goes to the real stream
