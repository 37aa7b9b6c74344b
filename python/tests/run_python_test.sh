#!/usr/bin/env bash
# run_python_test.sh SCRIPT ARGS...: runs a Python test of the package with the system python3
# (Debian's, with python3-numpy) from the Bazel runfiles tree; relative paths become absolute.
set -euo pipefail
script=$1
shift
args=()
for a in "$@"; do
  if [[ $a != -* && -e $a ]]; then
    a=$PWD/$a
  fi
  args+=("$a")
done
if ! python3 -c "import numpy" 2>/dev/null; then
  echo "run_python_test.sh: python3 ($(command -v python3)) has no numpy: apt-get install" \
    "python3-numpy (./bazelw installs it)" >&2
  exit 1
fi
exec python3 "$script" "${args[@]}"
