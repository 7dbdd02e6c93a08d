"""Two drafter ranks on the CPU: `train --drafter-gpus cpu,cpu` starts the second rank
itself, DDP runs over gloo, the batches are split, and only rank 0 writes; a checkpoint of
one rank count resumes at another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_train import protocol
from dflash_train.checkpoint.store import TrainState
from dflash_train.config.recipes import CPU_TINY
from dflash_train.training.resume import planned_steps
from dflash_train.training.run import gpu_roles


def test_two_gloo_ranks_train_and_rank0_writes(tmp_path: Path, prepared_data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    lines, stderr = _train(run_dir, prepared_data_dir, 2, "--max-steps", "3", "--save-every", "2")
    assert stderr.count("run_end: completed at step 3") == 2  # both ranks finished
    # Rank 1's messages say whose they are (both ranks write to the same train.log).
    assert "[rank 1] run_end: completed at step 3" in stderr.splitlines()
    assert "run_end: completed at step 3" in stderr.splitlines()
    kinds = [line.kind for line in lines]
    assert kinds.count("run_start") == 1 and kinds.count("run_end") == 1
    start = lines[0]
    topology = start["topology"]
    assert topology["world_size"] == 2 and topology["drafter"] == ["cpu", "cpu"]
    # The whole run's devices, not rank 0's share (rank 0 got one of the two targets).
    assert topology["target"] == ["cpu", "cpu"]
    steps = [line for line in lines if line.kind == "step"]
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

    class Sink(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return super().write(text)

    sink = Sink()
    stream = RankPrefixedStream(sink, 2)
    for piece in ("a", "\n", "b\nc", "\n", "", "d\n\n"):
        stream.write(piece)  # print() writes the text and the newline apart
    assert sink.getvalue() == "[rank 2] a\n[rank 2] b\n[rank 2] c\n[rank 2] d\n[rank 2] \n"
    # Each line in one write, its newline with it: another rank's line can come between
    # two lines, never inside one.
    assert all(write.endswith("\n") for write in sink.writes)
    assert sink.writes[:2] == ["[rank 2] a\n", "[rank 2] b\n"]
    stream.write("e")  # a line with no newline yet waits for one, or for flush (the exit's)
    assert sink.getvalue().endswith("[rank 2] \n")
    stream.flush()
    assert sink.getvalue().endswith("[rank 2] \n[rank 2] e")
    for piece in ("\rf", "\n"):  # a progress bar: its redraws and end stay on its line
        stream.write(piece)
        stream.flush()
    stream.write("g\n")
    assert sink.getvalue().endswith("[rank 2] \n[rank 2] e\rf\n[rank 2] g\n")
    assert stream.getvalue() == sink.getvalue()  # everything else goes to the real stream
    rank0 = Sink()
    zero = RankPrefixedStream(rank0, 0)
    zero.write("run_end: completed at step 3")
    zero.write("\n")
    assert rank0.writes == ["run_end: completed at step 3\n"]  # no prefix, one write


def _train(
    run_dir: Path, data: Path, ranks: int, *extra: str
) -> tuple[list[protocol.StatusLine], str]:
    """A one-epoch sync run of `ranks` drafter ranks (and as many target replicas) on the
    CPU: the lines it added to its stream, and what it wrote to stderr."""
    stream = run_dir / "status.jsonl"
    before = len(stream.read_bytes().splitlines()) if stream.exists() else 0
    devices = ",".join(["cpu"] * ranks)
    argv = [
        sys.executable, "-m", "dflash_train", "train",
        "--target-model", "random:tiny",
        "--data-dir", str(data),
        "--output-dir", str(run_dir),
        *CPU_TINY.argv(),
        "--drafter-gpus", devices,
        "--target-gpus", devices,
        "--pipeline", "sync",
        "--epochs", "1",
        "--run-id", "split0001",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [protocol.decode_line(raw) for raw in stream.read_bytes().splitlines()[before:]]
    assert all(isinstance(line, protocol.StatusLine) for line in lines)
    return lines, done.stderr  # type: ignore[return-value]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)], ids=["2-to-1", "1-to-2"])
def test_a_resume_with_another_rank_count_trains_the_rest_of_the_epoch_once(
    tmp_path: Path, prepared_data_dir: Path, before: int, after: int
) -> None:
    """A restart with another targets:drafters split (the console's split advice) resumes
    a checkpoint saved at another rank count: the run plans the steps its untrained batches
    take at the new count. Counting the whole epoch at the new count instead ended a run
    that gained a rank a step early, its last batches never trained (1-to-2), and gave one
    that lost a rank a total it never reached (2-to-1)."""
    run_dir = tmp_path / "run"
    first, _ = _train(run_dir, prepared_data_dir, before, "--max-steps", "2", "--save-every", "2")
    batches = first[0]["batches_per_epoch"]
    assert first[-1]["reason"] == "completed" and batches >= 6
    resumed, _ = _train(run_dir, prepared_data_dir, after, "--resume-from", "latest")
    start = resumed[0]
    assert start.kind == "run_start" and start["resumed_from"].endswith("step_0000002")
    assert start["topology"]["world_size"] == after
    # 2 steps at the old count trained 2 * before batches; the rest, `after` a step.
    planned = 2 + (batches - 2 * before) // after
    assert start["total_steps"] == planned
    steps = [line for line in resumed if line.kind == "step"]
    assert [line["step"] for line in steps] == list(range(3, planned + 1))
    # The epoch's share trained counts the checkpoint's batches once, then `after` a step.
    assert [line["epoch_progress"] for line in steps] == [
        pytest.approx((2 * before + (line["step"] - 2) * after) / batches) for line in steps
    ]
    assert resumed[-1].kind == "run_end" and resumed[-1]["reason"] == "completed"


def test_planned_steps_from_a_checkpoint_at_the_same_count_equal_the_whole_plan() -> None:
    """At an unchanged rank count the resumed plan is the unbroken run's, whatever the
    position (each step took one batch per rank); at another count, the rest re-shared."""
    sizes = {0: 7, 1: 9, 2: 8}

    def plan(epoch: int) -> list[list[int]]:
        return [[i] for i in range(sizes[epoch])]

    for world in (1, 2, 3):
        whole = planned_steps(plan, 3, world)
        assert whole == sum(n // world for n in sizes.values())
        step = 0
        for epoch in range(3):
            for k in range(sizes[epoch] // world + 1):
                consumed = list(range(k * world))[::-1]  # order does not matter
                state = TrainState(step + k, epoch, consumed, 0, "r")
                assert planned_steps(plan, 3, world, state) == whole, (world, epoch, k)
            step += sizes[epoch] // world
    at_two = TrainState(3, 1, [0, 5, 2, 7, 1, 8], 0, "r")  # 3 steps of 2 into epoch 1
    assert planned_steps(plan, 3, 1, at_two) == 3 + 3 + 8
    assert planned_steps(plan, 3, 4, at_two) == 3 + 0 + 2
    assert planned_steps(plan, 1, 2, at_two) == 3  # epochs cut below the position


def test_planned_steps_under_a_limit_plan_only_the_epochs_it_reaches() -> None:
    """`--epochs 1000 --max-steps N` plans the epochs up to step N and no further (a
    thousand epochs' plans held a run's first step back by minutes); the count is the
    unlimited one capped at N, from the start and from a checkpoint."""
    planned: list[int] = []

    def plan(epoch: int) -> list[list[int]]:
        planned.append(epoch)
        return [[i] for i in range(7 + epoch % 3)]

    for world in (1, 2):
        whole = planned_steps(plan, 40, world)
        for limit in (1, 7, 8, 20, whole, whole + 5):
            planned.clear()
            assert planned_steps(plan, 40, world, limit=limit) == min(whole, limit)
            covered = sum((7 + e % 3) // world for e in planned[:-1])
            assert covered < limit or limit >= whole, (world, limit, planned)
            at_epoch_one = TrainState(3, 1, [0, 1, 2], 0, "r")
            resumed = planned_steps(plan, 40, world, at_epoch_one)
            assert planned_steps(plan, 40, world, at_epoch_one, limit) == min(resumed, limit)
    planned.clear()
    planned_steps(plan, 1000, 1, limit=20)
    assert planned == [0, 1, 2]  # 7 + 8 + 9 steps reach 20
