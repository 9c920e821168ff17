#!/usr/bin/env bash
# The libraries bench/python/real_models.py takes its models from —
# torchvision, transformers, timm — installed from PyPI into a directory of
# their own (default ${XDG_CACHE_HOME:-$HOME/.cache}/kiln/real-models, or
# KILN_REAL_MODELS_DIR) that real_models.py appends to sys.path after the
# project venv's, so the venv's torch and numpy stay the ones in use.
# torchvision and timm come without their dependencies (their torch pin
# would bring another torch); transformers needs no torch. Not part of
# `make test`. Idempotent: a second run only checks.
#
#   real_models_env.sh --slim-tar OUT.tar.xz
# also packs a copy for the GPU machine (deploy/run-on-gpu.sh realmodels,
# KILN_REAL_MODELS_TAR) small enough to carry (~11 MiB): transformers'
# models limited to real_models.py's (and a few MoE and complex-rotary
# ones its hf: names reach), without torchvision's bundled
# libraries (its pure-Python models are what runs there), the hub's
# download helpers, numpy and pillow (the GPU machine's own are used) and
# tokenizers (only Whisper needs it).
set -euo pipefail
DIR="${KILN_REAL_MODELS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/real-models}"
PY=$(bash "$(dirname "$0")/../../deploy/python-env.sh")
slim=""
if [[ ${1:-} == --slim-tar ]]; then
  slim=$(realpath -m "${2:?--slim-tar OUT.tar.xz}")
fi
pack_slim() {
  local stage
  stage=$(mktemp -d)
  cp -a "$DIR"/. "$stage"/
  rm -rf "$stage"/torchvision.libs "$stage"/filelock* "$stage"/fsspec* \
    "$stage"/hf_xet* "$stage"/bin "$stage"/pillow.libs \
    "$stage"/PIL "$stage"/numpy* "$stage"/pygments* \
    "$stage"/tokenizers*
  find "$stage" -name __pycache__ -prune -exec rm -rf {} +
  local keep="auto bert gpt2 llama mistral qwen2 distilbert roberta vit t5
    bart albert electra deberta_v2 opt gpt_neox phi gemma mixtral falcon bloom
    swin convnext clip whisper beit dinov2 gpt_bigcode mobilebert segformer
    squeezebert xlnet wav2vec2 llama4 qwen3 qwen3_moe ernie4_5_moe"
  for m in "$stage"/transformers/models/*/; do
    local name
    name=$(basename "$m")
    [[ " $(echo $keep) " == *" $name "* ]] || rm -rf "$m"
  done
  tar -cJf "$slim" -C "$stage" .
  rm -rf "$stage"
  echo "$slim: $(du -h "$slim" | cut -f1)"
}
if PYTHONPATH="$DIR" "$PY" -c "import torchvision, transformers, timm" 2>/dev/null; then
  [[ -n $slim ]] && pack_slim
  echo "$DIR"
  exit 0
fi
mkdir -p "$DIR"
"$PY" -m pip install -q --upgrade --target "$DIR" --no-deps torchvision timm
"$PY" -m pip install -q --upgrade --target "$DIR" transformers huggingface_hub safetensors pyyaml pillow
[[ -n $slim ]] && pack_slim
echo "$DIR"
