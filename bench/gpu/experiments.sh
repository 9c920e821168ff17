#!/usr/bin/env bash
# Variants behind bench/README.md's GPU notes, on a GPU machine with the
# bundle unpacked (KILN=<dir>/kiln): accurate vs fast-math chains, groups
# per thread for persistent rows, and which instructions Inductor's Triton
# kernels use for sin/exp/division (from the PTX in Triton's cache).
#
#   KILN=/tmp/k/kiln bench/gpu/experiments.sh [vecwidth] [pwgroups] [lanes] [groups] [triton]
#
# vecwidth: chain-N on 2^26 float32 (N = 1..30, accurate and fast_math)
# with 4 elements per thread (--pointwise_vector_width=4, 128-bit accesses,
# the body unrolled 4 times), 2 (64-bit, twice) and 1 (scalar, once), each
# twice in turn, compile time and run time, next to Inductor in the same run
# (why gpu_launch.h keeps 4 over large ranges).
#
# pwgroups: chain-N on 2^26 float32 (N = 1..30, accurate and fast_math)
# with 1, 2 and 4 groups of 4 elements per thread (--pointwise_groups=G:
# every group's 128-bit load issued before any is computed), each twice in
# turn, next to Inductor (whose Triton kernels take 8 elements per thread
# as two 128-bit loads) in the same run (why gpu_launch.h takes 2 for light
# bodies).
#
# lanes: chain-N on 2^26 float32 (N = 5..30, accurate and fast_math) with
# the pointwise lanes unrolled (--lane_loop=0) and in a loop (=1), compile
# time and run time, next to Inductor in the same run. No argument: all.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bench=${KILN_CUDA_BENCH:-$KILN/bin/cuda_bench}
py=${PYTHON:-python3}
g=$(mktemp -d)
sections=("$@")
run_section() { [[ ${#sections[@]} -eq 0 || " ${sections[*]} " == *" $1 "* ]]; }

# chain-N on 2^26 float32 (N = 1..30, accurate and fast_math) with each
# value of cuda_bench's --FLAG, every value twice in turn, then Inductor.
#   sweep FLAG NAME_TAG VALUE...
sweep() {
  local flag=$1 tag=$2
  shift 2
  for n in 1 5 10 15 20 30; do
    $py "$root/examples/graphs/gen_chain.py" $n --rows 65536 --cols 1024 >"$g/c$n.json"
    for fm in "" --fast_math; do
      for rep in 1 2; do
        for v in "$@"; do
          "$bench" bandwidth "$g/c$n.json" --name=chain${n}${fm:+_fastmath}_$tag$v $fm \
            --$flag=$v --calls=20 --batches=10 | grep -E "kiln_us|compile_ms|kiln_err"
        done
      done
    done
    $py "$here/torch_bench.py" chain chain$n $n 67108864 | grep -E "inductor_us|copy_us"
  done
}
if run_section vecwidth; then sweep pointwise_vector_width vec 4 2 1; fi
if run_section pwgroups; then sweep pointwise_groups groups 1 2 4; fi
if run_section lanes; then
  for n in 1 5 10 15 20 30; do
    $py "$root/examples/graphs/gen_chain.py" $n --rows 65536 --cols 1024 >"$g/c$n.json"
    for fm in "" --fast_math; do
      for ll in 0 1; do
        "$bench" bandwidth "$g/c$n.json" --name=chain${n}${fm:+_fastmath}_lane_loop$ll $fm \
          --lane_loop=$ll --calls=20 --batches=10 | grep -E "kiln_us|compile_ms|kiln_err"
      done
    done
    $py "$here/torch_bench.py" chain chain$n $n 67108864 | grep inductor_us
  done
fi
run_section groups || exit 0
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
run_section triton || exit 0
export TRITON_CACHE_DIR=$g/triton
$py "$here/torch_bench.py" chain chain10 10 67108864
$py "$here/torch_bench.py" chain chain30 30 67108864
for f in $(find "$g/triton" -name '*.ptx'); do
  echo "$(basename "$f"): $(grep -c . "$f") lines;" \
    "sin.approx $(grep -c 'sin.approx' "$f") ex2.approx $(grep -c 'ex2.approx' "$f")" \
    "div.full $(grep -c 'div.full' "$f") div.rn $(grep -c 'div.rn' "$f")" \
    "rcp.approx $(grep -c 'rcp.approx' "$f") fma $(grep -c 'fma.rn' "$f") call $(grep -c 'call' "$f")"
done
