#!/usr/bin/env bash
# install.sh: installs libkda.so, its public headers, the CMake package and the pkg-config file
# into PREFIX. Run through Bazel, which builds the library and passes the paths (packaging/BUILD):
#   ./bazelw run //:install -- PREFIX        (PREFIX relative to the directory it is run from)
#
# Layout:
#   PREFIX/lib/libkda.so.VERSION             soname libkda.so.MAJOR
#   PREFIX/lib/libkda.so.MAJOR -> libkda.so.VERSION, PREFIX/lib/libkda.so -> libkda.so.MAJOR
#   PREFIX/include/kda/<tree path>.h         e.g. include/kda/backend/kda_backend.h
#   PREFIX/lib/cmake/kda/kdaConfig.cmake     imported target kda::kda (+ kdaConfigVersion.cmake)
#   PREFIX/lib/pkgconfig/kda.pc
# The include directory is PREFIX/include: consumers write #include <kda/backend/kda_backend.h>,
# so no tree directory of ours (core/, backend/, ...) can clash with an engine's own. The headers
# are the include closure of the public roots: every "..." include of an installed header is
# installed too, and rewritten on the way to its installed path ("core/buffer.h" becomes
# "kda/core/buffer.h"): one include root, resolved from PREFIX/include, while the tree keeps its
# own paths. <...> includes must be the C++ library, the CUDA runtime or fmt (the package's
# interface dependencies; dlpack/dlpack.h for the C ABI: Debian libdlpack-dev), so an internal
# dependency cannot leak into the interface.
set -euo pipefail

usage() {
  echo "usage: ./bazelw run //:install -- PREFIX" >&2
  exit 2
}

version="" soversion="" cuda_home="" lib="" templates=() roots=()
while (($#)); do
  case $1 in
    --version) version=$2; shift 2 ;;
    --soversion) soversion=$2; shift 2 ;;
    --cuda-home) cuda_home=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --templates) templates=("$2" "$3" "$4"); shift 4 ;;
    --roots)
      shift
      while (($#)) && [[ $1 != -- ]]; do roots+=("$1"); shift; done
      ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
(($# == 1)) || usage
prefix=$1
[[ $prefix == /* ]] || prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix"

# ---- include closure (paths relative to the workspace root = this runfiles directory) ----
declare -A seen=()
queue=("${roots[@]}")
headers=()
while ((${#queue[@]})); do
  h=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n ${seen[$h]:-} ]] && continue
  seen[$h]=1
  if [[ ! -f $h ]]; then
    echo "install: public header $h (or one including it) is not a header of libkda.so's deps" >&2
    exit 1
  fi
  headers+=("$h")
  while IFS= read -r inc; do
    queue+=("$inc")
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' "$h")
  while IFS= read -r inc; do
    case $inc in
      cuda_runtime_api.h | cuda_runtime.h | driver_types.h | fmt/* | dlpack/dlpack.h | stddef.h | stdint.h) ;;
      */* | *.h)
        echo "install: $h includes <$inc>, which is not an interface dependency of kda::kda" >&2
        exit 1
        ;;
      *) ;;  # the C++ standard library
    esac
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<([^>]+)>.*/\1/p' "$h")
done

# ---- install ----
[[ -n $soversion ]] || usage
mkdir -p "$prefix/lib/cmake/kda" "$prefix/lib/pkgconfig"
rm -rf "$prefix/include/kda"  # ours alone: no stale headers from an earlier install
for h in "${headers[@]}"; do
  mkdir -p "$(dirname "$prefix/include/kda/$h")"
  # Quoted includes (all of them installed: the closure above) move under kda/.
  sed -E 's|^([[:space:]]*#[[:space:]]*include[[:space:]]*")([^"]+)"|\1kda/\2"|' "$h" \
    >"$prefix/include/kda/$h"
  chmod 644 "$prefix/include/kda/$h"
done
rm -f "$prefix/lib/libkda.so" "$prefix/lib/libkda.so.$soversion" "$prefix/lib/libkda.so."*
install -m 755 "$lib" "$prefix/lib/libkda.so.$version"
ln -s "libkda.so.$version" "$prefix/lib/libkda.so.$soversion"
ln -s "libkda.so.$soversion" "$prefix/lib/libkda.so"

subst() {
  sed -e "s|@KDA_VERSION@|$version|g" -e "s|@KDA_SOVERSION@|$soversion|g" \
    -e "s|@KDA_CUDA_HOME@|$cuda_home|g" "$1" >"$2"
}
subst "${templates[0]}" "$prefix/lib/cmake/kda/kdaConfig.cmake"
subst "${templates[1]}" "$prefix/lib/cmake/kda/kdaConfigVersion.cmake"
subst "${templates[2]}" "$prefix/lib/pkgconfig/kda.pc"

echo "install: kda $version -> $prefix (lib/libkda.so.$version, soname libkda.so.$soversion," \
  "${#headers[@]} headers in include/kda, lib/cmake/kda, lib/pkgconfig/kda.pc)"
