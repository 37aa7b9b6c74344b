#!/usr/bin/env bash
# gpu_bundle.sh: build every GPU test and GPU tool, and collect them with the shared
# libraries they need and a run_all.sh into one folder (default .gpu_bundle/) that runs on a
# GPU host without Bazel:
#   tools/gpu_bundle.sh [OUT_DIR [BAZEL_BUILD_FLAG...]]
#   (copy OUT_DIR to the GPU host)  OUT_DIR/run_all.sh [--sanitize] [filter...]
# e.g. tools/gpu_bundle.sh .gpu_bundle --define=kda_cuda_archs=90a (an H200 bundle, one arch).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.gpu_bundle}
shift || true
build_flags=("$@")

mapfile -t tests < <(./bazelw query --noshow_progress 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)
mapfile -t tools < <(./bazelw query --noshow_progress 'attr(tags, "\bgpu_tool\b", kind(cc_binary, //...))' 2>/dev/null)
./bazelw build --noshow_progress "${build_flags[@]}" "${tests[@]}" "${tools[@]}" \
  //capi:libkda_c.so >&2

rm -rf "$out"
mkdir -p "$out/tests" "$out/tools" "$out/lib"
copy_target() {  # //pkg:name -> bazel-bin/pkg/name
  local label=$1 dest=$2 path
  path=${label#//}
  path=bazel-bin/${path/://}
  install -m 0755 "$path" "$dest/"
  strip --strip-debug "$dest/$(basename "$path")"
}
for t in "${tests[@]}"; do copy_target "$t" "$out/tests"; done
for t in "${tools[@]}"; do copy_target "$t" "$out/tools"; done
# The Python package, its tests and the C ABI library (python/tests/test_torch_cuda.py):
#   LD_LIBRARY_PATH=OUT/lib python3 OUT/python/tests/test_torch_cuda.py \
#     --replay OUT/tools/kda_replay --library OUT/lib/libkda_c.so
install -m 0755 bazel-bin/capi/libkda_c.so "$out/lib/"
mkdir -p "$out/python/kda" "$out/python/tests"
cp python/kda/*.py "$out/python/kda/"
cp python/tests/*.py "$out/python/tests/"

# Shared libraries outside libc/libstdc++ that the binaries need (spdlog, fmt).
shopt -s nullglob
tools/bundle_libs.sh "$out/lib" "$out"/tests/* "$out"/tools/* "$out"/lib/libkda_c.so

cat >"$out/run_all.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every GPU test binary; prints PASS/FAIL per binary; non-zero exit on any failure.
#   run_all.sh [--sanitize] [name-filter...]
#   --sanitize: also run each test under compute-sanitizer memcheck and racecheck
#               (tests tagged [slow] and hidden ones, e.g. [.host_only], are skipped there;
#               KDA_TEST_QUICK=1 trims case tables).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sanitize=0
if [[ ${1:-} == --sanitize ]]; then sanitize=1; shift; fi
filters=("$@")
pass=0 fail=0 failed=()
run() {  # name, command...
  local name=$1; shift
  local start=$SECONDS
  if "$@" >"$here/logs/$name.log" 2>&1; then
    echo "PASS  $name ($((SECONDS - start)) s)"; pass=$((pass + 1))
  else
    echo "FAIL  $name ($((SECONDS - start)) s)"; tail -30 "$here/logs/$name.log"
    fail=$((fail + 1)); failed+=("$name")
  fi
}
mkdir -p "$here/logs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
for bin in "$here"/tests/*; do
  name=$(basename "$bin")
  if ((${#filters[@]})); then
    keep=0; for f in "${filters[@]}"; do [[ $name == *$f* ]] && keep=1; done
    ((keep)) || continue
  fi
  run "$name" "$bin"
  if [[ $name == kernels_gpu_test ]]; then
    # Alone in a fresh process: the streaming kernels' first launch happens inside a capture.
    run "$name.capture_first" "$bin" "kernels: CUDA-graph capture and replay give the eager bits"
  fi
  if ((sanitize)); then
    cs=${COMPUTE_SANITIZER:-compute-sanitizer}
    command -v "$cs" >/dev/null || cs=/usr/local/cuda/bin/compute-sanitizer
    KDA_TEST_QUICK=1 run "$name.memcheck" "$cs" --tool memcheck --error-exitcode 1 "$bin" '~[slow] ~[.]'
    KDA_TEST_QUICK=1 run "$name.racecheck" "$cs" --tool racecheck --error-exitcode 1 "$bin" '~[slow] ~[.]'
  fi
done
echo "${pass} passed, ${fail} failed"
((fail == 0))
RUN
chmod +x "$out/run_all.sh"
du -sh "$out" >&2
echo "$out"
