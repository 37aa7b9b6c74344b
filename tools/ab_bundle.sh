#!/usr/bin/env bash
# ab_bundle.sh: kda_bench built at several git revisions, with a runner that times them
# interleaved on one GPU machine start (timings compare only within one start, docs/perf.md):
#   tools/ab_bundle.sh OUT_DIR REV [REV...] [-- BAZEL_BUILD_FLAGS...]
#   (copy OUT_DIR to the GPU host)  OUT_DIR/ab.sh REPS RESULT_DIR -- KDA_BENCH_ARGS...
# OUT_DIR/bench/kda_bench_NAME per REV (NAME: the REV, '/' -> '_'), the shared libraries they
# need (spdlog, fmt) in OUT_DIR/lib, and ab.sh, which runs the one kda_bench command line on every
# binary in turn, REPS rounds (A, B, .., A, B, ..), each run's output in RESULT_DIR/NAME_ROUND.txt
# and a line per run in RESULT_DIR/summary.txt. Each REV is built in a temporary detached
# worktree; the build's disk cache (.bazelrc) serves every action a REV shares with another.
# The GPU tests of the revision under test come from tools/gpu_bundle.sh, run in its checkout.
# Every REV is built with the same flags: by default --define=kda_cuda_archs=90a (the lent GPU
# machines are sm_90; the second default arch, sm_100a, would double each binary and its build);
# flags after `--` replace the default (e.g. -- --define=kda_cuda_archs=100a on a B200).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() {
  echo "usage: tools/ab_bundle.sh OUT_DIR REV [REV...] [-- FLAGS]" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
out=$1
shift
revs=()
while [[ $# -gt 0 && $1 != -- ]]; do
  revs+=("$1")
  shift
done
build_flags=(--define=kda_cuda_archs=90a)
if [[ $# -gt 0 ]]; then
  shift
  build_flags=("$@")
fi
[[ ${#revs[@]} -gt 0 ]] || usage
for rev in "${revs[@]}"; do
  git rev-parse --verify --quiet "$rev^{commit}" >/dev/null ||
    { echo "ab_bundle.sh: '$rev' is not a commit of this repository" >&2; exit 2; }
done

rm -rf "$out"
mkdir -p "$out/bench" "$out/lib"
out=$(cd "$out" && pwd)
scratch=$(mktemp -d)
trap 'git worktree prune; rm -rf "$scratch"' EXIT
for rev in "${revs[@]}"; do
  name=${rev//\//_}
  tree=$scratch/$name
  git worktree add --detach --quiet "$tree" "$rev"
  (cd "$tree" && ./bazelw build --noshow_progress "${build_flags[@]}" //tools:kda_bench >&2 &&
    install -m 0755 bazel-bin/tools/kda_bench "$out/bench/kda_bench_$name" &&
    ./bazelw shutdown >/dev/null 2>&1)
  git worktree remove --force "$tree"
  echo "ab_bundle.sh: $rev ($(git rev-parse --short "$rev")) -> bench/kda_bench_$name" >&2
done
tools/bundle_libs.sh "$out/lib" "$out"/bench/*

cat >"$out/ab.sh" <<'RUN'
#!/usr/bin/env bash
# Runs one kda_bench command line on every bundled binary, interleaved, REPS rounds:
#   ab.sh REPS RESULT_DIR -- KDA_BENCH_ARGS...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ $# -lt 3 || $3 != -- ]]; then
  echo "usage: ab.sh REPS RESULT_DIR -- KDA_BENCH_ARGS..." >&2
  exit 2
fi
reps=$1 results=$2
shift 3
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$results"
status=0
for ((round = 1; round <= reps; ++round)); do
  for bin in "$here"/bench/kda_bench_*; do
    name=${bin##*/kda_bench_}
    start=$SECONDS
    "$bin" "$@" >"$results/${name}_$round.txt" 2>&1
    rc=$?
    [[ $rc -eq 0 ]] || status=1
    echo "$name round $round rc=$rc $((SECONDS - start))s" | tee -a "$results/summary.txt"
  done
done
exit $status
RUN
chmod 0755 "$out/ab.sh"
echo "ab_bundle.sh: $out (${#revs[@]} binaries); run: $out/ab.sh REPS RESULT_DIR -- ARGS" >&2
