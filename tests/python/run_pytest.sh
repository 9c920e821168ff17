#!/usr/bin/env bash
# ctest's entry for the torch tests: makes sure the project's venv exists
# (deploy/python-env.sh: torch and pytest from PyPI, created once, a no-op
# afterwards) and runs pytest on tests/python with its python. Arguments go
# to pytest. KILN_LIB, KILN_KILND and KILN_PYTHON_DIR come from ctest.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
PY="$(bash "$root/deploy/python-env.sh" | tail -n 1)"
cd "$here"
# -p no:cacheprovider: nothing written into the source tree.
exec "$PY" -m pytest -p no:cacheprovider -q -ra "$@" "$here"/test_*.py
