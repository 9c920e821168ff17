#!/usr/bin/env bash
# Layers point one way (README, Layout): the client side — libkiln_c.so,
# kilnctl — links graph/ and runtime/, never the compiler's lowering, fusion
# or code generators, nor LLVM. Fails naming the binary and the symbols.
# Usage: layers_test.sh BINARY...
set -euo pipefail
status=0
for bin in "$@"; do
  # Defined symbols of the compiler's lowering half, and anything of LLVM.
  found=$(nm -C --defined-only "$bin" 2>/dev/null |
    grep -E ' kiln::(Lower\(|LowerContext|OpLowerings|Fuse\(|EmitCpuModule|EmitCudaModule|SplitLongReductions|PlanGpuLaunches)|llvm::' |
    head -5 || true)
  needed=$(readelf -d "$bin" | grep -E 'NEEDED.*libLLVM' || true)
  if [ -n "$found$needed" ]; then
    echo "FAIL: $bin links code it must not:"
    echo "$found"
    echo "$needed"
    status=1
  else
    echo "ok: $bin ($(nm --defined-only "$bin" | wc -l) symbols, none of the lowering or LLVM)"
  fi
done
exit $status
