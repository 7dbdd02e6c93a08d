"""Every target replica's layers compile, however many replicas there are. The layers of one
class share one `forward` code object, and a replica that fails the others' guards takes
graphs of its own (two with the warm-up's shapes); past dynamo's recompile limit (8 by
default) that code ran eagerly for good, with a log warning only: on an 8-GPU box the fifth
to seventh target replicas, each on its own device, lost their compiled layers.

A CPU has one device, so replicas here differ by dtype, which dynamo guards the same way;
and three of them meet a limit of four where seven GPUs would meet the default eight."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from dflash_train.pipeline.target_workers import (
    compile_target_layers,
    uncompile_target_layers,
    warm_up_target,
)
from dflash_train.targets.frozen_target import Target, load_target

LAYER_IDS = [1, 3]


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    torch.compiler.reset()
    counters.clear()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 4)
    yield
    torch.compiler.reset()


def _replica(dtype: torch.dtype) -> Target:
    torch.manual_seed(0)
    return load_target("random:tiny", "cpu", dtype)


def test_every_replica_gets_its_own_compiled_graphs_past_dynamo_s_default_limit() -> None:
    replicas = [_replica(dtype) for dtype in (torch.float32, torch.float64, torch.bfloat16)]
    graphs = []
    for target in replicas:
        compile_target_layers(target, LAYER_IDS, backend="eager")
        warm_up_target(target, LAYER_IDS)
        graphs.append(counters["stats"]["unique_graphs"])
    # Three graphs a replica (mask or none, and one row), the third's too (at a limit of
    # four it ran eagerly: 3, 4, 4).
    assert graphs == [3, 6, 9]
    forward = replicas[0].layers[0].forward
    code = getattr(forward, "_torchdynamo_orig_callable", forward).__code__
    assert len(_debug_get_cache_entry_list(code)) == 9
    assert torch._dynamo.config.recompile_limit >= 256
    for target in replicas:
        uncompile_target_layers(target)
