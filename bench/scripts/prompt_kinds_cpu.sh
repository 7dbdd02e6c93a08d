#!/usr/bin/env bash
# Is held-out tau held down by the kind of prompt? The committed quality export decoded on
# three sets of 10 prompts it never trained on, 128 new tokens each, fp32, on a CPU:
# the built-in eval split (the issue's measure), prompts synthesized like run 4's
# `synth:N@builtin` and like its free `synth:N`, both with a seed run 4 did not use (777,
# run 4's was 0), through `prepare --heldout` so they are kept apart as any held-out set.
# About 10 minutes on 2 cores. Results: $OUT (default bench/results/quality_smollm2/
# prompt_kinds_cpu_<date>).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-bench/results/quality_smollm2/prompt_kinds_cpu_$(date +%F)}
WORK=${WORK:-/tmp/prompt_kinds}
DT=(.venv/bin/python -m dflash_train)
mkdir -p "$OUT" "$WORK"
for kind in openers free; do
  spec=synth:14@builtin
  [ "$kind" = free ] && spec=synth:14
  "${DT[@]}" prepare --target-model smollm2 --prompts "$spec" --heldout 10 --seed 777 \
    --max-new-tokens 16 --device cpu --out "$WORK/$kind" --overwrite >"$WORK/prepare_$kind.log" 2>&1
  python3 -c 'import json, sys
for line in open(sys.argv[1]):
    print(json.dumps(json.loads(line)["messages"][0]["content"]))' \
    "$WORK/$kind/heldout.jsonl" >"$OUT/prompts_$kind.jsonl"
done
for kind in builtin openers free; do
  prompts=builtin
  [ "$kind" = builtin ] || prompts=$WORK/$kind/heldout.jsonl
  "${DT[@]}" eval --target-model smollm2 --drafter bench/results/quality_smollm2/export \
    --prompts "$prompts" --max-prompts 10 --max-new-tokens 128 --device cpu \
    >"$OUT/eval_$kind.json" 2>"$WORK/eval_$kind.log"
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(sys.argv[2], r["tau"], r["lossless"], r["blocks"], r["generated_tokens"])' \
    "$OUT/eval_$kind.json" "$kind"
done
