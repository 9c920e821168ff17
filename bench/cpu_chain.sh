#!/usr/bin/env bash
# Fused vs unfused Kiln CPU kernels on chain-N, memcpy of the same bytes, and
# eager PyTorch (Debian's python3-torch 1.13, 2 threads) on chain-10, all in
# one run on this machine. Usage: bench/cpu_chain.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
cmake --build "$BUILD" -j2 --target cpu_chain_bench >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
graphs=()
for n in 1 10 30; do
  for rows in 1024 16384; do   # 2^20 and 2^24 float32 elements (x 1024 cols)
    f="$tmp/chain${n}_$([ $rows = 1024 ] && echo 2^20 || echo 2^24).json"
    /usr/bin/python3 examples/graphs/gen_chain.py "$n" --rows "$rows" --cols 1024 > "$f"
    graphs+=("$f")
  done
done
echo "== Kiln (2 threads) =="
"$BUILD/bench/compiler/cpu_chain_bench" "${graphs[@]}"
echo "== eager PyTorch, chain-10 on 2^24 float32, 2 threads =="
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "python3-torch is not installed: apt-get install python3-torch" >&2
  exit 0
fi
/usr/bin/python3 - <<'PY'
import statistics, time, torch
torch.set_num_threads(2)
x = torch.rand(16384, 1024) * 4 - 2
def chain10(x):
    x = x + 0.1; x = torch.sin(x); x = x * 1.1; x = torch.cos(x); x = x + 0.2
    x = torch.relu(x); x = x - 0.1; x = torch.exp(x * 0.5); x = x + 0.3; x = torch.sigmoid(x)
    return x
def med(f, runs=7):
    for _ in range(2): f()
    t = []
    for _ in range(runs):
        t0 = time.perf_counter(); f(); t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)
print(f"torch {torch.__version__}: chain10 eager {med(lambda: chain10(x)):.3f} ms, "
      f"clone {med(lambda: x.clone()):.3f} ms")
PY
