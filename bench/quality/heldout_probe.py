"""Which training change lifts held-out acceptance? Trains drafter variants on the same
target-generated answers to built-in train prompts and prints each one's teacher-forced
per-slot accuracy and tau on the train prompts and on held-out (eval split) prompts:

  base      the trainer's loss (hard labels: the target's greedy tokens)
  kd        labels mixed with the target's own next-token distribution at the same
            position (--kd-weight of it): what `train --distill` does
  init      drafter layers copied from the target's last layers before training

Small, CPU-sized data overstates what regularisers do, so read the ranking, not the sizes.

    python bench/quality/heldout_probe.py --prompts 128 --held-out 24 --steps 300
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch


def generate(target: Any, texts: list[str], max_new: int) -> list[tuple[list[int], list[int]]]:
    from dflash_train.cached_target import CachedTarget
    from dflash_train.data.generation import generate_rows
    from dflash_train.data.prepare import chat_prompt_ids, stop_token_ids

    stops = stop_token_ids(target)
    prompts = sorted((chat_prompt_ids(target.tokenizer, p) for p in texts), key=len)
    runner = CachedTarget(target)
    answers: list[list[int]] = []
    for i in range(0, len(prompts), 32):
        answers += generate_rows(
            runner, prompts[i : i + 32], max_new_tokens=max_new, stop_ids=stops
        )
    return [(p + a, [0] * len(p) + [1] * len(a)) for p, a in zip(prompts, answers, strict=True)]


def features(target: Any, rows: list, layer_ids: tuple[int, ...]) -> list[tuple]:
    from dflash_train.targets import extract_context

    final = target.num_layers - 1
    out = []
    for ids, mask in rows:
        seq = torch.tensor([ids])
        feats = extract_context(target, seq, None, [*layer_ids, final]).float().clone()
        width = feats.shape[-1] // (len(layer_ids) + 1)
        out.append((seq, torch.tensor([mask]), feats[..., :-width], feats[..., -width:]))
    return out


def copy_target_layers(drafter: Any, target: Any) -> None:
    """Drafter layer i <- target layer L-n+i (attention, MLP, norms); q/k norms stay ones."""
    layers = target.layers
    n = len(drafter.layers)
    for mine, theirs in zip(drafter.layers, layers[len(layers) - n :], strict=True):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(mine.self_attn, name).weight.data.copy_(getattr(theirs.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mine.mlp, name).weight.data.copy_(getattr(theirs.mlp, name).weight)
        mine.input_layernorm.weight.data.copy_(theirs.input_layernorm.weight)
        mine.post_attention_layernorm.weight.data.copy_(theirs.post_attention_layernorm.weight)
    drafter.norm.weight.data.copy_(target.backbone.norm.weight)


def block_loss(
    drafter: Any,
    target: Any,
    item: tuple,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    kd_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The trainer's loss (slot decay, same-position labels), logits made in full; with
    kd_weight > 0 the label is (1-w) onehot + w softmax(target logits at label-1)."""
    from dflash_train.dflash_loss import slot_decay

    seq, mask, ctx, teacher = item
    size = drafter.config.block_size
    length = seq.shape[1]
    block = drafter.embed_blocks(target.embed_tokens, seq.gather(1, anchors))
    hidden = drafter(block, ctx, anchors, valid).view(1, anchors.shape[1], size, -1)[:, :, 1:]
    pos = (anchors[:, :, None] + torch.arange(1, size)).clamp(max=length - 1)
    labels = seq.gather(1, pos.view(1, -1)).view(pos.shape)
    counted = mask.gather(1, pos.view(1, -1)).view(pos.shape).float() * valid[:, :, None]
    counted = counted * ((anchors[:, :, None] + torch.arange(1, size)) < length)
    weights = counted * slot_decay(size)
    logits = target.lm_head(hidden).float()
    logp = logits.log_softmax(-1)
    hard = -logp.gather(-1, labels[..., None]).squeeze(-1)
    loss_rows = hard
    if kd_weight > 0:
        with torch.no_grad():
            t_hidden = teacher[0, (pos - 1).view(-1)].view(*pos.shape, -1)
            t_prob = target.lm_head(t_hidden).float().softmax(-1)
        soft = -(t_prob * logp).sum(-1)
        loss_rows = (1 - kd_weight) * hard + kd_weight * soft
    loss = (loss_rows * weights).sum() / weights.sum().clamp_min(1e-6)
    correct = ((logits.argmax(-1) == labels).float() * counted).sum(dim=(0, 1))
    return loss, correct, counted.sum(dim=(0, 1))


def measure(drafter: Any, target: Any, items: list, block: int) -> dict[str, Any]:
    """Teacher-forced slot accuracy over every anchor of every row (no sampling)."""
    from dflash_train.dflash_loss import tau_from_slot_acc

    correct = torch.zeros(block - 1)
    total = torch.zeros(block - 1)
    drafter.eval()
    with torch.no_grad():
        for item in items:
            mask = item[1][0]
            cand = [t for t in range(len(mask) - 1) if mask[t] and mask[t + 1]]
            for i in range(0, len(cand), 64):
                anchors = torch.tensor([cand[i : i + 64]])
                valid = torch.ones_like(anchors, dtype=torch.bool)
                _, c, n = block_loss(drafter, target, item, anchors, valid, 0.0)
                correct += c
                total += n
    drafter.train()
    acc = (correct / total.clamp_min(1)).tolist()
    return {"slot_acc": [round(a, 3) for a in acc[:6]], "tau_tf": round(tau_from_slot_acc(acc), 3)}


def train_variant(name: str, args: argparse.Namespace, target: Any, train: list, held: list):
    from dflash_train.dflash_loss import sample_anchors
    from dflash_train.drafter import DFlashDrafter, drafter_config_for_target

    torch.manual_seed(0)
    config = drafter_config_for_target(
        target,
        num_layers=args.layers,
        block_size=args.block_size,
        num_context_layers=args.context_layers,
    )
    drafter = DFlashDrafter(config).train()
    if name == "init":
        copy_target_layers(drafter, target)
    kd = args.kd_weight if name == "kd" else 0.0
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / args.steps)
    )
    generator = torch.Generator().manual_seed(0)
    started = time.monotonic()
    for _ in range(args.steps):
        optimizer.zero_grad()
        for k in torch.randint(len(train), (args.batch,), generator=generator).tolist():
            item = train[k]
            anchors, valid = sample_anchors(item[1], args.anchors, args.block_size, generator)
            loss, _, _ = block_loss(drafter, target, item, anchors, valid, kd)
            (loss / args.batch).backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    record = {
        "variant": name,
        "steps": args.steps,
        "seconds": round(time.monotonic() - started),
        "train": measure(drafter, target, train[: args.held_out], args.block_size),
        "held_out": measure(drafter, target, held, args.block_size),
    }
    print(json.dumps(record), flush=True)
    return record


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--held-out", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context-layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--kd-weight", type=float, default=0.5)
    parser.add_argument("--variants", default="base,kd,init")
    parser.add_argument("--cache", default="/tmp/heldout_probe_rows.json")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    from dflash_train.data.prompts import load_prompts
    from dflash_train.drafter import drafter_config_for_target
    from dflash_train.targets import load_target

    torch.set_grad_enabled(True)
    target = load_target("smollm2", "cpu", torch.float32)
    cache = Path(args.cache)
    key = f"{args.prompts}/{args.held_out}/{args.max_new_tokens}"
    rows = json.loads(cache.read_text()) if cache.exists() else {}
    if key not in rows:
        started = time.monotonic()
        rows = {key: {
            "train": generate(target, load_prompts("builtin")[: args.prompts], args.max_new_tokens),
            "held": generate(target, load_prompts("builtin", "eval")[: args.held_out],
                             args.max_new_tokens),
        }}  # fmt: skip
        cache.write_text(json.dumps(rows))
        print(f"generated in {time.monotonic() - started:.0f}s", file=sys.stderr)
    layer_ids = drafter_config_for_target(
        target, num_layers=args.layers, num_context_layers=args.context_layers
    ).target_layer_ids
    train = features(target, rows[key]["train"], layer_ids)
    held = features(target, rows[key]["held"], layer_ids)
    tokens = sum(int(m.sum()) for _, m, _, _ in train)
    print(json.dumps({"train_rows": len(train), "answer_tokens": tokens, "held_rows": len(held)}))
    results = [train_variant(v, args, target, train, held) for v in args.variants.split(",")]
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
