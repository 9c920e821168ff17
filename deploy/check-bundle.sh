#!/usr/bin/env bash
# Checks a bundle from deploy/bundle.sh the way a machine without Kiln's
# build dependencies would use it:
#  1. unpacks it into a temporary directory;
#  2. env -i ldd of every ELF in kiln/bin and kiln/lib: each dependency
#     resolves inside kiln/lib, except glibc, libstdc++/libgcc_s and NVIDIA's
#     (these may be missing here: libcuda, libnvJitLink);
#  3. compiles tests/bundle/client_smoke.cc with only the bundle's headers
#     and libraries (pkg-config kiln_client; g++ -M proves no Abseil,
#     Protobuf or Kiln header came from elsewhere);
#  4. runs kilnd on 127.0.0.1:0, `kilnctl health`, `kilnctl compile
#     chain10.json --run` twice (compiled, then hit), client_smoke and, where
#     this machine has libnvJitLink.so.13, `kilnctl compile --target=sm_90`, then
#     stops kilnd with SIGTERM; every shared object kilnd maps must be the
#     bundle's or a system one from (2). As root this runs under env -i in a
#     chroot holding only the bundle, glibc, libstdc++ and libgcc_s (no /usr,
#     no libc6-dev); otherwise under env -i in place.
#
#   deploy/check-bundle.sh [TARBALL]   # default build-bundle/kiln-linux-x86_64.tar.xz
#
# Quiet on success but for one summary line.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "check-bundle.sh: $*" >&2; exit 1; }

SYSTEM_LIBS=(ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libmvec.so.1 libpthread.so.0 libdl.so.2
             librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1 libnsl.so.1 libstdc++.so.6 libgcc_s.so.1)
is_system_lib() {  # the same set deploy/bundle.sh leaves out
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*) return 0 ;;
    librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*|libnsl.so.*|libBrokenLocale.so.*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
    libcuda.so*|libnvJitLink.so*|libnvidia-*|libcudart.so*|libcublas*|libnvrtc*|libnvvm.so*) return 0 ;;
  esac
  return 1
}

# --- Inside a private mount namespace (re-executed below, as root) ----------
if [ "${1:-}" = "--in-namespace" ]; then
  R=$2  # $3: CUDA
  mount -t proc proc "$R/proc"
  mount --bind /dev "$R/dev"
  exec "${BASH_SOURCE[0]}" --run "$R" /opt/kiln /opt/smoke/client_smoke "$3"
fi

# --- The run: kilnd, kilnctl, client_smoke ------------------------------------
# --run CHROOT|"" KILN_DIR SMOKE CUDA(0|1): paths are inside CHROOT when it
# is set; CUDA=1: nvJitLink is there, so also cross-compile for sm_90.
if [ "${1:-}" = "--run" ]; then
  R=$2 KD=$3 SMOKE=$4 CUDA=$5
  chroot=$(command -v chroot || true)
  # A plain command, not a function: `... &` then execs it, so $! is kilnd.
  if [ -n "$R" ]; then run=(env -i "$chroot" "$R"); else run=(env -i); fi
  in_root() { "${run[@]}" "$@"; }
  host() { echo "$R$1"; }  # a path inside the run, seen from here
  rm -rf "$(host /tmp/kiln-check)"
  mkdir -p -m 0700 "$(host /tmp/kiln-check)" "$(host /tmp/kiln-check/data)"
  "${run[@]}" "$KD/bin/kilnd" --listen=127.0.0.1:0 --port_file=/tmp/kiln-check/port \
    --metrics_listen=127.0.0.1:0 --data_dir=/tmp/kiln-check/data --compile_threads=1 >"$(host /tmp/kiln-check/kilnd.log)" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  for _ in $(seq 300); do
    [ -s "$(host /tmp/kiln-check/port)" ] && break
    kill -0 $pid 2>/dev/null || { cat "$(host /tmp/kiln-check/kilnd.log)" >&2; die "kilnd exited"; }
    sleep 0.1
  done
  [ -s "$(host /tmp/kiln-check/port)" ] || die "kilnd wrote no port file in 30 s"
  server=127.0.0.1:$(cat "$(host /tmp/kiln-check/port)")
  fail() { cat "$(host /tmp/kiln-check/kilnd.log)" >&2; die "$*"; }

  out=$(in_root "$KD/bin/kilnctl" --server="$server" health 2>&1) || fail "kilnctl health: $out"
  [[ "$out" == "SERVING "* ]] || fail "kilnctl health printed: $out"
  graph=$KD/share/kiln/examples/graphs/chain10.json
  first=$(in_root "$KD/bin/kilnctl" --server="$server" compile "$graph" --run 2>&1) ||
    fail "kilnctl compile (1st): $first"
  second=$(in_root "$KD/bin/kilnctl" --server="$server" compile "$graph" --run 2>&1) ||
    fail "kilnctl compile (2nd): $second"
  grep -qw compiled <<<"$first" && grep -qw PASS <<<"$first" || fail "1st compile, not compiled+PASS: $first"
  grep -qw hit <<<"$second" && grep -qw PASS <<<"$second" || fail "2nd compile, not hit+PASS: $second"
  smoke=$(in_root "$SMOKE" "$graph" "$server" 2>&1) || fail "client_smoke: $smoke"
  cuda="no nvJitLink here: no sm_90 compile"
  if [ "$CUDA" = 1 ]; then  # libdevice can only come from kiln/share/kiln here
    out=$(in_root "$KD/bin/kilnctl" --server="$server" compile "$graph" --target=sm_90 2>&1) ||
      fail "kilnctl compile --target=sm_90: $out"
    grep -qw compiled <<<"$out" || fail "kilnctl compile --target=sm_90 did not compile: $out"
    cuda="chain10 compiled for sm_90"
  fi

  # Every shared object kilnd has mapped (LLVM, lld's inputs, artifacts).
  # /proc/PID/maps names files from our root, not the chroot's.
  while read -r path; do
    case "$path" in
      "$(host "$KD")"/lib/*|/memfd:*) ;;
      *) is_system_lib "$(basename "$path")" || fail "kilnd mapped $path, not from the bundle" ;;
    esac
  done < <(awk '$6 ~ /\.so/ {print $6}' /proc/$pid/maps | sort -u)
  mapped=$(awk '$6 ~ /\.so/ {print $6}' /proc/$pid/maps | sort -u | grep -c "^$(host "$KD")/lib/" || true)

  kill -TERM $pid
  wait $pid || fail "kilnd exited with status $? after SIGTERM"
  trap - EXIT
  echo "health SERVING; chain10 compiled then hit, PASS; $cuda; ${smoke#client_smoke: }; kilnd mapped $mapped bundled libraries, no others but glibc/libstdc++"
  exit 0
fi

# --- Main ---------------------------------------------------------------------
TARBALL=$(realpath -m "${1:-$ROOT/build-bundle/kiln-linux-x86_64.tar.xz}")
[ -f "$TARBALL" ] || die "$TARBALL not found (make bundle builds it)"
for tool in g++ pkg-config patchelf ldd xz; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
start=$SECONDS
T=$(mktemp -d "${TMPDIR:-/tmp}/kiln-check-bundle.XXXXXX")
trap 'rm -rf "$T"' EXIT
X=$T/root/opt  # the bundle unpacks to $X/kiln, /opt/kiln inside the chroot
mkdir -p "$X"
tar -C "$X" -xJf "$TARBALL"
K=$X/kiln
[ -x "$K/bin/kilnd" ] && [ -x "$K/bin/kilnctl" ] || die "$TARBALL holds no kiln/bin/kilnd and kilnctl"

# 2. ldd in a clean environment.
nelf=0
for f in "$K"/bin/* "$K"/lib/*.so*; do
  [ -L "$f" ] && continue
  nelf=$((nelf + 1))
  ldd_out=$(env -i /usr/bin/ldd "$f") || die "ldd $f failed: $ldd_out"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system_lib "$name" && continue
    case "$(realpath -m "$path")" in
      "$K"/lib/*) ;;
      *) die "${f#"$X"/}: $name resolves to $path, not to kiln/lib" ;;
    esac
  done <<<"$ldd_out"
done

# 3. The client library from the bundle alone.
mkdir -p "$T/root/opt/smoke"
smoke=$T/root/opt/smoke/client_smoke
export PKG_CONFIG_PATH=$K/lib/pkgconfig
read -r -a cflags <<<"$(pkg-config --cflags kiln_client)"
read -r -a flags <<<"$(pkg-config --cflags --libs kiln_client)"
g++ -std=c++20 -M "$ROOT/tests/bundle/client_smoke.cc" "${cflags[@]}" >"$T/deps.txt" 2>&1 ||
  { cat "$T/deps.txt" >&2; die "client_smoke.cc does not compile with the bundle's headers"; }
outside=$(grep -oE '(/usr(/local)?/include/(absl|google|grpc)|'"$ROOT"'/(client|compiler|build[^/]*)/)[^ ]*' \
            "$T/deps.txt" | sort -u || true)
[ -z "$outside" ] || die "client_smoke.cc included headers from outside the bundle: $(head -3 <<<"$outside")"
g++ -std=c++20 -O1 -o "$smoke" "$ROOT/tests/bundle/client_smoke.cc" "${flags[@]}" >"$T/cc.log" 2>&1 ||
  { cat "$T/cc.log" >&2; die "client_smoke does not build against the bundle"; }
unset PKG_CONFIG_PATH

# 4. Run.
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null && command -v chroot >/dev/null; then
  R=$T/root
  mkdir -p "$R/lib/x86_64-linux-gnu" "$R/lib64" "$R/proc" "$R/dev" "$R/etc"
  install -d -m 1777 "$R/tmp"
  for lib in "${SYSTEM_LIBS[@]}"; do
    src=$(/sbin/ldconfig -p | awk -v n="$lib" '$1 == n && /x86-64/ && !found {print $NF; found = 1}')
    [ -n "$src" ] || continue
    cp -L "$src" "$R/lib/x86_64-linux-gnu/$lib"
  done
  cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
  # The GPU machine's nvJitLink (not bundled), where this machine has one.
  cuda=0
  src=$(/sbin/ldconfig -p | awk '$1 == "libnvJitLink.so.13" && /x86-64/ && !found {print $NF; found = 1}')
  if [ -n "$src" ]; then cp -L "$src" "$R/lib/x86_64-linux-gnu/"; cuda=1; fi
  patchelf --set-rpath /opt/kiln/lib "$smoke"
  mode="chroot (bundle + glibc/libstdc++ only)"
  summary=$(unshare -m --propagation private "${BASH_SOURCE[0]}" --in-namespace "$R" "$cuda")
else
  mode="in place (not root: no chroot)"
  cuda=0
  /sbin/ldconfig -p | grep -q 'libnvJitLink\.so\.13 ' && cuda=1
  summary=$("${BASH_SOURCE[0]}" --run "" "$K" "$smoke" "$cuda")
fi
echo "check-bundle: ok in $((SECONDS - start)) s: ldd of $nelf ELF files resolved in kiln/lib; client_smoke built from the bundle only; $mode, env -i: $summary"
