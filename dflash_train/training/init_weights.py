"""`train --init-from PATH`: the drafter starts from trained weights (an export dir or a
checkpoint dir) with this run's own optimizer, learning-rate schedule and step 0. What a
drafter needs to train on past one sitting's device time (a session's machine is gone with
its checkpoints; the committed export is not), or on new data, or a published drafter tuned
to one's own traffic. The source's shape is checked against the run's config before anything
heavy loads (checkpoint_layout.find_init_source, which launch's preflight runs too), and
its whole config against the drafter the run builds; its mask token is kept, as a resume
keeps a checkpoint's, unless this run's data holds it. A run that resumes a checkpoint (its
own, on a restart) takes that checkpoint's weights and optimizer instead."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from dflash_train.checkpoint import layout as checkpoint_layout

if TYPE_CHECKING:
    import numpy as np

    from dflash_train.checkpoint.layout import InitSource
    from dflash_train.model.drafter import DFlashConfig, DFlashDrafter
    from dflash_train.model.mask_token import MaskChoice


def source_config(source: InitSource) -> DFlashConfig:
    from dflash_train.checkpoint.export import config_from_export
    from dflash_train.model.drafter import read_drafter_config

    if source.kind == "export":
        record = json.loads((source.path / checkpoint_layout.EXPORT_CONFIG).read_text("utf-8"))
        return config_from_export(record)
    return read_drafter_config(source.path)


def mask_choice(source: InitSource, seen: np.ndarray | None) -> MaskChoice:
    """The source's mask: its weights learned block slots holding that token, so it stays;
    refused if this run's data holds it (`seen`: mask_token.tokens_seen, None where the
    target has a spare row), since a mask token must never be a real input."""
    from dflash_train.model.mask_token import MaskChoice, refuse_seen_mask

    saved = source_config(source)
    kept = MaskChoice(
        saved.mask_mode, saved.mask_token_id, f"the --init-from weights' ({source.kind})"
    )
    refuse_seen_mask(kept, seen, "init_from", source.path)
    return kept


# Fields that do not change the weights: the RoPE table is made to the run's length.
_FREE = {"max_position"}


def load_into(drafter: DFlashDrafter, source: InitSource) -> dict[str, Any]:
    """Copy the source's weights into `drafter`, built to the same config; what run_start
    records of the source."""
    import torch

    from dflash_train.checkpoint.export import load_any_drafter

    device = next(drafter.parameters()).device
    saved = load_any_drafter(source.path, device, torch.float32)
    for field in fields(drafter.config):
        have, want = getattr(saved.config, field.name), getattr(drafter.config, field.name)
        if field.name not in _FREE and have != want:
            raise ValueError(
                f"init_from: {source.path} has {field.name} {have}, the drafter this run "
                f"builds has {want}"
            )
    with torch.no_grad():
        drafter.load_state_dict(saved.state_dict())
    record: dict[str, Any] = {
        "path": str(source.path),
        "kind": source.kind,
        "run": source.facts.get("run_id"),
        "step": source.facts.get("step"),
    }
    if source.kind == "export":
        weights = source.path / checkpoint_layout.EXPORT_WEIGHTS
        record["sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    return record
