#!/usr/bin/env bash
# replay_check.sh: replays example verify steps through the CUDA kernels and compares them with
# the host reference (contract tolerances) and with each other (bitwise contract), using the
# kda_replay binary of a GPU bundle (tools/gpu_bundle.sh).
#
#   On the build machine (no GPU needed), after tools/gpu_bundle.sh [BUNDLE]:
#     tools/replay/replay_check.sh prepare [BUNDLE]   # examples + host outputs in BUNDLE/replay
#   On the GPU host (BUNDLE carried there):
#     tools/replay/replay_check.sh run [BUNDLE] [WORK]  # WORK default: /tmp/kda_replay
#
# BUNDLE defaults to .gpu_bundle. `run` prints every kda_replay report and one PASS/FAIL line
# per check, and exits non-zero if any check fails. KDA_REPLAY_DEVICE=host runs the same
# checks on the host kernel set (a smoke test of this script without a GPU).
set -uo pipefail
cmd=${1:-}
bundle=${2:-.gpu_bundle}
[[ -d $bundle ]] && bundle=$(cd "$bundle" && pwd)
replay=$bundle/tools/kda_replay
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ex_dir=$bundle/replay

# name: make-example options. Small shapes: the bundle travels with a size limit.
examples=(
  "ring_b1:--B 1 --T 4 --H 2 --HV 2 --K 128 --V 128 --seed 11"
  "ring_b4_pad_sdw:--B 4 --T 4 --H 2 --HV 4 --K 64 --V 64 --pad-request --prefill --conv-layout SDW --seed 14"
  "snap_safe_bf16:--B 2 --T 8 --H 1 --HV 2 --K 64 --V 64 --lower-bound -5 --conv-dtype bf16 --mode snapshot --prefill --seed 13"
)

[[ -x $replay ]] || { echo "replay_check: no $replay (run tools/gpu_bundle.sh first)" >&2; exit 2; }

case $cmd in
  prepare)
    rm -rf "$ex_dir"
    mkdir -p "$ex_dir"
    for e in "${examples[@]}"; do
      name=${e%%:*}
      # shellcheck disable=SC2086
      "$replay" --make-example "$ex_dir/$name" ${e#*:} >/dev/null || exit 2
      "$replay" --in "$ex_dir/$name" --out "$ex_dir/$name.host" --device host --path unfused \
        || exit 2
      # The host's own bitwise contract (fused == unfused) before anything travels.
      "$replay" --in "$ex_dir/$name" --out "$ex_dir/$name.host_fused" --device host \
        --path fused --compare "$ex_dir/$name.host" || exit 1
      rm -rf "$ex_dir/$name.host_fused"
    done
    du -sh "$ex_dir"
    ;;
  run)
    work=${3:-/tmp/kda_replay}
    dev=${KDA_REPLAY_DEVICE:-cuda}
    mkdir -p "$work"
    fail=0
    check() {  # description, kda_replay args...
      local what=$1
      shift
      if "$replay" "$@"; then
        echo "PASS  $what"
      else
        echo "FAIL  $what"
        fail=1
      fi
      echo
    }
    for e in "${examples[@]}"; do
      name=${e%%:*}
      in=$ex_dir/$name
      w=$work/$name
      mode=ring
      [[ $e == *"--mode snapshot"* ]] && mode=snapshot
      other=snapshot
      [[ $mode == snapshot ]] && other=ring
      check "$name: $dev auto ~ host (contract tolerance)" --in "$in" --out "$w.auto" \
        --device "$dev" --compare "$in.host" --expect close
      check "$name: $dev fused ~ host (contract tolerance)" --in "$in" --out "$w.fused" \
        --device "$dev" --path fused --compare "$in.host" --expect close
      check "$name: $dev unfused == $dev fused (bitwise)" --in "$in" --out "$w.unfused" \
        --device "$dev" --path unfused --compare "$w.fused"
      for bv in 8 16 32 64 128; do
        check "$name: $dev fused block_v $bv == default tile (bitwise)" --in "$in" \
          --out "$w.bv$bv" --device "$dev" --path fused --block-v "$bv" --compare "$w.fused"
      done
      # Output, windows and the committed state are mode-independent (contract section 3).
      check "$name: $dev $other mode == $mode mode (bitwise)" --in "$in" --out "$w.$other" \
        --device "$dev" --path fused --mode "$other" --compare "$w.fused"
    done
    ((fail == 0)) && echo "replay_check: all checks passed" || echo "replay_check: FAILURES"
    exit $fail
    ;;
  *)
    echo "usage: $0 prepare|run [BUNDLE] [WORK]" >&2
    exit 2
    ;;
esac
