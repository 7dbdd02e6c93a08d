#!/usr/bin/env bash
# Issue 29's "done when" on ONE H200: a prepare of the real SmolLM2 target launched through
# the control plane (`dflash-train launch RUN --prepare -- ...`), watched by the real console
# on the same machine (`dflash-tui --run-dir RUN --watch`: in tmux when the machine has it,
# else bench/console_snapshots.py's headless SVGs), then `status`; the prepare stops itself
# after PREP_S seconds (--max-seconds, default 450). About 8.5 minutes.
# It needs SmolLM2 converted under $DFLASH_CACHE_DIR and `datasets` in /tmp/site: run right
# after bench/scripts/eval_cost_session.sh's two calls on the same warm machine (its carry
# stage installed .whl_prep), or on a fresh one after its `carry` call, with `ready` first:
#   carry .weights_decode/gguf/part-1 .whl_tui:
#     OUT=$OUT bash bench/scripts/eval_cost_session.sh ready && OUT=$OUT bash THIS The console's wheels travel in .whl_tui (pip download --no-deps
# of textual, rich, markdown-it-py, mdit-py-plugins, mdurl, linkify-it-py, uc-micro-py,
# platformdirs, plotext, pygments, textual-plotext, tomlkit, nvidia-ml-py, at the versions of
# the venv here):
#   carry .whl_tui, timeout_s 600:  OUT=$OUT bash bench/scripts/prepare_console_h200.sh
# Results under $OUT: launch.json, status.json, screens (tmux text or SVG), prepare.json,
# status.jsonl, train.log, gpu.txt. Copy to bench/results/prepare_launch_h200_<date>/.
set -uo pipefail
OUT=${OUT:-/tmp/prepare_console_out}
mkdir -p "$OUT/screens"
SECONDS=0
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_CACHE_DIR=${DFLASH_CACHE_DIR:-/tmp/dflash-cache}
export PYTHONPATH=/tmp/site:$PWD
log() { echo "[$SECONDS s] $*" | tee -a "$OUT/log.txt" >&2; }
if [ -d .whl_tui ] && [ ! -f /tmp/site/.tui_installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl_tui/*.whl && touch /tmp/site/.tui_installed
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt"
RUN=/tmp/prepare_console_run
DATA=/tmp/prepare_console_data
rm -rf "$RUN" "$DATA"
# launch gives the trainer PATH, HOME and LANG only: what else it needs is named.
python3 -m dflash_train launch "$RUN" --env "PYTHONPATH=$PYTHONPATH" \
  --env "DFLASH_CACHE_DIR=$DFLASH_CACHE_DIR" --env TOKENIZERS_PARALLELISM=false \
  --prepare -- --target-model smollm2 \
  --prompts 'builtin*400' --out "$DATA" --devices "${DEVICES:-0}" --max-seconds "${PREP_S:-450}" \
  >"$OUT/launch.json" 2>>"$OUT/log.txt"
log "launch: $(head -c 600 "$OUT/launch.json")"
console=(--run-dir "$RUN" --python python3 --watch)
if command -v tmux >/dev/null; then
  log "console in tmux"
  tmux new -d -s watch -x 160 -y 48 \
    "env PYTHONPATH=$PYTHONPATH python3 -m dflash_tui.entry ${console[*]}"
  shot=0
  while python3 -m dflash_train status "$RUN" | grep -q '"state": "running"'; do
    tmux capture-pane -p -t watch >"$OUT/screens/screen_$(printf %03d $shot)_${SECONDS}s.txt"
    shot=$((shot + 1))
    [ "$SECONDS" -gt $((${PREP_S:-450} + 60)) ] && break
    sleep 45
  done
  sleep 5
  tmux capture-pane -p -t watch >"$OUT/screens/screen_end_${SECONDS}s.txt"
  tmux kill-server
else
  log "no tmux: headless console snapshots"
  python3 bench/console_snapshots.py --out "$OUT/screens" --every 60 \
    --seconds $((${PREP_S:-450} + 60)) -- "${console[@]}" >>"$OUT/log.txt" 2>&1
fi
python3 -m dflash_train status "$RUN" >"$OUT/status.json" 2>>"$OUT/log.txt"
if grep -q '"state": "running"' "$OUT/status.json"; then  # past the watch: stop it, keep its chunks
  python3 -m dflash_train stop "$RUN" >"$OUT/stop.json" 2>>"$OUT/log.txt"
fi
cp "$DATA/prepare.json" "$OUT/" 2>/dev/null
cp "$RUN/status.jsonl" "$RUN/train.log" "$OUT/" 2>/dev/null
log "done: $(ls "$DATA" 2>/dev/null | head -20 | xargs)"
tail -c 1500 "$OUT/status.json"
