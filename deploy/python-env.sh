#!/usr/bin/env bash
# The project's Python environment for the torch tests (tests/python/): a
# venv with torch, pytest, numpy (torch warns without it) and setuptools
# (the tests pip-install python/ without build isolation: 70.1 or later,
# which builds wheels without the `wheel` package) from PyPI,
# created on first use under
#   ${KILN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/venv}
# and a quick no-op afterwards (a stamp file records what was installed).
# Prints the venv's python on stdout (the last line), so callers can do
#   PY=$(bash deploy/python-env.sh)
# `make test` runs it (Makefile target `python-env`) before ctest.
#
# torch comes from PyPI as `pip install torch` gives it (on Linux x86-64 the
# CUDA build, which runs on a CPU too); the version range is pinned below.
# Environment:
#   KILN_VENV          where the venv lives (default above)
#   KILN_PYTHON        the interpreter that creates it (default: python3,
#                      preferring /usr/bin/python3)
#   KILN_TORCH_SPEC    the torch requirement (default below)
#   KILN_VENV_SUFFIX   appended to the venv's directory: a second venv for
#                      another torch (ctest's python_torch_oldest_test:
#                      -torch2.6 with KILN_TORCH_SPEC="torch==2.6.*")
set -euo pipefail

VENV="${KILN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/venv}${KILN_VENV_SUFFIX:-}"
TORCH_SPEC="${KILN_TORCH_SPEC:-torch>=2.6,<3}"
PYTEST_SPEC="pytest>=7"
STAMP="$VENV/.kiln-stamp"
WANT="4 $TORCH_SPEC $PYTEST_SPEC"

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

BASE="${KILN_PYTHON:-}"
if [ -z "$BASE" ]; then
  if [ -x /usr/bin/python3 ]; then BASE=/usr/bin/python3; else BASE=python3; fi
fi

# Only one creator at a time (parallel `make test`s share the cache dir).
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "$VENV/bin/python"
  exit 0
fi

echo "kiln: creating the Python test environment in $VENV ($TORCH_SPEC, pytest; a few GB, once)" >&2
if [ ! -x "$VENV/bin/python" ]; then
  "$BASE" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  "$TORCH_SPEC" "$PYTEST_SPEC" numpy "setuptools>=70.1" >&2
"$VENV/bin/python" -c "import torch, pytest; print('kiln: torch', torch.__version__, file=__import__('sys').stderr)" >&2
echo "$WANT" >"$STAMP"
echo "$VENV/bin/python"
