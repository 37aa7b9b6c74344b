#!/usr/bin/env bash
# run.sh: the consumer test (.ci/run counts it as one test). Installs the package into a
# temporary prefix (./bazelw run //:install), then, as an engine outside the Bazel tree would:
#   1. checks what libkda.so exports: nothing outside namespace kda but the C ABI's kda_*;
#   2. builds tests/consumer with CMake (find_package(kda), kda::kda) and runs it;
#   3. builds the same program with pkg-config (kda.pc) and runs it.
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
others=$(nm -D --defined-only "$lib" | c++filt | grep -v " kda::" | grep -vE " [A-Za-z] kda_" || true)
if [[ -n $others ]]; then
  echo "consumer: libkda.so exports symbols outside namespace kda:" >&2
  echo "$others" >&2
  exit 1
fi
exported=$(nm -D --defined-only "$lib" | wc -l)

cmake -S tests/consumer -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
cmake --build "$work/build"
"$work/build/kda_consumer"

# pkg-config (the rpath is the consumer's business: kda.pc gives -L only).
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
read -r -a cflags <<<"$(pkg-config --cflags kda)"
read -r -a libs <<<"$(pkg-config --libs kda)"
c++ -std=c++17 -O1 -Wall -Wextra -Werror "${cflags[@]}" tests/consumer/kda_consumer.cc \
  -o "$work/kda_consumer_pc" "${libs[@]}" -Wl,-rpath,"$prefix/lib"
"$work/kda_consumer_pc"

echo "consumer: ok (installed tree $(du -sh "$prefix" | cut -f1), libkda.so exports" \
  "$exported symbols, all in namespace kda; CMake and pkg-config builds pass)"
