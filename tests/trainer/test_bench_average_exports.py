"""bench/quality/average_exports.py on real exports of tiny drafters: the written export is
each tensor's mean and loads like any export, names its inputs by sha256, and exports of
two architectures are refused in one line that names the field."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch
from drafter_fixtures import tiny_drafter

from dflash_train.checkpoint.export import export_drafter, load_exported

REPO = Path(__file__).resolve().parents[2]


def _average(out: Path, *exports: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "bench/quality/average_exports.py", str(out), *map(str, exports)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def _export(tmp_path: Path, name: str, seed: int, **overrides: object) -> Path:
    drafter = tiny_drafter(seed, mask_mode="token", mask_token_id=3, **overrides)
    return export_drafter(drafter, tmp_path / name, "float32")


def test_the_average_is_each_tensors_mean_and_names_its_inputs(tmp_path: Path) -> None:
    exports = [_export(tmp_path, f"e{seed}", seed) for seed in (0, 1, 2)]
    done = _average(tmp_path / "mean", *exports)
    assert done.returncode == 0, done.stderr[-2000:]

    states = [load_exported(e).state_dict() for e in exports]
    mean = load_exported(tmp_path / "mean").state_dict()
    assert mean.keys() == states[0].keys()
    for name, tensor in mean.items():
        expected = (states[0][name] + states[1][name] + states[2][name]) / 3
        torch.testing.assert_close(tensor, expected)
    # Not a copy of one input: the seeds' weights differ, so the mean differs from each.
    assert not torch.equal(mean["fc.weight"], states[0]["fc.weight"])

    info = json.loads((tmp_path / "mean/dflash_export.json").read_text())
    digests = [hashlib.sha256((e / "model.safetensors").read_bytes()).hexdigest() for e in exports]
    assert [entry["sha256"] for entry in info["averaged_from"]] == digests
    assert info["servable"] is True
    reply = json.loads(done.stdout)
    written = (tmp_path / "mean/model.safetensors").read_bytes()
    assert reply["sha256"] == hashlib.sha256(written).hexdigest()


def test_exports_of_two_architectures_are_refused_naming_the_field(tmp_path: Path) -> None:
    one = _export(tmp_path, "one", 0)
    two = _export(tmp_path, "two", 1, num_layers=2)
    done = _average(tmp_path / "mean", one, two)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"average_exports: num_layers: {two} has 2, {one} 1"
    ]
    assert not (tmp_path / "mean").exists()


def test_one_export_is_not_an_average(tmp_path: Path) -> None:
    done = _average(tmp_path / "mean", _export(tmp_path, "one", 0))
    assert done.returncode != 0
    assert done.stderr.strip() == "average_exports: exports: give at least two"
