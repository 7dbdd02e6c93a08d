"""The in-run evaluation's speculative decoding, one prompt after the other (what it did
before batch_decode.py) against all prompts in one batch (what it does now), on a
SmolLM2-135M-shaped target and a GPU-recipe drafter (5 layers, block 16), both with random
weights: timings do not depend on the weights, and a random drafter is the worst case (one
token a round, as an untrained run's first evaluations). No stop token, so every prompt
decodes all its tokens. Both decoders run their CUDA graphs; the batch-1 one is timed as
evaluate_prompts times it (after an untimed warm prompt), the batched one twice (the first
call includes nothing the second lacks: its captures happen when it is made, timed apart).

    python3 bench/batch_eval_speed.py --device cuda:0 --out result.json

Prints and writes one JSON object."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

# SmolLM2-135M-Instruct's config.json (the fields that shape the model).
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}


def random_target(device: torch.device, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    from dflash_train.targets.frozen_target import Target

    fields = {k: v for k, v in SMOLLM2.items() if k not in ("architectures", "model_type")}
    config = AutoConfig.for_model("llama", **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval().requires_grad_(False)
    embed = model.get_input_embeddings()
    return Target(
        spec="random-smollm2", model=model, tokenizer=None, num_layers=30, hidden_size=576,
        vocab_size=49152, embed_tokens=embed, lm_head=model.get_output_embeddings(),
    )  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--drafter-layers", type=int, default=5)
    parser.add_argument("--skip-batch-one", action="store_true")
    parser.add_argument(
        "--tf-rows", type=int, default=0,
        help="also time the teacher-forced pass over this many held-out rows (prompt 40-200"
        " tokens, answer 256, as prepare's defaults make them): a row at a time, then batched",
    )  # fmt: skip
    parser.add_argument(
        "--tf-query-tokens", type=lambda v: [int(q) for q in v.split(",")],
        default=[1024, 4096, 8192, 16384], help="drafter queries a pass, each timed",
    )  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from dflash_train.decode.batch_decode import BatchSpeculator, capacity_for
    from dflash_train.decode.speculative import (
        Decoder,
        cached_drafter,
        speculative_decode,
        with_block_size,
    )
    from dflash_train.model.drafter import DFlashDrafter, drafter_config_for_target
    from dflash_train.model.mask_token import MaskChoice

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    result: dict = {"device": str(device), "dtype": args.dtype, "prompts": args.prompts,
                    "tokens": args.tokens, "rows": args.rows}  # fmt: skip
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)

    def emit() -> None:
        text = json.dumps(result, indent=1)
        if args.out is not None:
            args.out.write_text(text + "\n")

    began = time.perf_counter()
    target = random_target(device, dtype)
    config = drafter_config_for_target(
        target, num_layers=args.drafter_layers,
        mask=MaskChoice("learned", None, "random weights: no tokenizer"),
    )  # fmt: skip
    torch.manual_seed(1)
    drafter = DFlashDrafter(config).to(device, dtype).eval()
    rng = random.Random(2)
    prompts = [
        [rng.randrange(3, 49152) for _ in range(rng.randrange(40, 200))]
        for _ in range(args.prompts)
    ]
    result["build_s"] = round(time.perf_counter() - began, 2)
    size = config.block_size
    capacity = capacity_for(prompts, args.tokens, size)

    if not args.skip_batch_one:
        began = time.perf_counter()
        decoder = Decoder(target, capacity, config.target_layer_ids)
        view = with_block_size(drafter, None)
        rounds = cached_drafter(decoder, view)
        result["batch1_setup_s"] = round(time.perf_counter() - began, 2)
        speculative_decode(decoder, view, prompts[0], 2 * size, [], rounds)  # warm, untimed
        _sync(device)
        began = time.perf_counter()
        alone = [speculative_decode(decoder, view, p, args.tokens, [], rounds) for p in prompts]
        _sync(device)
        seconds = time.perf_counter() - began
        blocks = sum(len(g.block_lengths) for g in alone)
        result["batch1"] = {
            "seconds": round(seconds, 3), "rounds": blocks,
            "ms_per_round": round(1000 * seconds / blocks, 3),
            "tau": round(sum(len(g.tokens) for g in alone) / blocks, 4),
        }  # fmt: skip
        emit()
        print(json.dumps(result), flush=True)
        del decoder, rounds

    began = time.perf_counter()
    speculator = BatchSpeculator(target, drafter, args.rows, capacity)
    _sync(device)
    result["batched_setup_s"] = round(time.perf_counter() - began, 2)
    result["batched_graph"] = speculator.rounds.graph is not None
    timings = []
    for _ in range(2):
        began = time.perf_counter()
        batched = speculator.decode(prompts, args.tokens, [])
        timings.append(round(time.perf_counter() - began, 3))
    rounds_run = max(len(g.block_lengths) for g in batched)
    result["batched"] = {
        "seconds": timings, "rounds": rounds_run,
        "ms_per_round": round(1000 * timings[-1] / rounds_run, 3),
        "tau": round(
            sum(len(g.tokens) for g in batched) / sum(len(g.block_lengths) for g in batched), 4
        ),
    }  # fmt: skip
    if "batch1" in result:
        result["same_tokens"] = sum(
            a.tokens == b.tokens for a, b in zip(alone, batched, strict=True)
        )
        result["speedup"] = round(result["batch1"]["seconds"] / timings[-1], 2)
    if args.tf_rows:
        from dflash_train.decode.heldout_figures import teacher_forced

        rows = []
        for prompt in prompts * (args.tf_rows // len(prompts) + 1):
            answer = [rng.randrange(3, 49152) for _ in range(256)]
            rows.append((prompt + answer, [0] * len(prompt) + [1] * len(answer)))
        rows = rows[: args.tf_rows]

        def timed(**budgets: int) -> list[float]:
            timings = []
            for _ in range(2):
                began = time.perf_counter()
                teacher_forced(target, drafter, rows, 2048, **budgets)
                _sync(device)
                timings.append(round(time.perf_counter() - began, 3))
            return timings

        # The pass as it was (a row at a time, all its anchors at once), then batched rows
        # at each queries-a-pass budget.
        result["teacher_forced"] = {
            "rows": len(rows),
            "one_row_at_a_time_s": timed(row_tokens=1, query_tokens=10**9),
            "batched_s": {q: timed(query_tokens=q) for q in args.tf_query_tokens},
        }
    if device.type == "cuda":
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    emit()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
