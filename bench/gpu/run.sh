#!/usr/bin/env bash
# The GPU benchmarks of TARGETS.md, Kiln and PyTorch (eager and Inductor)
# in the same run on the same GPU:
#   - launch overhead: chain-N + sum() for N = 1, 5, ..., 30 on 8x16 float32
#     and on (4..13)x16 (dynamic), per call;
#   - bandwidth: chain-1/5/10/30 on 2^26 float32 against a device copy;
#     softmax and layer norm on 16384x1024, 16384x4096, 4096x32768;
#     row sums over few long rows (1x2^26, 64x2^20, 16x2^22); var, softmax
#     and layer norm over few long rows (fissioned and split); argmax over
#     few long rows (split); sum + amax of the same rows (two outputs, split).
# Needs a GPU, python3 with torch, and cuda_bench (built with the CUDA
# backend; on a machine without the build, from the relocatable bundle).
#
#   bench/gpu/run.sh [OUT_DIR]
#   KILN_CUDA_BENCH=/path/to/cuda_bench PYTHON=python3 bench/gpu/run.sh
#   KILN_BENCH_ONLY=launch|bandwidth|sum bench/gpu/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bench=${KILN_CUDA_BENCH:-$root/build/bench/gpu/cuda_bench}
py=${PYTHON:-python3}
only=${KILN_BENCH_ONLY:-all}
out=${1:-$(mktemp -d)}
mkdir -p "$out/graphs"
results=$out/results.txt
: >"$results"
g=$out/graphs

if [[ $only == all || $only == launch ]]; then
  for n in 1 5 10 15 20 25 30; do
    $py "$root/examples/graphs/gen_chain.py" $n --sum >"$g/launch$n.json"
    $py "$root/examples/graphs/gen_chain.py" $n --sum --rows s0 >"$g/launch${n}_dyn.json"
    "$bench" launch "$g/launch$n.json" --name=launch$n >>"$results"
    "$bench" launch "$g/launch${n}_dyn.json" --name=launch${n}_dyn \
      --sizes=4,5,6,7,8,9,10,11,12,13 >>"$results"
    $py "$here/torch_bench.py" launch launch$n $n >>"$results"
    $py "$here/torch_bench.py" launch launch${n}_dyn $n --dynamic >>"$results"
  done
fi
if [[ $only == all || $only == bandwidth ]]; then
  for n in 1 5 10 30; do
    $py "$root/examples/graphs/gen_chain.py" $n --rows 65536 --cols 1024 >"$g/chain$n.json"
    "$bench" bandwidth "$g/chain$n.json" --name=chain${n}_2e26 --calls=20 --batches=10 >>"$results"
    # Kiln with fast_math (part of the key): approximate exp/log/division,
    # accurate sin/cos, Triton's defaults. Compared with the same Inductor row.
    "$bench" bandwidth "$g/chain$n.json" --name=chain${n}_2e26_fastmath --fast_math \
      --calls=20 --batches=10 >>"$results"
    $py "$here/torch_bench.py" chain chain${n}_2e26 $n 67108864 >>"$results"
  done
  for shape in 16384x1024 16384x4096 4096x32768; do
    r=${shape%x*}
    c=${shape#*x}
    for op in softmax layernorm; do
      $py "$here/gen_graphs.py" $op $r $c >"$g/$op$shape.json"
      "$bench" bandwidth "$g/$op$shape.json" --name=$op$shape --calls=20 --batches=10 >>"$results"
      $py "$here/torch_bench.py" $op $op$shape $r $c >>"$results"
    done
  done
fi
if [[ $only == all || $only == bandwidth || $only == sum ]]; then
  # Few long rows: the split reduction (compiler/split_reductions.h).
  for shape in 1x67108864 64x1048576 16x4194304; do
    r=${shape%x*}
    c=${shape#*x}
    $py "$here/gen_graphs.py" sum $r $c >"$g/sum$shape.json"
    "$bench" bandwidth "$g/sum$shape.json" --name=sum$shape --calls=20 --batches=10 >>"$results"
    "$bench" bandwidth "$g/sum$shape.json" --name=sum${shape}_unsplit --split_reductions=0 \
      --calls=5 --batches=5 >>"$results"
    $py "$here/torch_bench.py" sum sum$shape $r $c >>"$results"
  done
  # Few long rows of multi-pass row kernels: fissioned, then split.
  # (argmax: one pass, split as a pair of the chunk's max and its position.)
  for case in var:1x67108864 var:16x4194304 softmax:16x4194304 layernorm:16x4194304 \
    argmax:1x67108864 argmax:16x131072 sum_amax:16x4194304 sum_amax:64x1048576; do
    op=${case%%:*}
    shape=${case#*:}
    r=${shape%x*}
    c=${shape#*x}
    $py "$here/gen_graphs.py" $op $r $c >"$g/$op$shape.json"
    "$bench" bandwidth "$g/$op$shape.json" --name=$op$shape --calls=20 --batches=10 >>"$results"
    "$bench" bandwidth "$g/$op$shape.json" --name=$op${shape}_unsplit --split_reductions=0 \
      --calls=3 --batches=3 >>"$results"
    $py "$here/torch_bench.py" $op $op$shape $r $c >>"$results"
  done
fi
$py "$here/table.py" "$results"
