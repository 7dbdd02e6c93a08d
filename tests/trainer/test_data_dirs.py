"""`train --data-dir A --data-dir 'B*2'`: several prepared dirs trained on as one dataset, each
taken K times an epoch, after one check that they were tokenised alike (prepare.json's
tokenizer fingerprint, written by the real prepare with SmolLM2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_train import protocol
from dflash_train.data.dataset import DatasetError, load_data_dirs, load_dataset_dir


def test_dirs_are_concatenated_with_weights(prepared_data_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(prepared_data_dir, other)
    one = load_dataset_dir(prepared_data_dir)
    both = load_data_dirs((str(prepared_data_dir), f"{other}*2"))
    assert len(both) == 3 * len(one) and both.stats.tokens == 3 * one.stats.tokens
    assert both.lengths.tolist() == one.lengths.tolist() * 3
    first, last = both.rows([0, len(both) - 1])
    expected = one.rows([0, len(one) - 1])
    assert first[0].tolist() == expected[0][0].tolist()
    assert last[0].tolist() == expected[1][0].tolist()
    sources = both.prepare_info["sources"]
    assert [s["weight"] for s in sources] == [1, 2]


def test_another_tokenizer_is_refused_naming_the_dir(
    prepared_data_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(prepared_data_dir, other)
    info = json.loads((other / "prepare.json").read_text())
    assert info["tokenizer"]["vocab_size"] == 49152, "prepare records its tokenizer"
    info["tokenizer"] = {"vocab_size": 151669, "sha256": "0123456789abcdef"}
    (other / "prepare.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=f"data dir {other}: prepared with another tokenizer"):
        load_data_dirs((str(prepared_data_dir), str(other)))


def test_the_command_line_takes_the_flag_again(prepared_data_dir: Path, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "dflash_train", "train", "--target-model", "smollm2"]
    argv += ["--data-dir", str(prepared_data_dir), "--data-dir", f"{tmp_path}*2"]
    argv += ["--output-dir", str(tmp_path / "run"), "--print-config"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    values = printed.get("config", printed)
    found = json.dumps(values)
    assert json.dumps([str(prepared_data_dir), f"{tmp_path}*2"]) in found, found[:500]


def test_a_run_on_several_dirs_evaluates_on_the_first_held_out_set_among_them(
    prepared_data_dir: Path, tmp_path: Path
) -> None:
    # No --eval-data: the held-out set is the first data dir's heldout.jsonl that exists
    # (here the second dir's, named as DIR*K); a run on several dirs once crashed at startup
    # (the dirs' tuple taken for one path). Real trainer processes on the CPU.
    from train_process import run_train, status_lines, train_argv

    from dflash_train.data.heldout import HELDOUT_FILE

    other = tmp_path / "other"
    shutil.copytree(prepared_data_dir, other)
    prompts = ["Name a colour.", "Count to three.", "Say hello."]
    (other / HELDOUT_FILE).write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n" for p in prompts)
    )

    def train(run_dir: Path) -> list[protocol.StatusLine]:
        argv = train_argv(
            "random:tiny", prepared_data_dir, run_dir, "--data-dir", f"{other}*2",
            "--pipeline", "sync", "--max-steps", "2", "--save-every", "0",
            "--eval-every", "2", "--eval-prompts", "5", "--eval-tokens", "4",
        )  # fmt: skip
        done = run_train(argv)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = status_lines(run_dir)
        assert next(ln for ln in lines if ln.kind == "run_end")["reason"] == "completed"
        return lines

    lines = train(tmp_path / "run")
    evals = [ln for ln in lines if ln.kind == "event" and ln["code"] == "eval"]
    assert [(ev["step"], ev["prompts"]) for ev in evals] == [(2, len(prompts))]
    # `eval --run-dir` finds the same set from the run's run_start (data_dir a list there).
    argv = [sys.executable, "-m", "dflash_train", "eval", "--run-dir", str(tmp_path / "run")]
    done = subprocess.run([*argv, "--device", "cpu"], capture_output=True, text=True, timeout=300)
    reply = protocol.decode_reply(done.stdout)
    assert isinstance(reply, protocol.Reply) and reply.ok, (done.stdout, done.stderr[-2000:])
    assert reply.data["prompts"] == len(prompts)

    # Neither dir has one: the run trains on and says which file it looked for.
    (other / HELDOUT_FILE).unlink()
    lines = train(tmp_path / "again")
    said = " ".join(ln["message"] for ln in lines if ln.kind == "event")
    assert str(prepared_data_dir / HELDOUT_FILE) in said, said[-2000:]
