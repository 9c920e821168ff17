#!/usr/bin/env bash
# Builds the relocatable bundle: kilnd, kilnctl, libkiln_client.so and
# libkiln_c.so (the C API) with their headers, the Python package, every
# shared library they need except glibc, libstdc++/libgcc_s and NVIDIA's,
# libdevice and glibc's link inputs, in one .tar.xz that runs from any
# directory on a machine without the Debian -dev packages.
#
#   deploy/bundle.sh [--build-dir DIR] [--out FILE] [--jobs N]
#                    [--extra BINARY]...   # more executables for kiln/bin
#                    [--from-build]        # DIR is built already (any build
#                                          # type): stage its binaries as they are
#                    [--stage-only]        # stop after staging; print the
#                                          # staged kiln/ folder (deploy/wheel.sh)
#
# Layout of the tarball (README.md, "Relocatable bundle"):
#   kiln/bin            kilnd, kilnctl, the --extra binaries (RPATH $ORIGIN/../lib)
#   kiln/lib            libkiln_client.so, libkiln_c.so and the private shared libraries (RPATH $ORIGIN)
#   kiln/lib/pkgconfig  kiln_client.pc
#   kiln/include        the client's public headers, Abseil's and Protobuf's
#   kiln/python/kiln    the Python binding (ctypes over ../lib/libkiln_c.so;
#                       the extension _kiln_call in kiln/lib when the build
#                       has one, else built on first use from
#                       kiln/share/kiln/src, kiln/_ext_build.py)
#   kiln/share/kiln     libdevice.10.bc, link/ (glibc's libc.so, libm.so,
#                       libmvec.so for lld), examples/graphs/*.json,
#                       tests/python_binding_test.py (GPU + PyTorch)
#   kiln/README, kiln/VERSION
#
# Quiet on success but for one line naming the tarball and its size.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build-bundle"
OUT=""
JOBS=2
EXTRAS=()
FROM_BUILD=0
STAGE_ONLY=0
MAX_BYTES=$((64 * 1024 * 1024))

die() { echo "bundle.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^#   kiln\/README/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=$(realpath -m "${2:?--build-dir needs a value}"); shift 2 ;;
    --build-dir=*) BUILD=$(realpath -m "${1#*=}"); shift ;;
    --out) OUT=$(realpath -m "${2:?--out needs a value}"); shift 2 ;;
    --out=*) OUT=$(realpath -m "${1#*=}"); shift ;;
    --jobs) JOBS="${2:?--jobs needs a value}"; shift 2 ;;
    --jobs=*) JOBS="${1#*=}"; shift ;;
    --extra) EXTRAS+=("$(realpath -m "${2:?--extra needs a value}")"); shift 2 ;;
    --extra=*) EXTRAS+=("$(realpath -m "${1#*=}")"); shift ;;
    --from-build) FROM_BUILD=1; shift ;;
    --stage-only) STAGE_ONLY=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "bundle.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
[ -n "$OUT" ] || OUT="$BUILD/kiln-linux-x86_64.tar.xz"

for f in ${EXTRAS[@]+"${EXTRAS[@]}"}; do
  [ -f "$f" ] && [ -x "$f" ] || die "--extra $f: not an executable file (build it first)"
done

bash "$ROOT/deploy/install-deps.sh"
for tool in patchelf xz strip ldd; do
  command -v "$tool" >/dev/null || die "$tool not found (deploy/install-deps.sh installs it)"
done

LIBDEVICE=""
for c in "${KILN_LIBDEVICE:-}" /usr/local/cuda/nvvm/libdevice/libdevice.10.bc; do
  if [ -n "$c" ] && [ -f "$c" ]; then LIBDEVICE=$c; break; fi
done
[ -n "$LIBDEVICE" ] || die "libdevice.10.bc not found: set KILN_LIBDEVICE or install CUDA in /usr/local/cuda"

# --- Release build ----------------------------------------------------------
LOG="$BUILD/bundle-build.log"
mkdir -p "$BUILD"
if [ "$FROM_BUILD" = 1 ]; then
  for f in server/kilnd client/kilnctl client/libkiln_c.so; do
    [ -e "$BUILD/$f" ] || die "--from-build: $BUILD/$f not found (build it first)"
  done
elif ! { cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_FUZZERS=OFF \
         -DKILN_BUILD_SHARED_CLIENT=ON &&
       cmake --build "$BUILD" -j "$JOBS" --target kilnd kilnctl kiln_client_shared kiln_c; } >"$LOG" 2>&1; then
  tail -n 40 "$LOG" >&2
  die "release build failed (full log: $LOG)"
fi

# --- Stage ------------------------------------------------------------------
STAGE="$BUILD/bundle-stage"
K="$STAGE/kiln"
rm -rf "$STAGE"
mkdir -p "$K/bin" "$K/lib/pkgconfig" "$K/include" "$K/share/kiln/link" "$K/share/kiln/examples/graphs"

install -m 0755 "$BUILD/server/kilnd" "$BUILD/client/kilnctl" "$K/bin/"
for f in ${EXTRAS[@]+"${EXTRAS[@]}"}; do
  [ ! -e "$K/bin/$(basename "$f")" ] || die "--extra $f: $(basename "$f") is already in kiln/bin"
  install -m 0755 "$f" "$K/bin/"
done
# libkiln_client.so (the C++ API) is built only with KILN_BUILD_SHARED_CLIENT
# (the Release build above); a --from-build tree may lack it.
CLIENT_SONAME=""
if [ -e "$BUILD/client/libkiln_client.so" ]; then
  CLIENT_SO=$(readlink -f "$BUILD/client/libkiln_client.so")
  CLIENT_SONAME=$(patchelf --print-soname "$CLIENT_SO")
  install -m 0644 "$CLIENT_SO" "$K/lib/$CLIENT_SONAME"
  ln -s "$CLIENT_SONAME" "$K/lib/libkiln_client.so"
fi
C_SO=$(readlink -f "$BUILD/client/libkiln_c.so")
C_SONAME=$(patchelf --print-soname "$C_SO")
install -m 0644 "$C_SO" "$K/lib/$C_SONAME"
ln -s "$C_SONAME" "$K/lib/libkiln_c.so"

# Not bundled, and why:
#  - glibc (the loader, libc, libm, libmvec, libpthread, libdl, librt,
#    libresolv, libutil, libanl, libnsl): it must match the loader of the
#    machine; the bundle needs glibc >= 2.36 there (symbol versions).
#  - libstdc++.so.6, libgcc_s.so.1: backward compatible and versioned; the
#    target's (GCC >= 12) serve us, while ours (GCC 12) would shadow a newer
#    one that PyTorch, CUDA or the user's code in the same process needs.
#  - NVIDIA's (driver, CUDA toolkit, pip nvidia-* wheels): they come with the
#    GPU machine and must match its driver.
is_system_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*) return 0 ;;
    librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*|libnsl.so.*|libBrokenLocale.so.*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
    libcuda.so*|libnvJitLink.so*|libnvidia-*|libcudart.so*|libcublas*|libnvrtc*|libnvvm.so*) return 0 ;;
  esac
  return 1
}

# Every non-system dependency of the staged ELF files, by soname: ldd gives
# the transitive closure, resolved the way this machine resolves it.
declare -A DEPS=()
for elf in "$K"/bin/* ${CLIENT_SONAME:+"$K/lib/$CLIENT_SONAME"} "$K/lib/$C_SONAME"; do
  ldd_out=$(ldd "$elf") || die "ldd $elf failed"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system_lib "$name" && continue
    [ "$path" != "not" ] || die "$(basename "$elf") needs $name, which this machine cannot find"
    DEPS[$name]=$path
  done <<<"$ldd_out"
done
for name in "${!DEPS[@]}"; do
  { [ "$name" = "$CLIENT_SONAME" ] || [ "$name" = "$C_SONAME" ]; } && continue
  install -m 0644 "$(readlink -f "${DEPS[$name]}")" "$K/lib/$name"
done

# Strip (Debian's libraries are stripped already; ours and --extra ones are
# not), then set the search path. DT_RPATH, not DT_RUNPATH: it is searched
# before LD_LIBRARY_PATH (a PyTorch or conda environment may put another
# libprotobuf/libz/libzstd there) and also serves the dependencies of
# dependencies. Whatever is not in kiln/lib (glibc, libstdc++, NVIDIA) is then
# found the usual way.
for f in "$K"/bin/*; do
  strip --strip-all "$f"
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"
done
for f in "$K"/lib/*.so*; do
  [ -L "$f" ] && continue
  strip --strip-unneeded "$f"
  patchelf --force-rpath --set-rpath '$ORIGIN' "$f"
done

# Headers: the client's public ones, the generated kiln.v1 messages, and the
# Abseil and Protobuf trees they include (the versions the libraries in
# kiln/lib were built with; a user's own would not match them).
mkdir -p "$K/include/client" "$K/include/runtime" "$K/include/graph" "$K/include/kiln/v1" "$K/include/google"
install -m 0644 "$ROOT/client/kiln_client.h" "$ROOT/client/kiln_c.h" "$K/include/client/"
install -m 0644 "$ROOT/runtime/cuda_executable.h" "$ROOT/runtime/cuda_driver.h" \
  "$ROOT/runtime/device_allocator.h" "$ROOT/runtime/program_plan.h" "$K/include/runtime/"
install -m 0644 "$ROOT/graph/host_tensor.h" "$ROOT/graph/dtype.h" "$K/include/graph/"
for p in graph artifact service; do
  install -m 0644 "$BUILD/proto/kiln/v1/$p.pb.h" "$K/include/kiln/v1/"
  install -m 0644 "$ROOT/proto/kiln/v1/$p.proto" "$K/include/kiln/v1/"
done
cp -r /usr/include/absl "$K/include/"
cp -r /usr/include/google/protobuf "$K/include/google/"

# pkg-config: prefix relative to the .pc file, so the bundle may move.
{
  echo 'prefix=${pcfiledir}/../..'
  echo 'libdir=${prefix}/lib'
  echo 'includedir=${prefix}/include'
  echo
  echo 'Name: kiln_client'
  echo 'Description: Kiln client library (kiln::Client), relocatable bundle'
  echo "Version: $(sed -n 's/^project(kiln VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")"
  echo 'Cflags: -I${includedir}'
  printf 'Libs: -L${libdir} -Wl,-rpath,${libdir} -lkiln_client'
  for f in "$K"/lib/libprotobuf.so.* "$K"/lib/libabsl_*.so.*; do
    [ -e "$f" ] && printf ' -l:%s' "$(basename "$f")"
  done
  echo
} >"$K/lib/pkgconfig/kiln_client.pc"

# glibc's shared objects as lld's link inputs for the kernels kilnd builds
# (compiler/cpu_backend.cc looks in <exe>/../share/kiln/link first): libc6-dev
# with its libc.so/libm.so/libmvec.so need not be on the target.
for lib in libc.so.6 libm.so.6 libmvec.so.1; do
  src=$(ldconfig -p | awk -v n="$lib" '$1 == n && /x86-64/ && !found {print $NF; found = 1}')
  [ -n "$src" ] || die "$lib not found by ldconfig"
  install -m 0644 "$(readlink -f "$src")" "$K/share/kiln/link/${lib%%.so*}.so"
done
install -m 0644 "$LIBDEVICE" "$K/share/kiln/libdevice.10.bc"
install -m 0644 "$ROOT"/examples/graphs/*.json "$K/share/kiln/examples/graphs/"
mkdir -p "$K/python/kiln" "$K/share/kiln/tests" "$K/share/kiln/src"
install -m 0644 "$ROOT"/python/kiln/*.py "$K/python/kiln/"
# The CPython extension: the build's (for its Python), and its source for
# any other Python (kiln/_ext_build.py compiles it on first use).
for f in "$BUILD"/client/_kiln_call*.so; do
  [ -e "$f" ] || continue
  install -m 0644 "$f" "$K/lib/"
  strip --strip-unneeded "$K/lib/$(basename "$f")"
  patchelf --force-rpath --set-rpath '$ORIGIN' "$K/lib/$(basename "$f")"
done
install -m 0644 "$ROOT/python/ext/kiln_call.c" "$K/share/kiln/src/"
install -m 0644 "$ROOT/tests/gpu/python_binding_test.py" "$K/share/kiln/tests/"
install -m 0644 "$ROOT/deploy/bundle-README.txt" "$K/README"
{
  echo "kiln $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "libdevice: $LIBDEVICE"
  echo "extra: ${EXTRAS[*]+${EXTRAS[*]}}"
} >"$K/VERSION"

if [ "$STAGE_ONLY" = 1 ]; then
  echo "$K"
  exit 0
fi

# --- Pack -------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner -cf - kiln |
  xz -9 -T2 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
bytes=$(stat -c %s "$OUT")
[ "$bytes" -le "$MAX_BYTES" ] || die "$OUT is $((bytes / 1048576)) MiB, over the 64 MiB limit"
echo "kiln: bundle $OUT ($(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB, $(du -sm "$K" | cut -f1) MiB unpacked)"
