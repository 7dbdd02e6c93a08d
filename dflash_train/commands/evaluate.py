"""`dflash-train eval`: real speculative decoding with a drafter against its target on
held-out prompts; checks losslessness against plain greedy decoding; one JSON reply."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from dflash_train import protocol
from dflash_train.pipeline.progress_line import ProgressLine

if TYPE_CHECKING:
    from dflash_train.data.conversations import Conversation
    from dflash_train.data.heldout import HeldoutSet
    from dflash_train.decode.evaluation import EvalSummary
    from dflash_train.targets.frozen_target import ResolvedTarget


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target-model", help="HF dir, smollm2 or random:<preset> (default: the run's)"
    )
    parser.add_argument(
        "--drafter",
        help="an export dir, a checkpoint dir or a run dir (default with --run-dir: its "
        "newest checkpoint)",
    )
    parser.add_argument(
        "--prompts",
        help="builtin (its held-out eval split, the default) or a prompt file; with "
        "--run-dir: the run's held-out set",
    )
    parser.add_argument("--max-prompts", type=int, help="default 8; the run's --eval-prompts")
    parser.add_argument("--max-new-tokens", type=int, help="default 128; the run's --eval-tokens")
    parser.add_argument(
        "--run-dir",
        metavar="RUN",
        help="evaluate a checkpoint of this run with its settings and held-out set, and "
        "record the result: the checkpoint's score and an `eval` event in the run's stream",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if any)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="float32 (default): in bfloat16 a verify forward over a block and a one-token "
        "forward round differently, so a near-tie can flip and 'lossless' can read false "
        "without a bug; float32 makes that unlikely",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        action="append",
        help="draft blocks of this size (default: the drafter's; at most that); repeat for "
        "several, greedy is decoded once and each size is reported under by_block_size",
    )


class EvalProgress:
    """stderr while prompts are decoded: prompts done of each phase (greedy, then each block
    size) and, while drafting, tau so far; a tqdm bar on a terminal."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.phase: str | None = None
        self.line: ProgressLine | None = None

    def prompt_done(self, phase: str, done: int, tau: float | None) -> None:
        if phase != self.phase:
            self.close()
            self.phase, self.line = phase, ProgressLine(f"eval {phase}:", self.total)
        assert self.line is not None
        figures = "prompts decoded" if tau is None else f"prompts, tau so far {tau:.3f}"
        self.line.update(done, figures)

    def close(self) -> None:
        if self.line is not None:
            self.line.close()
            self.line = None


def _reply(reply: protocol.Reply) -> None:
    from dflash_train.commands.launch import print_reply

    print_reply(reply)


def _fail(code: str, message: str, rc: int = 2) -> int:
    _reply(protocol.reply_error("eval", code, message.splitlines()[0] if message else code))
    return rc


def run(args: argparse.Namespace) -> int:
    heldout = None
    if args.run_dir is not None:
        from dflash_train.commands.eval_run import RunEvalError, apply_run_defaults

        try:
            heldout = apply_run_defaults(args)
        except RunEvalError as exc:
            return _fail(exc.code, str(exc))
    for name, default in (("prompts", "builtin"), ("max_prompts", 8), ("max_new_tokens", 128)):
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("target_model", "drafter"):
        if getattr(args, name) is None:
            return _fail("bad_argument", f"{name}: required (or give --run-dir)")
    if args.max_prompts < 1:
        return _fail("bad_argument", f"max_prompts: {args.max_prompts} is below 1")
    if args.max_new_tokens < 1:
        return _fail("bad_argument", f"max_new_tokens: {args.max_new_tokens} is below 1")
    for size in args.block_size or ():
        if size < 2:
            return _fail("bad_argument", f"block_size: {size} is below 2")
    from dflash_train.data.conversations import eval_prompt, load_conversations
    from dflash_train.data.prompts import PromptError
    from dflash_train.targets.frozen_target import resolve_target

    try:
        resolved = resolve_target(args.target_model)
    except ValueError as exc:
        return _fail("bad_target", str(exc))
    try:
        conversations = (
            heldout.prompts
            if heldout is not None
            else load_conversations(args.prompts, split="eval")
        )
        prompts = [eval_prompt(c) for c in conversations][: args.max_prompts]
    except PromptError as exc:
        return _fail("bad_prompts", str(exc))
    if not prompts:
        return _fail("bad_prompts", f"prompts: {args.prompts} holds no prompt")
    return _evaluate(args, resolved, prompts, heldout)


def _evaluate(
    args: argparse.Namespace,
    resolved: ResolvedTarget,
    prompts: list[Conversation],
    heldout: HeldoutSet | None = None,
) -> int:
    import torch

    from dflash_train.checkpoint.export import load_any_drafter
    from dflash_train.data.prompt_ids import conversation_prompt_ids, stop_token_ids
    from dflash_train.decode.evaluation import evaluate_prompts
    from dflash_train.decode.speculative import check_compatible
    from dflash_train.targets.frozen_target import load_target

    start = time.monotonic()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    try:
        drafter = load_any_drafter(args.drafter, device, dtype).eval()
    except (ValueError, OSError) as exc:
        return _fail("bad_drafter", f"drafter: {exc}")
    try:
        check_compatible(drafter, resolved)
    except ValueError as exc:
        return _fail("mismatch", str(exc))
    sizes = args.block_size or [drafter.config.block_size]
    too_big = [s for s in sizes if s > drafter.config.block_size]
    if too_big:
        return _fail(
            "bad_argument",
            f"block_size: {too_big[0]} is above the drafter's {drafter.config.block_size}",
        )
    target = load_target(args.target_model, device, dtype)
    try:
        ids = [conversation_prompt_ids(target.tokenizer, c) for c in prompts]
    except ValueError as exc:
        return _fail("bad_target", str(exc))
    print(f"eval: {len(ids)} prompts, up to {args.max_new_tokens} new tokens", file=sys.stderr)
    progress = EvalProgress(len(ids))
    try:
        summaries = evaluate_prompts(
            target, drafter, ids, args.max_new_tokens, stop_token_ids(target), sizes,
            on_prompt=progress.prompt_done,
        )  # fmt: skip
    except ValueError as exc:  # a target CachedTarget cannot drive (hybrid)
        return _fail("bad_target", str(exc))
    finally:
        progress.close()
    assert isinstance(summaries, list)
    first = summaries[0]
    fields = _figures(first)
    if len(summaries) > 1:
        fields["by_block_size"] = [_figures(s) for s in summaries]
    if heldout is not None:
        from dflash_train.commands.eval_run import record_manual_eval

        fields |= record_manual_eval(args, target, drafter, heldout, first, start)
    _reply(
        protocol.reply_ok(
            "eval",
            **fields,
            baseline_tokens_per_target_forward=round(first.baseline_tokens_per_target_forward, 4),
            baseline_generated_tokens=first.baseline_generated_tokens,
            lossless=all(s.lossless for s in summaries),
            prompts=first.prompts,
            max_new_tokens=args.max_new_tokens,
            greedy_seconds=round(first.baseline_seconds, 2),
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            seconds=round(time.monotonic() - start, 2),
        )
    )
    return 0


def _figures(summary: EvalSummary) -> dict[str, object]:
    """One block size's figures. speedup: speculative tokens a second over greedy's, both
    at batch 1, same target, same device (greedy's wall time over speculative's when the
    outputs are equal; bfloat16 near-ties can make them, and their lengths, differ)."""
    return {
        "tau": round(summary.tau, 4),
        "tokens_per_target_forward": round(summary.tokens_per_target_forward, 4),
        "block_size": summary.block_size,
        "blocks": summary.blocks,
        # [k - 1]: rounds that made k tokens (k - 1 drafts accepted, then the target's).
        "round_lengths": list(summary.round_lengths),
        "generated_tokens": summary.generated_tokens,
        "mismatched_prompts": list(summary.mismatches),
        "spec_seconds": round(summary.seconds, 2),
        "speedup": round(summary.speedup, 3),
        "lossless_at_size": summary.lossless,
        # Each mismatch's first differing token and greedy's top-2 logit gap there.
        "divergences": [
            {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(d).items()}
            for d in summary.divergences
        ],
    }
