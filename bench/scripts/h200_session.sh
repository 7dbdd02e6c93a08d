#!/usr/bin/env bash
# One device session on an H200 box with 2 GPUs, in stages; pick those that fit one 10-minute
# call (runs ~5 min, bench ~6 min):
#   single  NVML telemetry; a real detached training run through the control plane (target on
#           GPU 0, drafter on GPU 1, a live `set`), run to the end.
#   ddp     a DDP run over NCCL with two drafter ranks (each GPU holds a target replica and a
#           drafter rank), restarted mid-run (SIGTERM, checkpoint, resume), run to the end.
#   bench8b bench/pipeline.py on random:qwen3-8b.
#   hybrid  bench/pipeline.py on the random:qwen3.5-27b hybrid, 4 x 2048-token batches (8 rows
#           do not fit beside a 1.8B drafter without activation checkpointing), with
#           flash-linear-attention when it runs there, else transformers' reference kernels.
#   runs = single ddp; bench = bench8b hybrid.
# Usage (repo root): OUT=/tmp/out bash bench/scripts/h200_session.sh STAGE...
# Everything lands in $OUT/session.tar.gz (status streams, JSON replies, logs, bench JSON).
# The GPU image lacks a few packages; carry them (ignored by git, rebuild them here first):
#   .whl/      python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
#              --implementation cp --platform manylinux_2_28_x86_64 -d .whl
#              datasets==5.2.0 dill multiprocess platformdirs
#   .whl_fla/  the same command with -d .whl_fla flash-linear-attention==0.6.0 fla-core==0.6.0
#   .devcarry/cache/models/smollm2-135m-instruct/  the tokenizer files and config.json of the
#              converted SmolLM2 (random: presets borrow its tokenizer; no weights needed)
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: h200_session.sh single|ddp|bench8b|hybrid|runs|bench ..."; exit 2; }
work=/tmp/h200_session
mkdir -p "$work"
trap 'tar -czf "$OUT/session.tar.gz" -C "$work" .' EXIT
exec > >(tee -a "$work/session.log") 2>&1
SECONDS=0
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DFLASH_CACHE_DIR="${DFLASH_CACHE_DIR:-$PWD/.devcarry/cache}"
export PYTHONPATH="$PWD"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD"
fi
py=python3
say() { echo "== [$SECONDS s] $*"; }
$py -c "import torch,pyarrow,transformers;print('torch',torch.__version__,'pyarrow',pyarrow.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count())" | tee "$work/env.txt"
nvidia-smi --query-gpu=index,name,power.limit,memory.total --format=csv | tee -a "$work/env.txt"

# launch passes an explicit environment: name what the trainer needs here.
envs=(--env "PYTHONPATH=$PYTHONPATH" --env "DFLASH_CACHE_DIR=$DFLASH_CACHE_DIR" --env NCCL_NVLS_ENABLE=0
      --env TORCH_SYMM_MEM_DISABLE_MULTICAST=1 --env NVSHMEM_DISABLE_NVLS=1 --env PYTHONUNBUFFERED=1)
field() { $py -c "import json,sys;print(json.load(sys.stdin).get('$1'))"; }

# Poll `status` until the run is no longer running or `limit` seconds pass; then stop it.
wait_done() {
  local run=$1 limit=$2 name=$3 start=$SECONDS state
  while [ $((SECONDS - start)) -lt "$limit" ]; do
    state=$($py -m dflash_train status "$run" | tee "$work/$name.status.json" | field state)
    [ "$state" = running ] || break
    sleep 5
  done
  say "$name: state $state after $((SECONDS - start)) s"
  [ "$state" = running ] && $py -m dflash_train stop "$run" | tee "$work/$name.stop.json"
  cp "$run/status.jsonl" "$work/$name.status.jsonl"
  cp "$run/run.json" "$work/$name.run.json" 2>/dev/null
  tail -n 60 "$run/train.log" > "$work/$name.train_log_tail.txt"
}

# Wait until the run's last step reaches `step` (or `limit` seconds pass).
wait_step() {
  local run=$1 step=$2 limit=$3 start=$SECONDS last
  while [ $((SECONDS - start)) -lt "$limit" ]; do
    read -r state last < <($py -m dflash_train status "$run" | $py -c "import json,sys;d=json.load(sys.stdin);print(d.get('state'),d.get('last_step'))")
    case $state in finished|crashed|not_started) break ;; esac  # do not wait out the limit
    [ "$last" != None ] && [ "$last" -ge "$step" ] && break
    sleep 3
  done
  say "reached step ${last:-?} after $((SECONDS - start)) s"
}

common=(--target-model random:qwen3-8b --data-dir /tmp/synth --draft-layers 2 --hs-queue-depth 8
        --hs-min-ready 2 --tokens-per-batch 16384 --num-anchors 512)
synthetic_data() {
  [ -d /tmp/synth ] && return
  say "synthetic data"; $py bench/fixtures/synthetic_dataset.py --out /tmp/synth --samples 3000 --min-len 512 --max-len 4096
}

stage_single() {
  say "gpus (NVML)"; $py -m dflash_train gpus | tee "$work/gpus.json"
  synthetic_data
  say "real run: launch, target GPU 0, drafter GPU 1"
  run=/tmp/run_single
  $py -m dflash_train launch "$run" --wait 240 "${envs[@]}" -- "${common[@]}" \
    --target-gpus 0 --drafter-gpus 1 --max-steps 45 --save-every 20 --log-every 5 | tee "$work/single.launch.json"
  wait_step "$run" 10 120
  $py -m dflash_train set "$run" hs_min_ready 4 | tee "$work/single.set.json"
  $py -m dflash_train gpus | tee "$work/single.gpus_during.json"
  wait_done "$run" 180 single
}

stage_ddp() {
  synthetic_data
  say "DDP run: 2 drafter ranks over NCCL, targets on GPUs 0 and 1"
  run=/tmp/run_ddp
  $py -m dflash_train launch "$run" --wait 240 "${envs[@]}" -- "${common[@]}" \
    --target-gpus 0,1 --drafter-gpus 0,1 --max-steps 40 --save-every 0 --log-every 2 | tee "$work/ddp.launch.json"
  wait_step "$run" 12 120
  say "restart (SIGTERM, checkpoint, resume)"
  $py -m dflash_train restart "$run" --wait 240 "${envs[@]}" | tee "$work/ddp.restart.json"
  wait_done "$run" 150 ddp
  ls -la "$run/checkpoints" > "$work/ddp.checkpoints.txt"
}

stage_bench8b() {
  say "pipeline bench random:qwen3-8b (target GPU 0, drafter GPU 1)"
  timeout 280 $py bench/pipeline.py --target random:qwen3-8b --target-gpus 0 --drafter-gpu 1 \
    --seconds "${BENCH_SECONDS:-25}" --deadline 220 --out "$work/pipeline_qwen3-8b.json"
}

stage_hybrid() {
  say "flash-linear-attention probe"
  fla_path=""
  if [ -d .whl_fla ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_fla .whl_fla/*.whl
    if PYTHONPATH="/tmp/site_fla:$PYTHONPATH" timeout 120 $py - <<'EOF'
import torch
from transformers.utils.import_utils import is_flash_linear_attention_available
from dflash_train.targets.presets import RANDOM_PRESETS, build_random_model
assert is_flash_linear_attention_available(), "transformers does not see fla"
model = build_random_model(RANDOM_PRESETS["tiny-hybrid"], torch.device("cuda"), torch.bfloat16)
with torch.inference_mode():
    out = model(input_ids=torch.randint(0, 1000, (2, 512), device="cuda"))
assert torch.isfinite(out.logits).all()
print("fla runs")
EOF
    then fla_path="/tmp/site_fla:"; fi
  fi
  say "pipeline bench random:qwen3.5-27b hybrid (fla: ${fla_path:+yes})"
  PYTHONPATH="$fla_path$PYTHONPATH" timeout 300 $py bench/pipeline.py --target random:qwen3.5-27b \
    --target-gpus 0 --drafter-gpu 1 --rows 4 --seconds "${BENCH_SECONDS:-25}" --deadline 230 \
    --out "$work/pipeline_qwen3.5-27b.json"
}

for stage in "$@"; do
  case $stage in
    runs) stage_single; stage_ddp ;;
    bench) stage_bench8b; stage_hybrid ;;
    single|ddp|bench8b|hybrid) "stage_$stage" ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
say "done: $*"
