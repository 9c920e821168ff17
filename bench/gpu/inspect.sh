#!/usr/bin/env bash
# Puts Kiln's kernel and Inductor's (Triton's) kernel for one chain-N graph
# on 2^26 float32 side by side: PTX, SASS and an Nsight Compute summary of
# each, so a gap in bench/gpu/run.sh's bandwidth table can be traced to
# instructions. Needs a GPU, python3 with torch, cuda_bench, and the CUDA
# toolkit's cuobjdump and ncu.
#
#   bench/gpu/inspect.sh N OUT_DIR [--fast_math]
#   KILN_CUDA_BENCH=/path/to/cuda_bench bench/gpu/inspect.sh 10 /tmp/i
#
# OUT_DIR/inspect-chainN.tar.gz holds kiln/ (the compiler's dump, kiln.sass,
# kiln.ncu.txt) and triton/ (Triton's cache, triton.sass, triton.ncu.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
n=${1:?usage: inspect.sh N OUT_DIR [--fast_math]}
out=${2:?usage: inspect.sh N OUT_DIR [--fast_math]}
shift 2
bench=${KILN_CUDA_BENCH:-$root/build/bench/gpu/cuda_bench}
py=${PYTHON:-python3}
cuda=${CUDA_HOME:-/usr/local/cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/kiln" "$work/triton" "$out"

$py "$root/examples/graphs/gen_chain.py" "$n" --rows 65536 --cols 1024 >"$work/chain.json"
KILN_DUMP_DIR=$work/kiln "$bench" bandwidth "$work/chain.json" --name=chain$n \
  --calls=20 --batches=5 "$@" | tee "$work/kiln/bench.txt"
TRITON_CACHE_DIR=$work/triton/cache $py "$here/torch_bench.py" chain chain$n "$n" 67108864 |
  tee "$work/triton/bench.txt"

# Kiln's cubin is not dumped (only its PTX and nvJitLink's log): assemble
# the dumped PTX the same way for the SASS listing.
ptx=$(find "$work/kiln" -name 06-kernels.ptx | head -1)
"$cuda/bin/ptxas" -arch=sm_90 -O3 "$ptx" -o "$work/kiln/kiln.cubin"
"$cuda/bin/cuobjdump" -sass "$work/kiln/kiln.cubin" >"$work/kiln/kiln.sass"
: >"$work/triton/triton.sass"
find "$work/triton/cache" -name '*.cubin' | while read -r c; do
  echo "== $c" >>"$work/triton/triton.sass"
  "$cuda/bin/cuobjdump" -sass "$c" >>"$work/triton/triton.sass"
done

sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats --section WarpStateStats"
"$cuda/bin/ncu" $sections -k regex:kiln -c 1 "$bench" bandwidth "$work/chain.json" \
  --calls=1 --batches=1 "$@" >"$work/kiln/kiln.ncu.txt" 2>&1 || true
TRITON_CACHE_DIR=$work/triton/cache "$cuda/bin/ncu" $sections -k regex:triton -c 1 \
  $py "$here/torch_bench.py" chain chain$n "$n" 67108864 >"$work/triton/triton.ncu.txt" 2>&1 || true
for f in "$work/kiln/kiln.sass" "$work/triton/triton.sass"; do
  echo "$f: $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' "$f") SASS instructions"
done
tar -czf "$out/inspect-chain$n.tar.gz" -C "$work" kiln triton
