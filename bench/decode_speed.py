"""Where decoding time goes on the GPU, for the two decoders a quality run leans on:

- `prepare`'s batched generation (generate_rows): a whole batch's seconds, and the parts of
  one decode step timed alone (the captured target step, picking tokens, the bookkeeping);
- speculative decoding's round as eval runs it (one graph replay deciding on the device) and
  greedy's step likewise, each timed alone, beside the earlier loop's pieces (the verify
  step, the drafter's own round graph, a plain one-token step).

Weights do not change the timings, so a target built from a config (random weights) does:
    python3 bench/decode_speed.py --target-model /tmp/rand-smollm2 --device cuda:0
    python3 bench/decode_speed.py --target-model smollm2 --spec-only --spec-dtype float32 \
        --spec-dtype bfloat16 --drafter bench/results/quality_smollm2/export
Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, repeats: int, device: torch.device) -> float:
    """Milliseconds per call of fn, after one warm call."""
    fn()
    _sync(device)
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return round(1000 * (time.perf_counter() - started) / repeats, 3)


def generation(target, prompts: list[list[int]], batch: int, new_tokens: int) -> dict:
    from dflash_train.data.generation import generate_rows, pick_tokens
    from dflash_train.decode.cached_target import CachedTarget, GraphedStep

    runner = CachedTarget(target)
    device = runner.device
    rows = [prompts[i % len(prompts)] for i in range(batch)]
    started = time.perf_counter()
    out = generate_rows(runner, rows, max_new_tokens=new_tokens, stop_ids=[2])
    _sync(device)
    seconds = time.perf_counter() - started
    made = sum(map(len, out))
    width = max(map(len, rows))
    cache = runner.new_cache(batch, width + new_tokens, [width - len(r) for r in rows])
    if device.type != "cuda":  # a CPU dry run of the plumbing: no graph to time
        return {"batch": batch, "tokens": made, "seconds": round(seconds, 2)}
    graph = GraphedStep(runner, cache, 1, ())
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    step_ms = _timed(lambda: graph(ids, width + new_tokens // 2), 20, device)
    logits = graph(ids, width).logits[:, -1]
    temps = torch.zeros(batch, device=device)
    pick_ms = _timed(lambda: pick_tokens(logits, temps, None), 20, device)
    return {
        "batch": batch,
        "new_tokens": new_tokens,
        "prompt_width": width,
        "seconds": round(seconds, 2),
        "tokens": made,
        "tokens_per_s": round(made / seconds),
        "step_ms_graph": step_ms,
        "pick_tokens_ms": pick_ms,
        "row_steps_per_s_graph_only": round(batch / step_ms * 1000),
    }


def check_graph_path(target, prompts: list[list[int]]) -> dict:
    """Captured steps (made again as rows stop and answers pass the limit) against the same
    fixed-shape steps run uncaptured: the same kernels, so the same tokens. Every 50th token
    id stops a row, so rows finish at scattered steps and the batch shrinks."""
    from dflash_train.data.generation import generate_rows
    from dflash_train.decode.cached_target import CachedTarget

    runner = CachedTarget(target)
    rows = [prompts[i % len(prompts)] for i in range(256)]
    stops = list(range(2, target.vocab_size, 50))
    kwargs = {"max_new_tokens": 96, "stop_ids": stops, "limit_step": 32}
    graphed = generate_rows(runner, rows, graphs=True, **kwargs)
    static = generate_rows(runner, rows, static=True, **kwargs)
    lengths = sorted(map(len, graphed))
    return {
        "rows": len(rows),
        "equal_rows": sum(a == b for a, b in zip(graphed, static, strict=True)),
        "answer_length_min_median_max": [lengths[0], lengths[len(lengths) // 2], lengths[-1]],
    }


def profile_generation(target, prompts: list[list[int]], batch: int, new_tokens: int) -> str:
    """torch.profiler's table of one generate_rows call, by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    from dflash_train.data.generation import generate_rows
    from dflash_train.decode.cached_target import CachedTarget

    runner = CachedTarget(target)
    rows = [prompts[i % len(prompts)] for i in range(batch)]
    generate_rows(runner, rows, max_new_tokens=8, stop_ids=[2])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        generate_rows(runner, rows, max_new_tokens=new_tokens, stop_ids=[2])
        _sync(runner.device)
    table = prof.key_averages().table
    return table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)


def speculative_round(target, block: int, context: int, drafter_dir: str | None = None) -> dict:
    """One round's parts timed alone at `context` tokens, in the target's dtype: the
    device-deciding round and greedy step that eval runs (one graph replay and one read back
    each: device_round.py), and the earlier loop's pieces for comparison (the captured
    verify and one-token steps with their input copies and logit clones, the drafter's own
    graph). `drafter_dir`: an export (weights do not change the timings; default random)."""
    from dflash_train.checkpoint.export import load_any_drafter
    from dflash_train.decode.draft_cache import CachedDrafter
    from dflash_train.decode.speculative import Decoder, cached_drafter, with_block_size
    from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target

    torch.manual_seed(0)
    dtype = target.embed_tokens.weight.dtype
    if drafter_dir:
        drafter = load_any_drafter(drafter_dir, target.device, dtype).eval()
        drafter = with_block_size(drafter, block)
    else:
        config = drafter_config_for_target(target, num_layers=2, block_size=block)
        drafter = DFlashDrafter(config).to(target.device, dtype).eval()
    config = drafter.config
    static = target.device.type != "cuda"  # a CPU dry run of the plumbing
    decoder = Decoder(target, context + 64, config.target_layer_ids, (1, block), static=static)
    rounds = cached_drafter(decoder, drafter)
    features = len(config.target_layer_ids) * config.hidden_size
    head, embed = target.lm_head, target.embed_tokens
    old_drafter = CachedDrafter(drafter, head, embed, decoder.cache.capacity, features, True)
    device = decoder.device
    greedy = decoder.greedy
    with torch.inference_mode():
        prompt = torch.randint(0, 1000, (context,)).tolist()
        out = decoder.prefill(prompt)
        anchor = torch.tensor([5], device=device)
        rounds.begin(out.context[0], anchor, context)
        old_drafter.begin(out.context[0], anchor)
        ids = torch.randint(0, 1000, (1, block), device=device)
        one = ids[:, :1]

        def device_round() -> None:
            rounds.start.fill_(context)  # each replay moves on; stay at `context`
            rounds.replay()
            rounds.result.tolist()

        def device_greedy() -> None:
            greedy.start.fill_(context)
            greedy.replay()
            int(greedy.ids)

        round_ms = _timed(device_round, 100, device)
        greedy_ms = _timed(device_greedy, 100, device)
        verify_ms = _timed(lambda: decoder.step(ids, context), 50, device)
        step_ms = _timed(lambda: decoder.step(one, context), 50, device)
        feats = decoder.step(ids, context).context[0]
        draft_ms = _timed(
            lambda: old_drafter.round(feats, context, anchor, context + 3), 50, device
        )
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "block": block,
        "context": context,
        "drafter": drafter_dir or "random, 2 layers",
        "device_graphed": rounds.graph is not None and greedy.graph is not None,
        "device_round_ms": round_ms,
        "device_greedy_step_ms": greedy_ms,
        "round_over_greedy_step": round(round_ms / greedy_ms, 3),
        "earlier_loop_pieces": {
            "verify_ms": verify_ms,
            "draft_round_ms": draft_ms,
            "greedy_step_ms": step_ms,
            "target_graphed": bool(decoder.graphs),
            "drafter_graphed": old_drafter.graph is not None,
        },
    }


def main() -> None:
    from dflash_train.data.prompt_ids import chat_prompt_ids
    from dflash_train.data.prompts import load_prompts
    from dflash_train.targets.frozen_target import load_target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-model", required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--batch", type=int, action="append")
    parser.add_argument("--new-tokens", type=int, default=384)
    parser.add_argument("--check", action="store_true", help="captured == uncaptured steps")
    parser.add_argument("--profile", type=int, default=0, help="profile one batch of this size")
    parser.add_argument("--context", type=int, default=300, help="speculative: context length")
    parser.add_argument(
        "--spec-only",
        action="store_true",
        help="only the speculative round's parts, in each --spec-dtype (default float32)",
    )
    parser.add_argument("--spec-dtype", action="append", choices=("float32", "bfloat16"))
    parser.add_argument("--drafter", default=None, help="an export for the speculative round")
    args = parser.parse_args()
    if args.spec_only:
        rounds = []
        for dtype in args.spec_dtype or ["float32"]:
            target = load_target(args.target_model, args.device, getattr(torch, dtype))
            rounds.append(speculative_round(target, 16, args.context, args.drafter))
            print(json.dumps(rounds[-1]), flush=True)
        print(json.dumps({"speculative": rounds}))
        return
    target = load_target(args.target_model, args.device, torch.bfloat16)
    prompts = [chat_prompt_ids(target.tokenizer, p) for p in load_prompts("builtin")]
    if args.check:
        print(json.dumps({"graph_check": check_graph_path(target, prompts)}), flush=True)
    if args.profile:
        print(profile_generation(target, prompts, args.profile, 64), flush=True)
    result = {"generation": [], "speculative": []}
    for batch in args.batch or [1024, 2048]:
        result["generation"].append(generation(target, prompts, batch, args.new_tokens))
        print(json.dumps(result["generation"][-1]), flush=True)
    fp32 = load_target(args.target_model, args.device, torch.float32)
    for block in (16, 8):
        result["speculative"].append(speculative_round(fp32, block, args.context))
        print(json.dumps(result["speculative"][-1]), flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
