"""The committed quality-run drafter (bench/results/quality_smollm2/export) still loads,
decodes losslessly against the real SmolLM2 target, and reproduces the tau recorded for it
on the CPU within 5 %."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dflash_train.checkpoint.export import load_any_drafter
from dflash_train.data.prompt_ids import chat_prompt_ids, stop_token_ids
from dflash_train.data.prompts import load_prompts
from dflash_train.decode.evaluation import evaluate_prompts
from dflash_train.targets.frozen_target import Target

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "quality_smollm2"


@pytest.mark.slow
def test_committed_export_reproduces_its_recorded_tau(smollm2: Target) -> None:
    record = json.loads((RESULTS / "result.json").read_text())["cpu_check"]
    export = RESULTS / "export"
    assert (
        export / "model.safetensors"
    ).stat().st_size < 48_000_000  # the cap on the committed export
    drafter = load_any_drafter(export, "cpu", torch.float32).eval()
    assert drafter.config.block_size == 16 and drafter.config.mask_mode == "token"
    prompts = load_prompts("builtin", "eval")[: record["prompts"]]
    ids = [chat_prompt_ids(smollm2.tokenizer, p) for p in prompts]
    summary = evaluate_prompts(
        smollm2, drafter, ids, record["max_new_tokens"], stop_token_ids(smollm2)
    )
    assert summary.lossless
    assert abs(summary.tau - record["tau"]) <= 0.05 * record["tau"], summary
