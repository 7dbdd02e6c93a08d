"""Fixtures every test area shares: the real SmolLM2 target and a small dataset that the real
`prepare` wrote with it, both made once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

SMOLLM2_SPEC = "smollm2"
# Small enough to generate in ~15 s on 2 cores, long enough for 16-token blocks.
PREPARED_SAMPLES = 24
PREPARED_NEW_TOKENS = 48


@pytest.fixture(scope="session")
def smollm2_spec() -> str:
    """The target spec to pass as --target-model."""
    return SMOLLM2_SPEC


@pytest.fixture(scope="session")
def smollm2_target(tmp_path_factory: pytest.TempPathFactory, smollm2_spec: str) -> Iterator[Path]:
    """The converted SmolLM2 model directory. The user's model cache is used when it already
    holds the conversion; otherwise (a fresh CI box) a per-session cache, which subprocesses
    find through DFLASH_CACHE_DIR."""
    from dflash_train.targets import frozen_target as targets

    previous = os.environ.get("DFLASH_CACHE_DIR")
    if previous is None and not targets.resolve_target(smollm2_spec).cached:
        os.environ["DFLASH_CACHE_DIR"] = str(tmp_path_factory.mktemp("dflash-cache"))
    yield targets.ensure_smollm2_converted()
    if previous is None:
        os.environ.pop("DFLASH_CACHE_DIR", None)


@pytest.fixture(scope="session")
def prepared_data_dir(
    tmp_path_factory: pytest.TempPathFactory, smollm2_target: Path, smollm2_spec: str
) -> Path:
    """A dataset directory written by the real prepare with SmolLM2: 24 greedy answers of up
    to 48 tokens to built-in train prompts, in 2 shards, with prepare.json and no held-out
    set (heldout.jsonl). Treat it as
    read-only; copy it to damage it."""
    from dflash_train.data.prepare import PrepareConfig, prepare_dataset

    out = tmp_path_factory.mktemp("prepared") / "data"
    config = PrepareConfig(
        target=smollm2_spec,
        prompts="builtin",
        out=out,
        samples=PREPARED_SAMPLES,
        max_new_tokens=PREPARED_NEW_TOKENS,
        # All 24 in one batch: a CPU decode step reads every weight whatever the batch, so
        # one batch of 24 costs little more than one of 8 (~11 s instead of ~20 s), and
        # prompts of different lengths still share it (the same rows as batches of 8).
        batch_size=PREPARED_SAMPLES,
        num_shards=2,
        # No held-out set: the runs of the other tests evaluate nothing (tests/trainer/
        # test_heldout_eval.py adds one to its own copy), where the default 40 prompts
        # would double the fixture's time and put an evaluation at every checkpoint.
        heldout=0,
    )
    import torch

    # One thread: on a shared 2-core box two OpenMP threads spin against each other and
    # generation runs an order of magnitude slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prepare_dataset(config)
    finally:
        torch.set_num_threads(threads)
    return out
