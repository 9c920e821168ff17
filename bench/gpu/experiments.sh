#!/usr/bin/env bash
# Variants behind bench/README.md's GPU notes, on a GPU machine with the
# bundle unpacked (KILN=<dir>/kiln): accurate vs fast-math chains, groups
# per thread for persistent rows, and which instructions Inductor's Triton
# kernels use for sin/exp/division (from the PTX in Triton's cache).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bench=${KILN_CUDA_BENCH:-$KILN/bin/cuda_bench}
py=${PYTHON:-python3}
g=$(mktemp -d)
for n in 10 30; do
  $py "$root/examples/graphs/gen_chain.py" $n --rows 65536 --cols 1024 >"$g/c$n.json"
  "$bench" bandwidth "$g/c$n.json" --name=chain${n} --calls=20 --batches=10
  "$bench" bandwidth "$g/c$n.json" --name=chain${n}_fastmath --fast_math --calls=20 --batches=10
done
for op in layernorm softmax; do
  for shape in "16384 4096" "4096 32768" "16384 1024"; do
    $py "$here/gen_graphs.py" $op $shape >"$g/r.json"
    for gpt in 1 2 4 8; do
      "$bench" bandwidth "$g/r.json" --name=${op}_${shape/ /x}_g$gpt --groups_per_thread=$gpt --calls=20 --batches=10 | grep -E "kiln_us|kiln_gbs"
    done
  done
done
export TRITON_CACHE_DIR=$g/triton
$py "$here/torch_bench.py" chain chain10 10 67108864
$py "$here/torch_bench.py" chain chain30 30 67108864
for f in $(find "$g/triton" -name '*.ptx'); do
  echo "$(basename "$f"): $(grep -c . "$f") lines;" \
    "sin.approx $(grep -c 'sin.approx' "$f") ex2.approx $(grep -c 'ex2.approx' "$f")" \
    "div.full $(grep -c 'div.full' "$f") div.rn $(grep -c 'div.rn' "$f")" \
    "rcp.approx $(grep -c 'rcp.approx' "$f") fma $(grep -c 'fma.rn' "$f") call $(grep -c 'call' "$f")"
done
