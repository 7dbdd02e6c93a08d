"""`dflash-train plan`: the best targets:drafters split from the stage rates of a run's
stream (a synthetic one, written with the real StatusWriter), from given rates, or measured
by a real calibration run of SmolLM2 on the CPU (`--measure`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_train.config.recipes import CPU_TINY
from dflash_train.pipeline import split_plan
from dflash_train.stream.writer import StatusWriter

TOKENS = 8192
# One thread for the calibration's trainer, as tests/trainer/train_process.py gives its runs:
# on a shared 2-core box its two OpenMP threads spin against the other workers' (the real
# calibration took 103 s in the suite with them, 13 s without).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _plan(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, dict | str]:
    done = subprocess.run(
        [sys.executable, "-m", "dflash_train", "plan", *argv],
        capture_output=True, text=True, timeout=timeout, env=(env or os.environ) | ONE_THREAD,
    )  # fmt: skip
    out = done.stdout.strip()
    return done.returncode, (json.loads(out) if out.startswith("{") else out)


def write_run(
    run_dir: Path,
    target_ms: float,
    drafter_ms: float,
    shared: bool = False,
    pipeline: str = "async",
) -> None:
    """A run_start, steps of TOKENS tokens each, and profile lines: the first (compile and
    warm-up) far slower than the rest, which the planner leaves out."""
    run_dir.mkdir(parents=True)
    writer = StatusWriter(run_dir / "status.jsonl", "run1")
    devices = (["cuda:0"], ["cuda:0"]) if shared else (["cuda:0", "cuda:1"], ["cuda:2"])
    writer.write(
        "run_start", config={"target_model": "random:qwen3.5-27b", "tokens_per_batch": 4096},
        topology={
            "target": devices[0], "drafter": devices[1], "world_size": 1, "pipeline": pipeline,
        },
        dataset={}, batches_per_epoch=100, total_steps=100, pid=1, host="box",
    )  # fmt: skip
    stages = {"load": 20.0, "copy": 0.2, "optimizer": 0.1 * drafter_ms}
    writer.write(
        "profile", stages_ms=stages | {"target_fwd": 30_000.0, "drafter_fwd_bwd": 9e4}, allocator={}
    )
    for step in range(1, 21):
        writer.write(
            "step", step=step, epoch=0, epoch_progress=step / 100, loss=1.0, acc=0.5,
            tau=2.0, lr=1e-4, grad_norm=1.0, tokens=step * TOKENS, ktok_s=5.0,
        )  # fmt: skip
        if step % 5 == 0:
            writer.write(
                "profile",
                stages_ms=stages | {"target_fwd": target_ms, "drafter_fwd_bwd": 0.9 * drafter_ms},
                allocator={},
            )  # fmt: skip
    writer.close()


def test_the_split_follows_the_two_rates() -> None:
    rates = split_plan.StageRates(9.2, 4.56, "given")
    best = split_plan.best_split(rates, 8)
    assert (best.targets, best.drafters) == (3, 5)
    assert best.ktok_s == pytest.approx(22.8) and best.drafter_util == 1.0
    assert best.target_util == pytest.approx(22.8 / 27.6, abs=1e-3)
    assert [s.ratio for s in split_plan.all_splits(rates, 3)] == ["1:2", "2:1"]
    # Equal rates: the even split, both stages busy.
    even = split_plan.best_split(split_plan.StageRates(10.0, 10.0, "given"), 8)
    assert (even.targets, even.ktok_s, even.target_util, even.drafter_util) == (4, 40.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="need 2"):
        split_plan.all_splits(rates, 1)


def test_plan_reads_the_rates_from_a_runs_stream(tmp_path: Path) -> None:
    # 8192 tokens: 800 ms of target forward = 10.24 Ktok/s a replica; 1600 ms of drafter
    # (fwd+bwd + optimiser) = 5.12 Ktok/s a rank: two drafters per target.
    write_run(tmp_path / "run", target_ms=800.0, drafter_ms=1600.0)
    code, reply = _plan("--gpus", "6", "--from", str(tmp_path / "run"))
    assert code == 0 and isinstance(reply, dict) and reply["ok"], reply
    assert reply["rates"]["target_ktok_s"] == pytest.approx(10.24)
    assert reply["rates"]["drafter_ktok_s"] == pytest.approx(5.12)
    assert reply["rates"]["notes"] == []
    assert "4 profile lines" in reply["rates"]["source"]
    assert reply["best"] == {
        "targets": 2, "drafters": 4, "ktok_s": 20.48, "target_util": 1.0, "drafter_util": 1.0,
    }  # fmt: skip
    assert reply["current"]["targets"] == 2 and reply["current"]["drafters"] == 1
    assert reply["current"]["ktok_s"] == pytest.approx(5.12)
    assert len(reply["splits"]) == 5
    code, text = _plan("--gpus", "6", "--from", str(tmp_path / "run"), "--table")
    assert code == 0 and isinstance(text, str)
    assert "  2:4      20.48         100%          100%  <- best" in text.splitlines()
    assert text.splitlines()[-1] == (
        "the run's own placement (2 target replicas on cuda:0, cuda:1, 1 drafter rank on "
        "cuda:2): ~5.12 Ktok/s"
    )


def test_plan_says_when_the_rates_came_from_a_shared_gpu(tmp_path: Path) -> None:
    write_run(tmp_path / "run", target_ms=500.0, drafter_ms=500.0, shared=True)
    code, reply = _plan("--gpus", "8", "--from", str(tmp_path / "run"), "--target-model", "x")
    assert code == 0 and isinstance(reply, dict)
    notes = reply["rates"]["notes"]
    assert "shared cuda:0" in notes[0] and "lower bounds" in notes[0]
    assert notes[1] == "the run trained random:qwen3.5-27b, not x"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--gpus", "1", "--target-ktok-s", "1", "--drafter-ktok-s", "1"], "gpus: 1 leaves no GPU"),
        (["--gpus", "8"], "rates: give --measure -- TRAIN_ARGS, --from RUN_DIR or both"),
        (["--gpus", "8", "--target-ktok-s", "3"], "rates: give --measure -- TRAIN_ARGS, --from"),
        (["--gpus", "8", "--measure", "--from", "/r"], "rates: give one of --measure, --from"),
        (
            ["--gpus", "8", "--target-ktok-s", "1", "--drafter-ktok-s", "1", "--", "--lr", "1"],
            "measure: train args after -- (--lr 1) are for --measure only",
        ),
        (["--gpus", "8", "--measure"], "measure: give the recipe to time after --"),
        (
            ["--gpus", "8", "--measure", "--", "--target-model", "smollm2", "--output-dir", "/r"],
            "--output-dir: set by plan --measure",
        ),
        (
            ["--gpus", "8", "--measure", "--", "--target-model", "smollm2", "--lr", "-1"],
            "train args: lr (--lr): must be above 0",
        ),
        (["--gpus", "8", "--target-ktok-s", "0", "--drafter-ktok-s", "2"], "target_ktok_s: 0 must"),
        (["--gpus", "8", "--from", "/nonexistent/run"], "does not exist"),
    ],
)
def test_bad_plan_arguments_are_refused_in_one_line(argv: list[str], error: str) -> None:
    code, reply = _plan(*argv)
    assert code == 2 and isinstance(reply, dict) and not reply["ok"]
    assert error in reply["error"] and "\n" not in reply["error"]


def test_a_stream_without_profiles_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = StatusWriter(run_dir / "status.jsonl", "run1")
    writer.write(
        "run_start", config={}, topology={"target": ["cpu"], "drafter": ["cpu"]}, dataset={},
        batches_per_epoch=1, total_steps=1, pid=1, host="box",
    )  # fmt: skip
    writer.close()
    code, reply = _plan("--gpus", "8", "--from", str(run_dir))
    assert code == 2 and isinstance(reply, dict)
    assert reply["error"].startswith("from: no profile line with both target_fwd")


def test_a_placement_that_shares_devices_is_predicted_by_their_time() -> None:
    rates = split_plan.StageRates(10.0, 5.0, "given")
    disjoint = split_plan.topology_split(rates, ["cuda:0", "cuda:1"], ["cuda:2"])
    assert disjoint == split_plan.split_rate(rates, 2, 1)
    # One device for both: the stages take turns, 10 x 5 / (10 + 5).
    one = split_plan.topology_split(rates, ["cuda:0"], ["cuda:0"])
    assert one.ktok_s == pytest.approx(3.333) and one.target_util == pytest.approx(0.333)
    assert one.drafter_util == pytest.approx(0.667)
    # Two replicas on that one device make no more than one: they split its time.
    two = split_plan.topology_split(rates, ["cuda:0", "cuda:0"], ["cuda:0"])
    assert two == split_plan.Split(2, 1, 3.333, 0.333, 0.667)
    # One of two DDP ranks on a target device: it takes r/2 / 20 of that device's time, the
    # rest of which and the other target device make r: r = 10 / (1 + 5 / 40) = 8.889.
    slow_target = split_plan.StageRates(5.0, 20.0, "given")
    part = split_plan.topology_split(slow_target, ["cuda:0", "cuda:1"], ["cuda:0", "cuda:2"])
    assert part.ktok_s == pytest.approx(8.889) and part.drafter_util == pytest.approx(0.222)
    # A device with two drafter ranks caps the rate at what its time gives both.
    crowded = split_plan.topology_split(rates, ["cuda:0", "cuda:1"], ["cuda:2", "cuda:2"])
    assert crowded.ktok_s == pytest.approx(5.0) and crowded.drafter_util == 1.0


def test_a_sync_run_on_one_gpu_gives_exact_rates_and_its_turn_taking_rate(tmp_path: Path) -> None:
    write_run(tmp_path / "run", target_ms=500.0, drafter_ms=1000.0, shared=True, pipeline="sync")
    code, reply = _plan("--gpus", "8", "--from", str(tmp_path / "run"))
    assert code == 0 and isinstance(reply, dict), reply
    assert reply["rates"]["notes"] == []  # the stages took turns: each time is its own
    target, drafter = reply["rates"]["target_ktok_s"], reply["rates"]["drafter_ktok_s"]
    assert (target, drafter) == (pytest.approx(16.384), pytest.approx(8.192))
    current = reply["current"]
    assert current["ktok_s"] == pytest.approx(target * drafter / (target + drafter), abs=1e-3)
    assert (current["target_devices"], current["drafter_devices"]) == (["cuda:0"], ["cuda:0"])


def test_plan_measures_both_rates_with_a_real_calibration_run(
    tmp_path: Path, prepared_data_dir: Path
) -> None:
    keep = tmp_path / "calibration"
    recipe = ["--data-dir", str(prepared_data_dir), *CPU_TINY.argv(), "--epochs", "1000"]
    code, reply = _plan(
        "--gpus", "4", "--target-model", "smollm2", "--measure", "--measure-seconds", "3",
        "--measure-dir", str(keep), "--", *recipe, timeout=600,
    )  # fmt: skip
    assert code == 0 and isinstance(reply, dict) and reply["ok"], reply
    measured = reply["measured"]
    assert (measured["target_device"], measured["drafter_device"]) == ("cpu", "cpu")
    assert measured["pipeline"] == "sync" and measured["train_exit"] is None
    assert measured["steps"] >= 1 and measured["run_dir"] == str(keep)
    assert len(reply["splits"]) == 3 and reply["target_model"] == "smollm2"
    # The calibration ran the recipe (plan's --target-model passed on), stopped by a signal.
    lines = split_plan.read_stream(keep / "status.jsonl")
    # It waited for 3 profile lines after the first; the step its stop lets end may write one
    # more (a CPU step can outlast the 1 s interval), and the rates hold every line there is.
    usable = [
        line for line in lines
        if line.kind == "profile" and line["stages_ms"].get(split_plan.TARGET_STAGE)
        and line["stages_ms"].get(split_plan.DRAFTER_STAGES[0])
    ]  # fmt: skip
    assert len(usable) - 1 >= 3 and reply["rates"]["notes"] == []
    assert f": {len(usable) - 1} profile lines," in reply["rates"]["source"]
    start = next(line for line in lines if line.kind == "run_start")
    assert start["config"]["target_model"] == "smollm2" and start["config"]["draft_layers"] == 1
    assert start["config"]["eval_every"] == 0 and start["topology"]["pipeline"] == "sync"
    assert lines[-1].kind == "run_end" and lines[-1]["reason"] == "signal"
    # Its rates are its stream's, as `plan --from` reads them.
    code, again = _plan("--gpus", "4", "--from", str(keep))
    assert code == 0 and isinstance(again, dict)
    assert again["rates"] == reply["rates"] and again["best"] == reply["best"]
    said = split_plan.table(reply).splitlines()[-1]
    assert said.startswith("measured by a calibration run: target on cpu, drafter on cpu, sync")
    assert said.endswith(f"{measured['steps']} steps in {measured['seconds']:.0f} s")


def test_a_calibration_that_cannot_train_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    code, reply = _plan(
        "--gpus", "4", "--measure", "--", "--target-model", "smollm2", "--data-dir",
        str(tmp_path / "none"), *CPU_TINY.argv(), env=os.environ | {"TMPDIR": str(temp)},
        timeout=300,
    )  # fmt: skip
    assert code == 2 and isinstance(reply, dict) and reply["error_code"] == "measure_failed"
    assert reply["error"] == (
        "measure: the calibration run exited with code 1 before its stage rates: "
        f"DatasetError: data dir {tmp_path / 'none'}: not a directory"
    )
    assert list(temp.iterdir()) == []  # its temporary run dir is gone


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_plan_stopped_while_calibrating_stops_its_trainer(
    tmp_path: Path, prepared_data_dir: Path, sig: signal.Signals
) -> None:
    keep = tmp_path / "calibration"
    plan = subprocess.Popen(
        [
            sys.executable, "-m", "dflash_train", "plan", "--gpus", "4", "--measure",
            "--measure-seconds", "600", "--measure-dir", str(keep), "--", "--target-model",
            "smollm2", "--data-dir", str(prepared_data_dir), *CPU_TINY.argv(), "--epochs", "1000",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=os.environ | ONE_THREAD,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    trainer = None
    while trainer is None and time.monotonic() < deadline:  # its trainer is training
        stream = keep / "status.jsonl"
        lines = split_plan.read_stream(stream) if stream.is_file() else []
        if any(line.kind == "step" for line in lines):
            trainer = next(line for line in lines if line.kind == "run_start")["pid"]
        time.sleep(0.2)
    assert trainer is not None, "the calibration never trained"
    plan.send_signal(sig)
    out, _ = plan.communicate(timeout=300)
    reply = json.loads(out.strip().splitlines()[-1])
    assert plan.returncode == 2 and reply["error_code"] == "measure_failed"
    assert reply["error"] == (
        f"measure: plan was stopped ({sig.name}), and its calibration run with it"
    )
    # The trainer was stopped as a run is (SIGTERM: its step finished, its run_end written)
    # and is gone, not training on alone in its own session.
    with pytest.raises(ProcessLookupError):
        os.kill(trainer, 0)
    last = split_plan.read_stream(keep / "status.jsonl")[-1]
    assert last.kind == "run_end" and last["reason"] == "signal"
