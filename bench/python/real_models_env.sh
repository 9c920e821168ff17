#!/usr/bin/env bash
# The libraries bench/python/real_models.py takes its models from —
# torchvision, transformers, timm — installed from PyPI into a directory of
# their own (default ${XDG_CACHE_HOME:-$HOME/.cache}/kiln/real-models, or
# KILN_REAL_MODELS_DIR) that real_models.py appends to sys.path after the
# project venv's, so the venv's torch and numpy stay the ones in use.
# torchvision and timm come without their dependencies (their torch pin
# would bring another torch); transformers needs no torch. Not part of
# `make test`. Idempotent: a second run only checks.
set -euo pipefail
DIR="${KILN_REAL_MODELS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/real-models}"
PY=$(bash "$(dirname "$0")/../../deploy/python-env.sh")
if PYTHONPATH="$DIR" "$PY" -c "import torchvision, transformers, timm" 2>/dev/null; then
  echo "$DIR"
  exit 0
fi
mkdir -p "$DIR"
"$PY" -m pip install -q --upgrade --target "$DIR" --no-deps torchvision timm
"$PY" -m pip install -q --upgrade --target "$DIR" transformers huggingface_hub safetensors pyyaml pillow
echo "$DIR"
