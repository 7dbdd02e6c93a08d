"""A console attaching to a prepare run that is hours in reads its progress at once: the
history `tail --history` sends keeps the newest `prepare` line (it keeps no other of them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dflash_train.stream.writer import StatusWriter


def test_the_history_keeps_the_newest_prepare_line(tmp_path: Path) -> None:
    writer = StatusWriter(tmp_path / "status.jsonl", "prep")
    start = {"config": {}, "topology": {}, "dataset": {}, "batches_per_epoch": 0}
    writer.write("run_start", mode="prepare", total_steps=0, pid=1, host="box", **start)
    for done in range(1, 301):
        writer.write(
            "prepare", prompts_done=done, prompts_total=300, answers_done=done,
            answers_total=300, answer_tokens=done * 10, tokens_per_s=5.0, truncated=0,
            eta_s=float(300 - done), devices=[],
        )  # fmt: skip
        writer.write("heartbeat")
    writer.close()
    argv = [sys.executable, "-m", "dflash_train", "tail", str(tmp_path), "--history", "50"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    progress = [line for line in lines if line.get("kind") == "prepare"]
    assert [line["prompts_done"] for line in progress] == [300], progress[:3]
    assert any(line.get("kind") == "run_start" and line["mode"] == "prepare" for line in lines)
