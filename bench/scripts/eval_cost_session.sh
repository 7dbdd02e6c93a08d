#!/usr/bin/env bash
# Issue 26 on ONE H200: what the in-run held-out evaluation costs (bench/eval_cost.py): the
# GPU recipe (train's defaults: 5 drafter layers, 512 anchors, 16,384-token batches) on the
# real SmolLM2 target, target and drafter sharing cuda:0, 40 steps with --eval-every 0 and
# 40 with --eval-every 20 (16 held-out prompts x 128 tokens, the defaults), on data prepared
# there (600 builtin samples, its 40-prompt eval split held out). About 5-6 minutes.
# SmolLM2's GGUF travels as in bench/scripts/decode_session.sh (two 44 MB parts, the gguf
# wheel in .whl_decode/), so two calls on one warm machine:
#   carry .weights_decode/gguf/part-0 .weights_decode/gguf/layout.json .whl_decode .whl_prep:
#       bash bench/scripts/eval_cost_session.sh carry
#   carry .weights_decode/gguf/part-1:
#       OUT=$OUT bash bench/scripts/eval_cost_session.sh measure
# Result: $OUT/eval_cost_h200.json (copy to bench/results/eval_cost_h200_<date>/).
set -uo pipefail
OUT=${OUT:-/tmp/eval_cost_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_CACHE_DIR=${DFLASH_CACHE_DIR:-/tmp/dflash-cache}
export PYTHONPATH=/tmp/site:$PWD

stage_carry() {
  OUT="$OUT" bash bench/scripts/decode_session.sh carry
  # prepare writes with `datasets`, which the image lacks (bench/scripts/prepare_workers_h200.sh
  # says how .whl_prep is made); carry it with the first call.
  if [ -d .whl_prep ] && [ ! -f /tmp/site/.prep_installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl_prep/*.whl && touch /tmp/site/.prep_installed
  fi
}

stage_ready() {  # SmolLM2 joined from both parts and converted (prepare_console_h200.sh needs it)
  OUT="$OUT" bash bench/scripts/decode_session.sh ready || { echo "no target"; return 1; }
}

stage_measure() {
  stage_ready || return 1
  nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv >>"$OUT/log.txt"
  timeout -k 5 "${LIMIT:-520}" python3 bench/eval_cost.py --target-model smollm2 \
    --device cuda:0 --steps "${STEPS:-40}" --eval-every "${EVERY:-20}" \
    --out "$OUT/eval_cost_h200.json" 2>>"$OUT/log.txt" | tail -5
}

for stage in "$@"; do
  "stage_$stage"
done
