"""Every control reply's human line, and where a trainer's W&B key may come from: the env
file (private, never echoed) or `wandb login`'s netrc under the box's HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_train import protocol
from dflash_train.control.launch import load_env_file
from dflash_train.control.preflight import PreflightError
from dflash_train.control.reply_text import with_message
from dflash_train.pipeline.wandb_log import wandb_credentials


def message(reply: protocol.Reply) -> str:
    return with_message(reply).data["message"]


def test_each_reply_says_what_happened_in_one_line() -> None:
    restart = protocol.reply_ok("restart", run_id="1f900d3a", pid=9569, seconds=5.43,
                                resumed_from="/runs/x/checkpoints/step_0000073",
                                fresh=False, env_dropped=[], stopped={"pid": 9000})  # fmt: skip
    assert message(restart) == "restarted: resumed from step 73 in 5.4 s, run 1f900d3a, pid 9569"
    launch = protocol.reply_ok("launch", run_id="ab12", pid=7, seconds=12.0, finished=False)
    assert message(launch) == "launched: training in 12.0 s, run ab12, pid 7"
    stop = protocol.reply_ok("stop", run_id="ab12", pid=7, step=40, seconds=3.1, stopped_by="kill")
    assert message(stop) == "killed: run ab12 at step 40 in 3.1 s, pid 7"
    status = protocol.reply_ok("status", state="stalled", run_id="ab12", last_step=40,
                               total_steps=90, last_line_age=75.2)  # fmt: skip
    assert message(status) == "stalled: run ab12, step 40/90, last line 75 s ago"
    failed = protocol.reply_error("launch", "gpu_busy", "gpus: in use (GPU 0: pid 4242 python)")
    assert message(failed) == "launch failed: gpus: in use (GPU 0: pid 4242 python)"
    own = protocol.reply_ok("set", message="hs_min_ready=3 applied (rev 2)")
    assert message(own) == "hs_min_ready=3 applied (rev 2)"  # the command's own line stays


def test_env_file_must_be_private_and_its_values_are_never_echoed(tmp_path: Path) -> None:
    env = tmp_path / "env"
    env.write_text("# comment\n\nexport WANDB_API_KEY='k-123'\nWANDB_ENTITY = team\n")
    env.chmod(0o640)
    with pytest.raises(PreflightError, match=r"mode 0640; it holds secrets: chmod 600"):
        load_env_file(str(env))
    env.chmod(0o600)
    assert load_env_file(str(env)) == {"WANDB_API_KEY": "k-123", "WANDB_ENTITY": "team"}
    env.write_text("GOOD=1\nthis-line-holds-a-secret-k-123\n")
    with pytest.raises(PreflightError) as bad:
        load_env_file(str(env))
    assert "line 2: not NAME=VALUE" in bad.value.message and "k-123" not in bad.value.message
    with pytest.raises(PreflightError, match="No such file"):
        load_env_file(str(tmp_path / "absent"))


def test_wandb_key_from_the_environment_or_the_netrc_under_home(tmp_path: Path) -> None:
    assert wandb_credentials({"HOME": str(tmp_path)}) is None
    assert wandb_credentials({"WANDB_API_KEY": "k", "HOME": str(tmp_path)}) == "WANDB_API_KEY"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k-123\n")
    assert wandb_credentials({"HOME": str(tmp_path)}) == "netrc"  # what `wandb login` writes
    assert wandb_credentials({"HOME": str(tmp_path), "WANDB_BASE_URL": "https://w.example"}) is None
