#!/usr/bin/env bash
# The issue-14 session on ONE H200 (target and drafter share it), in stages:
#   suite   bench/pipeline.py --suite speed (every figure of docs/performance.md's speed table)
#   launch  a real `dflash-train launch` (random:qwen3-8b, 2-layer drafter, the new paths:
#           flex attention, fused CE, compiled target) for a few hundred steps
#   flexshapes  bench/flex_shapes.py: the flex warm-up's graphs and seconds, later plan
#           shapes' graphs (0 wanted) and ms, dynamic against static (~1-2 min)
# Usage (repo root): OUT=/tmp/out bash bench/scripts/h200_speed_session.sh launch suite
# Carry (ignored by git, made as bench/scripts/h200_session.sh says): .whl/ (datasets==5.2.0 dill
# multiprocess platformdirs), .whl_fla/ (flash-linear-attention==0.6.0 fla-core==0.6.0),
# .devcarry/cache/models/smollm2-135m-instruct/ (tokenizer files and config.json only).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export DFLASH_CACHE_DIR="$PWD/.devcarry/cache"
SECONDS=0
say() { echo "== [$SECONDS s] $*"; }
if [ ! -d /tmp/site_i14 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_i14 \
    .whl/*.whl .whl_fla/*.whl || exit 1
fi
export PYTHONPATH="/tmp/site_i14:$PWD:$PWD/bench"
py=python3

stage_suite() {
  say "speed suite"
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
  timeout "${SUITE_TIMEOUT:-440}" $py bench/pipeline.py --suite speed --deadline "${SUITE_DEADLINE:-360}" \
    --steps 6 --target-calls 8 --seconds 5 --rounds 2 --cases "${SUITE_CASES:-}" \
    --out "$OUT/speed_h200.json" 2>&1 | tee "$OUT/speed_h200.log"
}

stage_flexshapes() {
  say "flex attention over the plan's shapes"
  timeout "${FLEX_TIMEOUT:-300}" $py bench/flex_shapes.py --out "$OUT/flex_shapes_h200.json" \
    2>&1 | tee "$OUT/flex_shapes_h200.log"
}

stage_launch() {
  say "synthetic data"
  $py bench/fixtures/synthetic_dataset.py --out /tmp/synth --samples 1200 --min-len 1024 --max-len 2048
  run=/tmp/run_speed
  say "launch"
  $py -m dflash_train launch "$run" --wait 150 --env "PYTHONPATH=$PYTHONPATH" \
    --env "DFLASH_CACHE_DIR=$DFLASH_CACHE_DIR" --env PYTHONUNBUFFERED=1 \
    --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- \
    --target-model random:qwen3-8b --data-dir /tmp/synth --draft-layers 2 --num-anchors 512 \
    --tokens-per-batch 8192 --num-buckets 4 --max-length 2048 --target-gpus 0 --drafter-gpus 0 \
    --max-steps "${LAUNCH_STEPS:-200}" --save-every 100 --log-every 5 | tee "$OUT/launch.reply.json"
  local start=$SECONDS state=running
  while [ $((SECONDS - start)) -lt "${LAUNCH_LIMIT:-240}" ]; do
    state=$($py -m dflash_train status "$run" | $py -c "import json,sys;print(json.load(sys.stdin).get('state'))")
    [ "$state" = running ] || break
    sleep 5
  done
  say "run state $state"
  [ "$state" = running ] && $py -m dflash_train stop "$run" | tee "$OUT/launch.stop.json"
  cp "$run/status.jsonl" "$OUT/launch.status.jsonl"
  tail -n 80 "$run/train.log" > "$OUT/launch.train_log_tail.txt"
}

for stage in "$@"; do "stage_$stage"; done
say "done: $*"
