#!/usr/bin/env bash
# Half-precision pointwise kernels on a GPU (session 34): tanh-GELU, its
# backward and x + y over bfloat16 [ROWS, COLS] (the MLP block's GELU,
# 8192 x 3072 by default), each with Kiln's default launch plan and with
# every combination of --pointwise_vector_width (4: 8-byte accesses of
# 16-bit values, 8: 16-byte) and --pointwise_groups (1, 2), next to eager
# and Inductor on the same op in the same run (bench/gpu/torch_bench.py).
# cuda_bench's figures: kiln_us per call, kiln_gbs and a device copy's GB/s.
#
#   KILN=<unpacked bundle>/kiln bench/gpu/half_pointwise.sh [ROWS COLS [DTYPE]]
#   HALF_OPS="gelu gelu_bwd" HALF_VARIANTS=0 ...   (fewer ops; default plan only)
#   (deploy/run-on-gpu.sh BUNDLE halfpointwise; the bundle built with
#   --extra build/bench/gpu/cuda_bench)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench=${KILN_CUDA_BENCH:-$KILN/bin/cuda_bench}
py=${PYTHON:-python3}
rows=${1:-8192} cols=${2:-3072} dtype=${3:-BFLOAT16}
torch_dtype=$(echo "$dtype" | tr 'A-Z' 'a-z')
g=$(mktemp -d)
trap 'rm -rf "$g"' EXIT
for op in ${HALF_OPS:-add gelu gelu_bwd}; do
  $py "$here/gen_graphs.py" $op "$rows" "$cols" "$dtype" >"$g/$op.json"
  "$bench" bandwidth "$g/$op.json" --name=${op}_default --calls=50 --batches=10
  [[ ${HALF_VARIANTS:-1} == 0 ]] || for v in 4 8; do
    for groups in 1 2; do
      "$bench" bandwidth "$g/$op.json" --name=${op}_v${v}_g${groups} \
        --pointwise_vector_width=$v --pointwise_groups=$groups \
        --calls=50 --batches=10
    done
  done
  $py "$here/torch_bench.py" $op $op "$rows" "$cols" "$torch_dtype"
done | grep -v compile_ms
