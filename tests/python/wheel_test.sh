#!/usr/bin/env bash
# ctest's wheel_test (issue 15 item 1): the wheel of `make wheel`, packed
# here from the test build (deploy/wheel.sh --from-build), installed with pip
# from the file alone (--no-index) and used as a newcomer would:
#   1. a fresh venv without torch: `import kiln` works, libkiln_c.so loads
#      from the wheel, and kilnd, kilnctl and the library need nothing
#      outside the wheel but glibc, libstdc++/libgcc_s and NVIDIA's;
#      the `kilnctl` command runs;
#   2. the project's torch venv with the wheel on its path and no KILN_*
#      variables: torch.compile(model, backend="kiln") finds the backend by
#      its entry point, autostarts the wheel's kilnd on a Unix socket, runs
#      forward and backward in Kiln and matches eager;
#   3. the same without the shipped extension: it is built from the wheel's
#      source on first use (kiln/_ext_build.py) and the fast path loads it.
# KILN_BUILD_DIR (set by ctest) is the build tree to pack.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
BUILD="${KILN_BUILD_DIR:?set KILN_BUILD_DIR to the build tree}"
PY="$(bash "$root/deploy/python-env.sh" | tail -n 1)"
BASE=python3
[ -x /usr/bin/python3 ] && BASE=/usr/bin/python3

T=$(mktemp -d /tmp/kiln_wheel.XXXXXX)
cleanup() {
  for pidfile in "$T"/run*/kiln/kilnd.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "wheel_test: FAIL: $*" >&2; exit 1; }

WHL=$(bash "$root/deploy/wheel.sh" --build-dir "$BUILD" --from-build --out-dir "$T/dist" | tail -n 1)
[ -f "$WHL" ] || fail "no wheel made"
echo "wheel: $(basename "$WHL") ($(( $(stat -c %s "$WHL") / 1048576 )) MiB)"

# --- 1. a fresh venv without torch ------------------------------------------
"$BASE" -m venv "$T/bare"
"$T/bare/bin/pip" install --quiet --no-index --disable-pip-version-check "$WHL"
SITE=$("$T/bare/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
NATIVE="$SITE/kiln/_native"
clean_env=(env -u KILN_LIB -u KILN_KILND -u KILN_SERVER -u LD_LIBRARY_PATH -u PYTHONPATH)
(cd / && "${clean_env[@]}" "$T/bare/bin/python" - "$NATIVE" <<'EOF'
import sys
import kiln
from kiln import _binding
assert "torch" not in sys.modules, "kiln imported torch"
_binding.load_library()
assert str(_binding._lib_path).startswith(sys.argv[1]), _binding._lib_path
ops = kiln.supported_ops()
assert "aten.add.Tensor" in ops and "aten.mm.default" in ops, len(ops)
print(f"bare venv: kiln imports without torch; {len(ops)} ops from {_binding._lib_path}")
EOF
) || fail "the bare venv could not use the wheel"

# Every shared library the native parts load resolves inside the wheel, or
# is one the wheel leaves to the system on purpose (deploy/bundle.sh).
for elf in "$NATIVE/bin/kilnd" "$NATIVE/bin/kilnctl" "$NATIVE/lib/libkiln_c.so.1"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$name" in
      linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*) continue ;;
      libresolv.so.*|libutil.so.*|libstdc++.so.*|libgcc_s.so.*) continue ;;
    esac
    case "$(realpath -m "$path")" in
      "$(realpath -m "$NATIVE/lib")/"*) ;;
      *) fail "$(basename "$elf") loads $name from $path, outside the wheel" ;;
    esac
  done < <(env -u LD_LIBRARY_PATH ldd "$elf")
done
# (kilnctl --help exits 1, as absl's flag help does: its text is the check.)
help=$("$T/bare/bin/kilnctl" --help 2>&1 || true)
grep -q "usage: kilnctl" <<<"$help" || fail "the kilnctl command did not run: $help"
echo "bare venv: kilnd, kilnctl and libkiln_c.so need only the system's glibc/libstdc++"

# --- 2. torch.compile by name, autostarted kilnd from the wheel -------------
"$T/bare/bin/pip" install --quiet --no-index --disable-pip-version-check \
  --target "$T/site" "$WHL"
run_model() {  # $1: runtime dir, $2: cache dir, $3: expected extension origin
  (cd / && "${clean_env[@]}" PYTHONPATH="$T/site" XDG_RUNTIME_DIR="$1" \
     XDG_CACHE_HOME="$2" KILN_IDLE_EXIT_SECONDS=120 "$PY" - "$T/site" "$1" "$3" <<'EOF'
import os, pathlib, sys, warnings
import torch
import kiln
from kiln import _binding, dynamo
site, run, ext_origin = sys.argv[1:4]
warnings.simplefilter("error", RuntimeWarning)  # a fallback warning fails
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                            torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
x = torch.randn(8, 16)
ref = model(x)
ref.sum().backward()
ref_grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
out = torch.compile(model, backend="kiln")(x)  # by name: the entry point
out.sum().backward()
torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
for p, g in zip(model.parameters(), ref_grads):
    torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)
report = dynamo.default_backend().report
assert report.compiled_partitions >= 2 and report.kiln_nodes > 0, str(report)
assert str(_binding._lib_path).startswith(site), _binding._lib_path
pid = int((pathlib.Path(run) / "kiln" / "kilnd.pid").read_text())
exe = os.readlink(f"/proc/{pid}/exe")
assert exe.startswith(site), exe
ext = _binding.extension()
assert ext is not None, "no _kiln_call: the fast call path is off"
assert ext.__file__.startswith(ext_origin), (ext.__file__, ext_origin)
print(f"torch venv: backend='kiln' by name, {report.kiln_nodes} ATen nodes in "
      f"{report.compiled_partitions} partitions, autostarted {exe}, extension {ext.__file__}")
EOF
  )
}
run_model "$T/run1" "$T/cache1" "$T/site/kiln/_native/lib" ||
  fail "torch.compile through the wheel failed"

# --- 3. no shipped extension: built from the wheel's source on first use ----
if ls "$T/site/kiln/_native/lib"/_kiln_call*.so >/dev/null 2>&1; then
  rm -f "$T/site/kiln/_native/lib"/_kiln_call*.so
fi
run_model "$T/run2" "$T/cache2" "$T/cache2/kiln/ext" ||
  fail "the extension was not built on first use"
echo "wheel_test: OK"
