"""`--target-dtype fp8` against bf16 on the real SmolLM2 target (issue 28, goal 2): the
cosine of every extracted context layer per token, and the teacher-forced tau of a
committed drafter on either target's hidden states, over the built-in eval prompts with the
bf16 target's own greedy answers (the same token rows for both).

    python bench/fp8_fidelity.py --device cuda --drafter bench/results/quality_smollm2/export \
        --out /tmp/fp8_fidelity.json

On a CUDA GPU of compute capability 8.9+ this is the path `train --target-dtype fp8` runs.
`--device cpu --allow-cpu-fp8` runs torchao's same quantisation with its hardware check
lifted, its matmuls then on torch's CPU `_scaled_mm` (rowwise float8, float32 accumulation):
the quantisation error is the same, the accumulation is not the GPU's (say which ran)."""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def answer_rows(target, prompts: int, new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """Prompt + the target's greedy answer (up to its first stop token) as (ids, loss mask
    over the answer). All prompts in one left-padded batch, by a float32 copy of the target
    (batched greedy decoding is what makes this affordable on a CPU)."""
    from dflash_train.data.prompt_ids import chat_prompt_ids, stop_token_ids
    from dflash_train.data.prompts import load_prompts

    stops = sorted(set(stop_token_ids(target)))
    prompt_ids = [chat_prompt_ids(target.tokenizer, t) for t in load_prompts("builtin", "eval")]
    prompt_ids = prompt_ids[:prompts]
    width = max(map(len, prompt_ids))
    ids = torch.full((len(prompt_ids), width), stops[0], dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompt_ids):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    model = copy.deepcopy(target.model).float() if target.device.type == "cpu" else target.model
    with torch.inference_mode():
        out = model.generate(
            ids.to(target.device), attention_mask=mask.to(target.device),
            max_new_tokens=new_tokens, do_sample=False, eos_token_id=stops,
            pad_token_id=stops[0],
        )[:, width:].tolist()  # fmt: skip
    rows = []
    for p, answer in zip(prompt_ids, out, strict=True):
        end = next((i + 1 for i, t in enumerate(answer) if t in stops), len(answer))
        rows.append((p + answer[:end], [0] * len(p) + [1] * end))
    return rows


def layer_cosines(base, fp8, rows, layer_ids: list[int]) -> dict[str, float]:
    """Mean (and least) per-token cosine of each context layer, over every token of the rows."""
    from dflash_train.targets.frozen_target import extract_context

    sums = torch.zeros(len(layer_ids), dtype=torch.float64)
    least = torch.ones(len(layer_ids), dtype=torch.float64)
    tokens = 0
    for ids, _ in rows:
        seq = torch.tensor([ids], device=base.device)
        a = extract_context(base, seq, None, layer_ids).float()
        b = extract_context(fp8, seq, None, layer_ids).float()
        for i, (x, y) in enumerate(
            zip(a.chunk(len(layer_ids), -1), b.chunk(len(layer_ids), -1), strict=True)
        ):
            cos = torch.nn.functional.cosine_similarity(x, y, dim=-1).double()[0]
            sums[i] += cos.sum().cpu()
            least[i] = min(least[i], cos.min().cpu())
        tokens += len(ids)
    return {
        "tokens": tokens,
        "mean": {str(j): round(float(s / tokens), 5) for j, s in zip(layer_ids, sums, strict=True)},
        "min": {str(j): round(float(m), 4) for j, m in zip(layer_ids, least, strict=True)},
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--allow-cpu-fp8", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from dflash_train.checkpoint.export import load_any_drafter
    from dflash_train.decode.heldout_figures import teacher_forced
    from dflash_train.targets.fp8 import quantise_target_fp8
    from dflash_train.targets.frozen_target import Target, load_target

    device = torch.device(args.device)
    if device.type == "cpu" and args.allow_cpu_fp8:
        import torchao.quantization.quant_api as quant_api

        from dflash_train.targets import fp8 as fp8_module

        quant_api._check_hardware_support = lambda *_: None
        fp8_module.fp8_refusal = lambda _device: None
    started = time.monotonic()
    base = load_target("smollm2", device, torch.bfloat16)
    drafter = load_any_drafter(args.drafter, device, torch.bfloat16).eval()
    layer_ids = list(drafter.config.target_layer_ids)
    model = copy.deepcopy(base.model)
    fp8 = Target(
        base.spec, model, base.tokenizer, base.num_layers, base.hidden_size, base.vocab_size,
        model.get_input_embeddings(), model.get_output_embeddings(),
    )  # fmt: skip
    converted = quantise_target_fp8(fp8)
    log(f"fp8: {converted} linears converted; generating {args.prompts} answers")
    rows = answer_rows(base, args.prompts, args.new_tokens)
    log(f"{len(rows)} rows, {sum(map(sum, (m for _, m in rows)))} answer tokens")
    cosines = layer_cosines(base, fp8, rows, layer_ids)
    log(f"cosines: {json.dumps(cosines)}")
    max_length = max(len(ids) for ids, _ in rows)
    acc_bf16, tau_bf16 = teacher_forced(base, drafter, rows, max_length)
    acc_fp8, tau_fp8 = teacher_forced(fp8, drafter, rows, max_length)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "fp8_matmuls": "torch._scaled_mm on "
        + ("CUDA" if device.type == "cuda" else "the CPU (torchao's hardware check lifted)"),
        "torch": torch.__version__,
        "target": "smollm2 (SmolLM2-135M-Instruct, the GGUF dequantised), bf16 vs fp8",
        "drafter": str(args.drafter),
        "fp8_linears": converted,
        "rows": len(rows),
        "answer_tokens": sum(sum(m) for _, m in rows),
        "context_layers": layer_ids,
        "cosine_per_token": cosines,
        "cosine_mean_all_layers": round(sum(cosines["mean"].values()) / len(layer_ids), 5),
        "tau_tf_bf16": round(tau_bf16, 4) if tau_bf16 is not None else None,
        "tau_tf_fp8": round(tau_fp8, 4) if tau_fp8 is not None else None,
        "tau_tf_change": round(tau_fp8 / tau_bf16 - 1, 4) if tau_bf16 and tau_fp8 else None,
        "slot_acc_bf16": [round(a, 4) for a in acc_bf16],
        "slot_acc_fp8": [round(a, 4) for a in acc_fp8],
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("cosine_mean_all_layers", "tau_tf_bf16",
                                             "tau_tf_fp8", "tau_tf_change")}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
