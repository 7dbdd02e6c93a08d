"""`launch` refuses bad starts before anything starts, each with a named reason, and
leaves the run directory as it found it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from control_harness import cli, dataset_shell

from dflash_train.rundir import RunLock

TARGET = "random:tiny"


def _launch(run_dir: Path, data_dir: Path, *extra: str, launch_opts: tuple[str, ...] = ()) -> tuple:
    return cli(
        "launch",
        str(run_dir),
        *launch_opts,
        "--",
        "--target-model",
        TARGET,
        "--data-dir",
        str(data_dir),
        *extra,
    )


def _untouched(run_dir: Path) -> bool:
    if not run_dir.exists():
        return True
    return not {"run.json", "train.log", "status.jsonl"} & {p.name for p in run_dir.iterdir()}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return dataset_shell(tmp_path / "data")


@pytest.mark.parametrize(
    ("extra", "code", "words"),
    [
        (("--target-model", "/nowhere/model"), "target_not_found", "/nowhere/model"),
        (("--target-model", "random:huge"), "target_not_found", "huge"),
        (("--target-gpus", "0"), "gpu_missing", "NVML"),
        (("--drafter-gpus", "cpu,3"), "gpu_missing", "GPU 3"),
        (("--lr", "-1"), "bad_train_args", "--lr"),
        (("--hs-queue-depth", "4", "--hs-min-ready", "9"), "bad_train_args", "hs_min_ready"),
        (("--no-such-option", "1"), "bad_train_args", "--no-such-option"),
        (("--target-model", "random:tiny", "--target-layers", "5"), "bad_train_args", "6 layers"),
    ],
)
def test_refused_with_a_named_reason(
    tmp_path: Path, data: Path, extra: tuple[str, ...], code: str, words: str
) -> None:
    run_dir = tmp_path / "run"
    rc, reply = _launch(run_dir, data, *extra)
    assert rc == 1 and not reply.ok
    assert reply.error_code == code, reply
    assert words in (reply.error or "")
    assert "\n" not in (reply.error or "")
    assert _untouched(run_dir)


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real export of an untrained drafter shaped for random:tiny: 1 layer fed by 1 target
    layer, 4-token blocks."""
    import torch

    from dflash_train.checkpoint.export import export_drafter
    from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target
    from dflash_train.targets.frozen_target import load_target

    target = load_target(TARGET, torch.device("cpu"), torch.float32)
    config = drafter_config_for_target(target, num_layers=1, block_size=4, num_context_layers=1)
    return export_drafter(DFlashDrafter(config), tmp_path_factory.mktemp("init") / "export")


def test_init_from_weights_of_another_shape_or_of_nothing_is_refused(
    tmp_path: Path, data: Path, tiny_export: Path
) -> None:
    run_dir = tmp_path / "run"
    shape = ("--draft-layers", "1", "--target-layers", "1")
    for extra, words in (
        (("--block-size", "8"), "block_size: --init-from"),
        (("--block-size", "4", "--draft-layers", "2"), "draft_layers: --init-from"),
        (("--block-size", "4", "--init-from", str(tmp_path)), "is neither an export dir"),
    ):
        args = ("--init-from", str(tiny_export), *shape, *extra)
        rc, reply = _launch(run_dir, data, *args)
        assert rc == 1 and reply.error_code == "bad_init_from", reply
        assert words in (reply.error or "") and "\n" not in (reply.error or "")
        assert _untouched(run_dir)


def test_data_dir_problems(tmp_path: Path, data: Path) -> None:
    run_dir = tmp_path / "run"
    rc, reply = _launch(run_dir, tmp_path / "missing")
    assert rc == 1 and reply.error_code == "data_dir_unreadable"
    assert "missing" in (reply.error or "")
    shard = data / "data-00001-of-00002.arrow"
    shard.unlink()
    rc, reply = _launch(run_dir, data)
    assert rc == 1 and reply.error_code == "data_dir_unreadable"
    assert shard.name in (reply.error or "")
    # A FIFO where a shard should be must be refused, not block the preflight.
    os.mkfifo(shard)
    rc, reply = _launch(run_dir, data)
    assert rc == 1 and reply.error_code == "data_dir_unreadable"
    assert "regular file" in (reply.error or "")
    shard.unlink()
    shard.mkdir()
    rc, reply = _launch(run_dir, data)
    assert rc == 1 and reply.error_code == "data_dir_unreadable"
    assert _untouched(run_dir)


def test_output_dir_not_writable(tmp_path: Path, data: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    rc, reply = _launch(blocker / "run", data)
    assert rc == 1 and reply.error_code == "output_not_writable"
    assert str(blocker) in (reply.error or "")


def test_disk_full(tmp_path: Path, data: Path) -> None:
    free_mb = shutil.disk_usage(tmp_path).free // 2**20
    rc, reply = _launch(tmp_path / "run", data, launch_opts=("--min-free-mb", str(free_mb + 10**9)))
    assert rc == 1 and reply.error_code == "disk_full" and "MiB free" in (reply.error or "")


def test_bad_launch_options(tmp_path: Path, data: Path) -> None:
    rc, reply = _launch(tmp_path / "run", data, launch_opts=("--env", "NOT AN ASSIGNMENT"))
    assert rc == 1 and reply.error_code == "bad_env"
    rc, reply = _launch(tmp_path / "run", data, launch_opts=("--wait", "0"))
    assert rc == 1 and reply.error_code == "bad_argument" and "wait" in (reply.error or "")
    rc, reply = _launch(tmp_path / "run", data, launch_opts=("--wiat", "3"))
    assert rc == 1 and reply.error_code == "bad_argument" and "--wiat" in (reply.error or "")
    _, reply = cli("launch", str(tmp_path / "run"), "--", "--output-dir", "/elsewhere")
    assert reply.error_code == "bad_train_args" and "--output-dir" in (reply.error or "")


def test_a_held_lock_is_already_running_with_its_pid(tmp_path: Path, data: Path) -> None:
    run_dir = tmp_path / "run"
    with RunLock(run_dir / "run.lock"):
        rc, reply = _launch(run_dir, data)
    assert rc == 1 and reply.error_code == "already_running"
    assert reply.data["pid"] == os.getpid()


def test_a_launch_in_progress_makes_another_wait_its_turn(tmp_path: Path, data: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a launch or restart in progress holds
        rc, reply = _launch(run_dir, data)
    finally:
        os.close(fd)
    assert rc == 1 and reply.error_code == "busy"
    assert _untouched(run_dir)


def test_control_commands_never_import_torch(tmp_path: Path, data: Path) -> None:
    # The whole preflight runs (it fails only at the disk check) and the other commands
    # answer, all without torch: over SSH they must reply in well under a second.
    script = """
import contextlib, io, sys
from dflash_train.cli import main
run_dir, data = sys.argv[1], sys.argv[2]
commands = [
    ["launch", run_dir, "--min-free-mb", "999999999", "--", "--target-model", "random:tiny",
     "--data-dir", data, "--target-gpus", "cpu"],
    ["status", run_dir], ["stop", run_dir], ["set", run_dir, "hs_min_ready", "3"],
    ["tail", run_dir, "--history", "10"], ["gpus"], ["restart", run_dir],
]
for argv in commands:
    out = io.TextIOWrapper(io.BytesIO())
    with contextlib.redirect_stdout(out):
        main(argv)
    out.flush()
    print(out.buffer.getvalue().decode().splitlines()[:1])
print(sorted(m for m in ("torch", "transformers", "datasets") if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run"), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    printed = done.stdout.strip().splitlines()
    assert "disk_full" in printed[0]  # launch went through every other check
    assert printed[-1] == "[]"
