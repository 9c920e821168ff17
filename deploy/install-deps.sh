#!/usr/bin/env bash
# Installs Kiln's build and test dependencies from Debian bookworm's
# repositories. Idempotent and quiet when everything is already present:
# `make serve` and `make test` call it on every run.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev libssl-dev zlib1g-dev libzstd-dev
  llvm-16-dev liblld-16-dev lld-16 clang-16 libclang-rt-16-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev libspdlog-dev libfmt-dev
  libopenblas0-pthread libdnnl-dev
  libhiredis-dev redis-server
  python3 python3-venv python3-dev patchelf xz-utils
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kiln: installing ${#missing[@]} missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
