"""Shared fixtures for the trainer tests: one converted SmolLM2 per session, tiny targets."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from dflash_train.targets import frozen_target as targets

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Use the global model cache when SmolLM2 is already converted there; otherwise (CI
    starts empty) a per-session cache, shared by subprocesses through DFLASH_CACHE_DIR."""
    previous = os.environ.get("DFLASH_CACHE_DIR")
    if not targets.resolve_target("smollm2").cached:
        os.environ["DFLASH_CACHE_DIR"] = str(tmp_path_factory.mktemp("dflash-cache"))
    yield
    if previous is None:
        os.environ.pop("DFLASH_CACHE_DIR", None)
    else:
        os.environ["DFLASH_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def smollm2(model_cache: None) -> targets.Target:
    return targets.load_target("smollm2", "cpu", torch.float32)


@pytest.fixture(scope="session")
def tiny_target(model_cache: None) -> targets.Target:
    torch.manual_seed(0)
    return targets.load_target("random:tiny", "cpu", torch.float32)
