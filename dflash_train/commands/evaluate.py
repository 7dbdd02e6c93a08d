"""`dflash-train eval`: real speculative decoding with a drafter against its target on
held-out prompts; checks losslessness against plain greedy decoding; one JSON reply."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from dflash_train import protocol

if TYPE_CHECKING:
    from dflash_train.targets import ResolvedTarget


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target-model", required=True, help="HF dir, smollm2 or random:<preset>")
    parser.add_argument(
        "--drafter", required=True, help="an export dir, a checkpoint dir or a run dir"
    )
    parser.add_argument(
        "--prompts", default="builtin", help="builtin (its held-out eval split) or a prompt file"
    )
    parser.add_argument("--max-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if any)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="auto: bfloat16 on CUDA, float32 on CPU. In bfloat16 a verify forward over a "
        "block and a one-token forward round differently, so a near-tie can flip and "
        "'lossless' can read false without a bug; float32 makes that unlikely",
    )


def _reply(reply: protocol.Reply) -> None:
    from dflash_train.commands.launch import print_reply

    print_reply(reply)


def _fail(code: str, message: str, rc: int = 2) -> int:
    _reply(protocol.reply_error("eval", code, message.splitlines()[0] if message else code))
    return rc


def run(args: argparse.Namespace) -> int:
    if args.max_prompts < 1:
        return _fail("bad_argument", f"max_prompts: {args.max_prompts} is below 1")
    if args.max_new_tokens < 1:
        return _fail("bad_argument", f"max_new_tokens: {args.max_new_tokens} is below 1")
    from dflash_train.data.prompts import PromptError, load_prompts
    from dflash_train.targets import resolve_target

    try:
        resolved = resolve_target(args.target_model)
    except ValueError as exc:
        return _fail("bad_target", str(exc))
    try:
        prompts = load_prompts(args.prompts, split="eval")[: args.max_prompts]
    except PromptError as exc:
        return _fail("bad_prompts", str(exc))
    if not prompts:
        return _fail("bad_prompts", f"prompts: {args.prompts} holds no prompt")
    return _evaluate(args, resolved, prompts)


def _evaluate(args: argparse.Namespace, resolved: ResolvedTarget, prompts: list[str]) -> int:
    import torch

    from dflash_train.data.prepare import chat_prompt_ids, stop_token_ids
    from dflash_train.export import load_any_drafter
    from dflash_train.speculative import check_compatible, evaluate_prompts
    from dflash_train.targets import load_target

    start = time.monotonic()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, args.dtype)
    try:
        drafter = load_any_drafter(args.drafter, device, dtype).eval()
    except (ValueError, OSError) as exc:
        return _fail("bad_drafter", f"drafter: {exc}")
    try:
        check_compatible(drafter, resolved)
    except ValueError as exc:
        return _fail("mismatch", str(exc))
    target = load_target(args.target_model, device, dtype)
    ids = [chat_prompt_ids(target.tokenizer, prompt) for prompt in prompts]
    print(f"eval: {len(ids)} prompts, up to {args.max_new_tokens} new tokens", file=sys.stderr)
    summary = evaluate_prompts(target, drafter, ids, args.max_new_tokens, stop_token_ids(target))
    _reply(
        protocol.reply_ok(
            "eval",
            tau=round(summary.tau, 4),
            tokens_per_target_forward=round(summary.tokens_per_target_forward, 4),
            baseline_tokens_per_target_forward=round(summary.baseline_tokens_per_target_forward, 4),
            lossless=summary.lossless,
            mismatched_prompts=list(summary.mismatches),
            prompts=summary.prompts,
            blocks=summary.blocks,
            generated_tokens=summary.generated_tokens,
            block_size=drafter.config.block_size,
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            seconds=round(time.monotonic() - start, 2),
        )
    )
    return 0
