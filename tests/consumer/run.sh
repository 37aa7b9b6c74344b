#!/usr/bin/env bash
# run.sh: the consumer test (.ci/run counts it as one test). Installs the package into a
# temporary prefix (./bazelw run //:install), then, as an engine outside the Bazel tree would:
#   1. checks what libkda.so exports: nothing outside namespace kda but the C ABI's kda_*; its
#      soname libkda.so.0 and the symlinks libkda.so -> libkda.so.0 -> libkda.so.VERSION;
#   2. checks that every installed header includes ours as "kda/...";
#   3. builds tests/consumer with CMake (find_package(kda), kda::kda) and runs it (the binary
#      needs libkda.so.0);
#   4. builds the same program with pkg-config (kda.pc) with an engine's own core/ and backend/
#      headers (which #error) on the include path first, and runs it.
# Usage: tests/consumer/run.sh [bazel build flags, e.g. --define=kda_cuda_archs=90a]
# KDA_CONSUMER_KEEP=DIR keeps the prefix and build trees in DIR instead of a temporary one.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ -n ${KDA_CONSUMER_KEEP:-} ]]; then
  work=$(realpath -m "$KDA_CONSUMER_KEEP")
  rm -rf "$work"
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
prefix=$work/prefix

./bazelw run "$@" //:install -- "$prefix"

lib=$prefix/lib/libkda.so
soname=$(readelf -d "$lib" | sed -nE 's/.*\(SONAME\).*\[(.*)\]/\1/p')
if [[ $soname != libkda.so.0 ]]; then
  echo "consumer: libkda.so's soname is '$soname', expected libkda.so.0" >&2
  exit 1
fi
if [[ $(readlink "$prefix/lib/libkda.so") != libkda.so.0 ||
  $(readlink "$prefix/lib/libkda.so.0") != libkda.so.[0-9]*.[0-9]*.[0-9]* ]]; then
  echo "consumer: expected lib/libkda.so -> libkda.so.0 -> libkda.so.X.Y.Z:" >&2
  ls -l "$prefix/lib" >&2
  exit 1
fi
unprefixed=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$prefix/include/kda" |
  grep -v '#include "kda/' || true)
if [[ -n $unprefixed ]]; then
  echo "consumer: installed headers include ours without the kda/ prefix:" >&2
  echo "$unprefixed" >&2
  exit 1
fi
others=$(nm -D --defined-only "$lib" | c++filt | grep -v " kda::" | grep -vE " [A-Za-z] kda_" || true)
if [[ -n $others ]]; then
  echo "consumer: libkda.so exports symbols outside namespace kda:" >&2
  echo "$others" >&2
  exit 1
fi
exported=$(nm -D --defined-only "$lib" | wc -l)

cmake -S tests/consumer -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$work/build"
if ! readelf -d "$work/build/kda_consumer" | grep -q 'NEEDED.*\[libkda.so.0\]'; then
  echo "consumer: kda_consumer does not need libkda.so.0" >&2
  exit 1
fi
"$work/build/kda_consumer"

# pkg-config (the rpath is the consumer's business: kda.pc gives -L only). An engine's own core/
# and backend/ headers come first on the include path: none of ours may resolve to them.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
read -r -a cflags <<<"$(pkg-config --cflags kda)"
read -r -a libs <<<"$(pkg-config --libs kda)"
mkdir -p "$work/engine/core" "$work/engine/backend" "$work/engine/kernels"
for h in core/buffer.h core/error.h core/tensor_view.h backend/kda_backend.h backend/ops.h \
  kernels/kernel_set.h; do
  echo "#error \"the engine's own $h was included by a kda header\"" >"$work/engine/$h"
done
c++ -std=c++17 -O1 -Wall -Wextra -Werror -I"$work/engine" "${cflags[@]}" \
  tests/consumer/kda_consumer.cc -o "$work/kda_consumer_pc" "${libs[@]}" -Wl,-rpath,"$prefix/lib"
"$work/kda_consumer_pc"

echo "consumer: ok (installed tree $(du -sh "$prefix" | cut -f1), libkda.so (soname $soname)" \
  "exports $exported symbols, all in namespace kda; headers under include/kda; CMake and" \
  "pkg-config builds pass)"
