#!/usr/bin/env bash
# One device session on an H200 box (2 GPUs): NVML telemetry, a real detached training run
# through the control plane on GPUs, and the pipeline benchmark. Writes results to $OUT.
# Usage (repo root): OUT=/tmp/out bash bench/h200_session.sh [quick]
# The GPU image lacks two things; carry them (both ignored by git, rebuild them here first):
#   .whl/      python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
#              --implementation cp --platform manylinux_2_28_x86_64 -d .whl
#              datasets==5.2.0 dill multiprocess platformdirs
#   .devcarry/cache/models/smollm2-135m-instruct/  the tokenizer files and config.json of the
#              converted SmolLM2 (random: presets borrow its tokenizer; no weights needed)
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DFLASH_CACHE_DIR="${DFLASH_CACHE_DIR:-$PWD/.devcarry/cache}"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
py=python3
$py -c "import torch,pyarrow,transformers;print('torch',torch.__version__,'pyarrow',pyarrow.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count())" | tee "$OUT/env.txt"
nvidia-smi --query-gpu=index,name,power.limit,memory.total --format=csv | tee -a "$OUT/env.txt"

echo "== gpus (NVML)"; $py -m dflash_train gpus | tee "$OUT/gpus.json"

echo "== synthetic data"; $py bench/synthetic_dataset.py --out /tmp/synth --samples 3000 --min-len 512 --max-len 4096

echo "== real run: launch on GPUs (target 0, drafter 1)"
run=/tmp/run_gpu
# launch passes an explicit environment: name what the trainer needs here.
envs=(--env "PYTHONPATH=${PYTHONPATH:-}" --env "DFLASH_CACHE_DIR=$DFLASH_CACHE_DIR" --env NCCL_NVLS_ENABLE=0
      --env TORCH_SYMM_MEM_DISABLE_MULTICAST=1 --env NVSHMEM_DISABLE_NVLS=1)
$py -m dflash_train launch "$run" --wait 300 "${envs[@]}" -- --target-model random:qwen3-8b --data-dir /tmp/synth \
  --target-gpus 0 --drafter-gpus 1 --max-steps "${STEPS:-150}" --hs-queue-depth 8 --hs-min-ready 2 \
  --tokens-per-batch 16384 --num-anchors 512 --save-every 100 --log-every 5 | tee "$OUT/launch.json"
sleep 20
$py -m dflash_train set "$run" hs_min_ready 4 | tee "$OUT/set.json"
for _ in $(seq 1 60); do
  state=$($py -m dflash_train status "$run" | tee "$OUT/status.json" | $py -c "import json,sys;print(json.load(sys.stdin)['state'])")
  [ "$state" = running ] || break; sleep 5
done
cp "$run/status.jsonl" "$OUT/run_status.jsonl"; tail -n 40 "$run/train.log" > "$OUT/train_log_tail.txt"
[ "${1:-}" = quick ] && exit 0

echo "== pipeline bench qwen3-8b (1 target + 1 drafter)"
timeout "${BENCH_TIMEOUT:-360}" $py bench/pipeline.py --target random:qwen3-8b --target-gpus 0 --drafter-gpu 1 --seconds "${BENCH_SECONDS:-20}" \
  --out "$OUT/pipeline_qwen3-8b.json" 2>&1 | tee "$OUT/pipeline_qwen3-8b.log"
