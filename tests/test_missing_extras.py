"""Installed without an extra (`pip install dflash-train-console` alone, or only [tui] on a
laptop): `--version` still answers, and a command that needs the missing extra says in one
line which module and which extra, instead of a traceback (seen in a fresh venv with the
wheel alone: ModuleNotFoundError for tomlkit, and for numpy from `train` and `prepare`). The
missing modules are made missing for real in the child: a finder installed by
sitecustomize refuses to import them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dflash_train import DISTRIBUTION, __version__

BLOCKER = """
import os, sys
BLOCKED = set(os.environ["DFLASH_TEST_BLOCK"].split(","))
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
"""


def _run(
    tmp_path: Path, block: str, *argv: str, cache: Path | None = None
) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{root}", "DFLASH_TEST_BLOCK": block}
    if cache is not None:
        env["DFLASH_CACHE_DIR"] = str(cache)
    return subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_console_without_its_extra(tmp_path: Path) -> None:
    block = "tomlkit,textual,asyncssh,plotext,textual_plotext,rich"
    version = _run(tmp_path, block, "-m", "dflash_tui.entry", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"dflash-tui {__version__} ({DISTRIBUTION})"
    fleet = _run(tmp_path, block, "-m", "dflash_tui.entry", "fleet")
    assert fleet.returncode == 2 and "Traceback" not in fleet.stderr, fleet.stderr
    [line] = fleet.stderr.splitlines()
    assert "is not installed" in line and f"'{DISTRIBUTION}[tui]'" in line, line


def test_the_trainer_without_its_extra(tmp_path: Path) -> None:
    block = "torch,numpy,transformers,datasets"
    version = _run(tmp_path, block, "-m", "dflash_train", "--version")
    assert version.returncode == 0 and __version__ in version.stdout, version.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    argv = ["-m", "dflash_train", "prepare", "--target-model", "smollm2", "--prompts"]
    done = _run(tmp_path, block, *argv, str(prompts), "--out", str(tmp_path / "d"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert (reply["ok"], reply["error_code"]) == (False, "missing_dependency")
    assert "is not installed" in reply["error"] and f"'{DISTRIBUTION}[train]'" in reply["error"]
    # A control command the console sends needs none of it.
    status = _run(tmp_path, block, "-m", "dflash_train", "status", str(tmp_path / "none"))
    assert json.loads(status.stdout)["error_code"] == "run_dir_missing", status.stderr


def test_the_smollm2_target_without_gguf(tmp_path: Path) -> None:
    """Seen in a fresh venv with [train] only (gguf is [demo]'s): prepare on `smollm2` ended
    in transformers' traceback ("install torch and gguf"). It is one reply naming [demo]."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    # An empty model cache: the GGUF must be converted, which needs gguf.
    argv = ["-m", "dflash_train", "prepare", "--target-model", "smollm2", "--prompts"]
    done = _run(
        tmp_path, "gguf", *argv, str(prompts), "--out", str(tmp_path / "d"), cache=tmp_path / "c"
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert (reply["ok"], reply["error_code"]) == (False, "missing_dependency")
    assert reply["error"].startswith("gguf is not installed")
    assert f"'{DISTRIBUTION}[demo]'" in reply["error"]
