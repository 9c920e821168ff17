#!/usr/bin/env bash
# `make wheel`: a self-contained wheel of the Python package with kilnd,
# kilnctl, libkiln_c.so and every shared library they need but glibc,
# libstdc++ and NVIDIA's (deploy/make_wheel.py has the layout), so that
#   pip install dist/kiln-*.whl
# works on a machine without gRPC, RocksDB or LLVM.
#
#   deploy/wheel.sh [--build-dir DIR] [--from-build] [--out-dir DIR] [--jobs N]
#
# By default it makes the Release build of deploy/bundle.sh in build-bundle
# (long the first time); --from-build packs an existing build tree as it is
# (tests/python/wheel_test.sh packs the test build that way). Prints the
# wheel's path on its last line.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build-bundle"
OUT_DIR="$ROOT/dist"
JOBS=2
ARGS=()

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=$(realpath -m "${2:?--build-dir needs a value}"); shift 2 ;;
    --build-dir=*) BUILD=$(realpath -m "${1#*=}"); shift ;;
    --out-dir) OUT_DIR=$(realpath -m "${2:?--out-dir needs a value}"); shift 2 ;;
    --out-dir=*) OUT_DIR=$(realpath -m "${1#*=}"); shift ;;
    --jobs) JOBS="${2:?--jobs needs a value}"; shift 2 ;;
    --jobs=*) JOBS="${1#*=}"; shift ;;
    --from-build) ARGS+=(--from-build); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "wheel.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

STAGE=$(bash "$ROOT/deploy/bundle.sh" --build-dir "$BUILD" --jobs "$JOBS" \
  --stage-only ${ARGS[@]+"${ARGS[@]}"} | tail -n 1)
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
"$PY" "$ROOT/deploy/make_wheel.py" --stage "$STAGE" \
  --pyproject "$ROOT/python/pyproject.toml" --out-dir "$OUT_DIR"
