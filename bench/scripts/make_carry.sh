#!/usr/bin/env bash
# Makes, on this (CPU) machine, every folder the device scripts carry, so a session that is
# lent a machine spends no wall time on it between calls. Each folder is git-ignored through
# .git/info/exclude (a fresh clone has none, so this adds them). Needs the repo's .venv (its
# package versions are the ones the wheels are fetched at) and pip's index.
#   bash bench/scripts/make_carry.sh            # all of them
#   bash bench/scripts/make_carry.sh prep tok   # some: decode prep tok tui stage quality
#   bash bench/scripts/make_carry.sh check      # each planned call's tree + carry against 64 MiB
# What each is for (the script header that carries it says how):
#   decode   .weights_decode/gguf (SmolLM2's GGUF in two 44 MB parts + layout.json) and
#            .whl_decode (gguf): decode_session.sh, eval_cost_session.sh
#   prep     .whl_prep (datasets, dill, multiprocess): eval_cost_session.sh,
#            prepare_workers_h200.sh
#   tok      .bench_tok (SmolLM2's tokenizer as DFLASH_CACHE_DIR lays it out):
#            prepare_workers_h200.sh
#   tui      .whl_tui (the console's wheels): prepare_console_h200.sh
#   stage    .whl (fla, torchao, gguf, datasets...) and .weights28/p/part-a{a..f} with
#            .weights28/gguf.sha256: target_stage_session.sh
#   quality  .whl15 and .weights15/p3/part-a{a..f} with .weights15/gguf.sha256:
#            quality_session.sh
# The GGUF's parts are 17 MB: since 2026-12-06 the tree holds a 38.7 MB export and is ~46 MB,
# so a call has ~21 MB to carry beside it (the 40 MB parts of before no longer fit), and 17
# leaves a few MB for the tree to grow. A data set's part (15.5 MB) travels in a call of its own.
#   data27   .data27 and every .data27sK: git-ignores them and prints the calls that carry
#            their parts, which a device call made (quality_session.sh [PACK=data27s1] pack
#            send: copy what came back into .data27/ or a new .data27s1/); `check` sizes
#            those calls too
#   slim     leaves the committed export (38.7 of the tree's ~47 MB) out of every call: out of
#            git's index and in .git/info/exclude (a call sends tracked and untracked-not-
#            ignored files), so three GGUF parts travel in one call, the six in two; a call
#            that needs the export (`train --init-from`) names it in `carry`. A pre-commit
#            hook refuses every commit until `full` puts it back (CI needs it: the quality
#            export test opens it). `check` sizes the `slim` calls as they would be.
#   full     the export tracked again, the exclude line and the hook gone
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=.venv/bin/python
GGUF=$($PY -c 'from dflash_train.targets.frozen_target import smollm2_gguf_path as p; print(p())')
GGUF_PART=17000000  # bytes: one part and the tree fit a call's 64 MiB (see above)
# The H200 image's Python is 3.12 on x86-64; pure-Python wheels match any of these tags.
TAGS=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

EXCLUDE=$(git rev-parse --git-path info/exclude)
exclude() {  # exclude PATTERN: one line of EXCLUDE, added once
  mkdir -p "$(dirname "$EXCLUDE")"
  grep -qxF "$1" "$EXCLUDE" 2>/dev/null || echo "$1" >>"$EXCLUDE"
}
# ignore DIR: keep it out of git (and so out of nothing: carry names it)
ignore() { exclude "/$1/"; }
version() { { $PY -m pip show "$1" 2>/dev/null || true; } | awk '/^Version:/ {print $2}'; }
wheels() {  # wheels DIR NAME...: NAME==V as pinned, else the venv's version, else the newest
  local dir=$1 spec name v
  shift
  ignore "$dir"
  mkdir -p "$dir"
  for spec in "$@"; do
    name=${spec%%==*}
    v=${spec#*==}
    [ "$v" = "$spec" ] && v=$(version "$name")
    # pip's notes on the index folders it skips are noise here; its errors are not
    python3 -m pip download -q --no-deps "${TAGS[@]}" -d "$dir" "$name${v:+==$v}" 2>&1 |
      { grep -v "^WARNING: Location" || true; }
  done
  echo "$dir: $(ls "$dir" | wc -l) wheels, $(du -sh "$dir" | cut -f1)"
}
split_gguf() {  # split_gguf DIR BYTES: the GGUF in parts of BYTES, and its sha256
  ignore "${1%%/*}"
  rm -rf "$1" && mkdir -p "$1"
  split -b "$2" "$GGUF" "$1/part-"
  sha256sum "$GGUF" | cut -d' ' -f1 >"${1%/*}/gguf.sha256"
  echo "$1: $(ls "$1" | xargs)"
}

make_decode() {
  ignore .weights_decode
  rm -rf .weights_decode/gguf
  $PY bench/fixtures/gguf_travel.py pack "$GGUF" .weights_decode/gguf
  wheels .whl_decode gguf
}
make_prep() { wheels .whl_prep datasets dill multiprocess; }
make_tok() {
  local src
  src=$($PY -c "from dflash_train.targets.frozen_target import smollm2_cache_dir as d; print(d())")
  [ -f "$src/tokenizer.json" ] || $PY -c 'from dflash_train.targets.frozen_target import ensure_smollm2_converted as c; c()'
  ignore .bench_tok
  mkdir -p .bench_tok/models/smollm2-135m-instruct
  cp "$src"/{chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} \
    .bench_tok/models/smollm2-135m-instruct/
  echo ".bench_tok: $(ls .bench_tok/models/smollm2-135m-instruct | xargs)"
}
make_tui() {
  # Not pygments (1.2 MB): the device image has it (KINDS.md), and the call that carries these
  # wheels with a GGUF part had 131 KiB to spare on 2026-12-05.
  wheels .whl_tui textual rich markdown-it-py mdit-py-plugins mdurl linkify-it-py uc-micro-py \
    platformdirs plotext textual-plotext tomlkit nvidia-ml-py
}
make_stage() {
  wheels .whl flash-linear-attention==0.6.0 fla-core==0.6.0 torchao==0.17.0 gguf==0.19.0 \
    datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 platformdirs liger-kernel==0.8.5
  split_gguf .weights28/p "$GGUF_PART"
}
make_quality() {
  wheels .whl15 gguf datasets dill multiprocess
  split_gguf .weights15/p3 "$GGUF_PART"
}

# The carry of each call bench/README's next-session table plans (one line a call): a call
# sends the working tree (tracked and untracked-not-ignored files) with what it carries, and
# is refused above 64 MiB, after the device minutes of its start.
CALLS=(
  "eval_cost carry: .weights_decode/gguf/part-0 .weights_decode/gguf/layout.json .whl_decode .whl_prep"
  "eval_cost measure: .weights_decode/gguf/part-1"
  "prepare_workers: .whl_prep .bench_tok"
  "prepare_console ready start: .weights_decode/gguf/part-1 .whl_tui"
  "target_stage stage: .whl"
  "target_stage carry: .weights28/p/part-aa .weights28/gguf.sha256"
  "target_stage carry: .weights28/p/part-ab"
  "target_stage carry: .weights28/p/part-ac"
  "target_stage carry: .weights28/p/part-ad"
  "target_stage carry: .weights28/p/part-ae"
  "target_stage carry fidelity: .weights28/p/part-af"
  "target_stage plan: .whl .bench_tok"
  "target_stage launch: .whl .bench_tok"
  "target_stage hybrid target_profile ce profile: .whl"
  "quality (first call, wheels; on an H200 target_stage launch): .whl15 .whl .bench_tok"
  "quality carry: .weights15/p3/part-aa"
  "quality carry: .weights15/p3/part-ab"
  "quality carry: .weights15/p3/part-ac"
  "quality carry: .weights15/p3/part-ad"
  "quality carry: .weights15/p3/part-ae"
  "quality carry train|study|eval: .weights15/p3/part-af .weights15/gguf.sha256"
  "slim quality carry: .whl15 .weights15/p3/part-aa .weights15/p3/part-ab .weights15/p3/part-ac"
  "slim quality data pack send: .weights15/p3/part-ad .weights15/p3/part-ae .weights15/p3/part-af .weights15/gguf.sha256"
  "slim quality unpack train: bench/results/quality_smollm2/export/model.safetensors .data27"
  "slim quality unpack, three sets in one call: .data27s4 .data27s5 .data27s6"
  "slim quality train: bench/results/quality_smollm2/export/model.safetensors"
)
EXPORT=bench/results/quality_smollm2/export/model.safetensors
HOOK=$(git rev-parse --git-path hooks)/pre-commit
HOOK_MARK="make_carry slim"  # how slim knows its own hook from anyone else's
export_tracked() { git ls-files --error-unmatch "$EXPORT" >/dev/null 2>&1; }
tree_bytes() {
  local tree
  tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1)
  echo $((tree + $(du -sb ../shared 2>/dev/null | cut -f1 || echo 0)))
}
# A data set's parts in as few calls as fit beside the tree (the sums with the first), one
# line a call as CALLS has them: `quality_session.sh unpack` on each (PACK=NAME for a set
# other than data27), with the study or train stage after the last.
# The packed sets here: data27, and data27sK for the K+1th distinct set (PREP_SEED=K
# PACK=data27sK ... data pack send), read from the folders so a new seed needs no edit.
packs() {
  local d
  for d in .data27/ .data27s*/; do [ -d "$d" ] && d=${d%/} && echo "${d#.}"; done
  return 0
}
data_calls() {  # data_calls NAME
  local pack=$1 tree limit=$((64 << 20)) part size used=0 call="" n=1
  tree=$(tree_bytes)
  [ -f ".$pack/$pack.sha256" ] || return 0
  call=".$pack/$pack.sha256" used=$((tree + $(stat -c %s ".$pack/$pack.sha256")))
  for part in ".$pack/$pack".tar.xz.part-*; do
    [ -f "$part" ] || continue
    size=$(stat -c %s "$part")
    if [ $((used + size)) -gt $limit ]; then
      echo "quality unpack $pack $n: $call"
      n=$((n + 1)) call="" used=$tree
    fi
    call="${call:+$call }$part" used=$((used + size))
  done
  echo "quality unpack $pack $n: $call"
}
make_data27() {  # every .data27* folder ignored, .data27 made (mkdir .data27sK for a new set)
  local pack
  exclude "/.data27*/"
  mkdir -p .data27
  for pack in $(packs); do data_calls "$pack"; done
}
make_check() {
  local tree call paths bytes missing p limit=$((64 << 20)) worst=0 extra=()
  tree=$(tree_bytes)
  mapfile -t extra < <(for p in $(packs); do data_calls "$p"; done)
  for call in "${CALLS[@]}" "${extra[@]}"; do
    read -r -a paths <<<"${call#*: }"
    missing=$(for p in "${paths[@]}"; do [ -e "$p" ] || echo "$p"; done | xargs)
    # a folder not made here (this script's other parts make it) is said, not fatal
    if [ -n "$missing" ]; then printf '%-30s not made here: %s\n' "${call%%: *}" "$missing"; continue; fi
    bytes=$((tree + $(du -cb "${paths[@]}" | tail -1 | cut -f1)))
    # a `slim` call's tree has no export in it, whichever way this checkout is now
    if [[ $call == slim* ]] && export_tracked; then
      bytes=$((bytes - $(stat -c %s "$EXPORT")))
    fi
    printf '%-30s %6.1f MiB  %s\n' "${call%%: *}" "$(echo "$bytes / 1048576" | bc -l)" \
      "$([ $bytes -le $limit ] && echo "ok, $(((limit - bytes) >> 10)) KiB to spare" || echo OVER)"
    [ $bytes -le $limit ] || worst=1
  done
  return $worst
}

make_slim() {
  if [ -e "$HOOK" ] && ! grep -qF "$HOOK_MARK" "$HOOK"; then
    echo "make_carry: $HOOK is someone else's; not slimming" >&2
    return 1
  fi
  mkdir -p "$(dirname "$HOOK")"
  if export_tracked; then git rm -q --cached "$EXPORT"; fi
  exclude "/$EXPORT"
  printf '%s\n' '#!/bin/sh' \
    "echo \"$HOOK_MARK: the committed export is out of the index; run bash bench/scripts/make_carry.sh full, then commit\" >&2" \
    'exit 1' >"$HOOK"
  chmod +x "$HOOK"
  echo "slim: the tree is $(($(tree_bytes) >> 10)) KiB; a call that needs the export carries $EXPORT; undo: make_carry.sh full"
}
make_full() {
  git cat-file -e "HEAD:$EXPORT" 2>/dev/null || {
    echo "make_carry: HEAD has no $EXPORT: a commit while slim removed it; restore it before anything else" >&2
    return 1
  }
  git reset -q -- "$EXPORT"
  sed -i "\|^/$EXPORT\$|d" "$EXCLUDE"
  if grep -qF "$HOOK_MARK" "$HOOK" 2>/dev/null; then rm -f "$HOOK"; fi
  export_tracked || { echo "make_carry: $EXPORT is not tracked after the reset" >&2; return 1; }
  # A new export (a run that beat the committed one) is the one case where it differs.
  if git diff --quiet -- "$EXPORT"; then
    echo "full: the export is tracked again and unchanged"
  else
    echo "full: the export is tracked again, changed since HEAD (a new export: commit it with its result.json)"
  fi
}

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(decode prep tok tui stage quality check)
for s in "${stages[@]}"; do
  case $s in
    decode | prep | tok | tui | stage | quality | data27 | check | slim | full) "make_$s" ;;
    *) echo "make_carry: no part '$s' (decode prep tok tui stage quality data27 check slim full)" >&2; exit 2 ;;
  esac
done
