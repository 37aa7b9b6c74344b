#!/usr/bin/env bash
# bundle_libs.sh: copies the shared libraries outside libc/libstdc++ that the given binaries
# load (spdlog, fmt) into LIB_DIR, so a bundle runs on a GPU host without them installed:
#   tools/bundle_libs.sh LIB_DIR BINARY...
# Used by gpu_bundle.sh and ab_bundle.sh; the bundles' runners put LIB_DIR on LD_LIBRARY_PATH.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: tools/bundle_libs.sh LIB_DIR BINARY..." >&2
  exit 2
fi
lib_dir=$1
shift
mkdir -p "$lib_dir"
for bin in "$@"; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libspdlog|libfmt' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$lib_dir/"; done
