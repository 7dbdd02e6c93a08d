#!/usr/bin/env bash
# One H200 call (about 5.5 minutes) for issue 29: bench/prepare_workers.py's tokens/s of one
# prepare worker against two sharing the GPU, and the host-RAM peak of two replicas
# loading at once (the old host copy + .to(device) against load_target's direct load).
#
# What to carry (both are git-ignored through .git/info/exclude; make them here first):
#   .whl_prep   datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19 (the image lacks them):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d .whl_prep datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
#   .bench_tok  SmolLM2's tokenizer (a random target's), laid out as DFLASH_CACHE_DIR wants it:
#     mkdir -p .bench_tok/models/smollm2-135m-instruct && cp \
#       ~/.cache/dflash/models/smollm2-135m-instruct/{chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} \
#       .bench_tok/models/smollm2-135m-instruct/
# The call (carry [".whl_prep", ".bench_tok"], timeout_s 420):
#   bash bench/scripts/prepare_workers_h200.sh
# Results: $OUT/prepare_workers.json (and its log); copy them to
# bench/results/prepare_workers_h200_<date>/.
set -uo pipefail
OUT=${OUT:-/tmp/prepare_workers_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl_prep/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_CACHE_DIR=$PWD/.bench_tok
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt"
timeout -k 10 400 python3 bench/prepare_workers.py --out "$OUT/prepare_workers.json" \
  --seconds "${SECONDS_EACH:-75}" 2>&1 | tail -c 200000 >"$OUT/prepare_workers.log"
tail -c 3000 "$OUT/prepare_workers.log"
