#!/usr/bin/env bash
# Issue 29's "done when" on ONE H200: a 10-minute prepare of the real SmolLM2 target launched
# through the control plane (`dflash-train launch RUN --prepare -- ...`), watched by the real
# console on the same machine (`dflash-tui --run-dir RUN --watch`: in tmux when the machine has
# it, else bench/console_snapshots.py's headless SVGs), then `status`. The prepare stops itself
# after PREP_S seconds (--max-seconds, default 600) or when its prompts are answered
# (builtin*800: 224,000 answers, ~10 minutes at the 69,000 answer tokens/s of 2026-12-05).
#
# A call may run 10 minutes, setup included, so the watch spans two calls on one warm machine:
#   start   launch the prepare and the console in tmux, and a capture loop (every SHOT_S, 45 s)
#           in its own session, so both outlive the call; watch until WATCH_S (480 s)
#   finish  wait for the prepare's end (FINISH_S, 420 s at most), the last screen, `status`
#           (and `stop` if it still runs), then everything under $OUT
# Both stages in one call (`start finish`) suit a short PREP_S (a CPU smoke run:
# DEVICES=cpu PREP_S=40 WATCH_S=20 PROMPTS=builtin).
#
# It needs SmolLM2 converted under $DFLASH_CACHE_DIR and `datasets` in /tmp/site: run right
# after bench/scripts/eval_cost_session.sh's two calls on the same warm machine (its carry
# stage installed .whl_prep), or on a fresh one after its `carry` call, with `ready` first.
# The console's wheels travel in .whl_tui (bench/scripts/make_carry.sh makes it):
#   carry .whl_tui, timeout_s 600:  OUT=$OUT bash bench/scripts/prepare_console_h200.sh start
#   no carry, timeout_s 480:        OUT=$OUT bash bench/scripts/prepare_console_h200.sh finish
# Results under $OUT (at most 8 files come back from a call, so the screens are one file):
# screens.txt (every capture, each under a "=== screen at N s" line), launch.json,
# status.json, prepare.json, status.jsonl, train.log, log.txt (with the GPU's name), and
# stop.json when the watch outlasted it. Copy to bench/results/prepare_launch_h200_<date>/.
# launch gives the trainer PATH, HOME and LANG only: what else it needs is named.
set -uo pipefail
OUT=${OUT:-/tmp/prepare_console_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_CACHE_DIR=${DFLASH_CACHE_DIR:-/tmp/dflash-cache}
export PYTHONPATH=/tmp/site:$PWD
RUN=/tmp/prepare_console_run
DATA=/tmp/prepare_console_data
STATE=/tmp/prepare_console_state  # outlives a call: the launch time, the screens
PREP_S=${PREP_S:-600}
log() { echo "[$(($(date +%s) - $(cat "$STATE/t0" 2>/dev/null || date +%s))) s] $*" \
  | tee -a "$STATE/log.txt" >&2; }
running() { python3 -m dflash_train status "$RUN" 2>/dev/null | grep -q '"state": "running"'; }

stage_start() {
  if [ -d .whl_tui ] && [ ! -f /tmp/site/.tui_installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl_tui/*.whl && touch /tmp/site/.tui_installed
  fi
  rm -rf "$RUN" "$DATA" "$STATE"
  mkdir -p "$STATE"
  date +%s >"$STATE/t0"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    >>"$STATE/log.txt" 2>&1
  python3 -m dflash_train launch "$RUN" --env "PYTHONPATH=$PYTHONPATH" \
    --env "DFLASH_CACHE_DIR=$DFLASH_CACHE_DIR" --env TOKENIZERS_PARALLELISM=false \
    --prepare -- --target-model smollm2 --prompts "${PROMPTS:-builtin*800}" --out "$DATA" \
    --devices "${DEVICES:-0}" --max-seconds "$PREP_S" \
    >"$STATE/launch.json" 2>>"$STATE/log.txt"
  log "launch: $(head -c 600 "$STATE/launch.json")"
  local console=(--run-dir "$RUN" --python python3 --watch)
  if command -v tmux >/dev/null; then
    log "console in tmux"
    tmux new -d -s watch -x 160 -y 48 \
      "env PYTHONPATH=$PYTHONPATH python3 -m dflash_tui.entry ${console[*]}"
    # Its own session, so the loop outlives this call; the first capture after the console's
    # first frame (a capture at once showed a blank pane on 2026-12-05).
    setsid nohup bash -c "
      t0=\$(cat '$STATE/t0'); sleep 15
      while tmux has-session -t watch 2>/dev/null; do
        { echo \"=== screen at \$((\$(date +%s) - t0)) s\"; tmux capture-pane -p -t watch; } \
          >>'$STATE/screens.txt'
        sleep ${SHOT_S:-45}
      done" >/dev/null 2>&1 &
  else
    log "no tmux: headless console snapshots"
    mkdir -p "$STATE/screens"
    setsid nohup python3 bench/console_snapshots.py --out "$STATE/screens" --every 60 \
      --seconds $((PREP_S + 60)) -- "${console[@]}" >>"$STATE/log.txt" 2>&1 &
  fi
  local until=$(($(date +%s) + ${WATCH_S:-480}))
  while running && [ "$(date +%s)" -lt "$until" ]; do sleep 10; done
  log "start: watched until here; the prepare is $(running && echo running || echo over)"
}

stage_finish() {
  local until=$(($(date +%s) + ${FINISH_S:-420}))
  while running && [ "$(date +%s)" -lt "$until" ]; do sleep 10; done
  sleep 5
  if tmux has-session -t watch 2>/dev/null; then
    { echo "=== screen at $(($(date +%s) - $(cat "$STATE/t0"))) s (the end)"
      tmux capture-pane -p -t watch; } >>"$STATE/screens.txt"
    tmux kill-server
  fi
  [ -d "$STATE/screens" ] && tar -C "$STATE" -czf "$OUT/screens.tar.gz" screens
  python3 -m dflash_train status "$RUN" >"$OUT/status.json" 2>>"$STATE/log.txt"
  if grep -q '"state": "running"' "$OUT/status.json"; then  # past the watch: stop it, keep its chunks
    python3 -m dflash_train stop "$RUN" >"$OUT/stop.json" 2>>"$STATE/log.txt"
  fi
  log "done: $(ls "$DATA" 2>/dev/null | head -20 | xargs)"
  cp "$DATA/prepare.json" "$OUT/" 2>/dev/null
  cp "$RUN/status.jsonl" "$RUN/train.log" "$OUT/" 2>/dev/null
  cp "$STATE/launch.json" "$STATE/log.txt" "$OUT/" 2>/dev/null
  cp "$STATE/screens.txt" "$OUT/" 2>/dev/null
  tail -c 1500 "$OUT/status.json"
}

for stage in "${@:-start finish}"; do
  for one in $stage; do "stage_$one"; done
done
