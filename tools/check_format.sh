#!/usr/bin/env bash
# check_format.sh: clang-format check of our C++/CUDA sources (--fix rewrites them).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=(--dry-run -Werror)
[[ ${1:-} == --fix ]] && mode=(-i)
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | grep -v '^third_party/')
clang-format "${mode[@]}" "${files[@]}"
echo "check_format: ${#files[@]} files ok"
