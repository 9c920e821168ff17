"""Pointwise ops on the CPU in float32, bfloat16 and float16: eager,
Inductor and Kiln side by side in one run, the backends interleaved
(session 34: float16 values convert with F16C's instructions where the CPU
has them, codegen_cpu.h's CpuCodegenOptions::f16c).

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/cpu_pointwise_dtypes.py [--rows 2048 --cols 3072 --threads 2]

Ops over x, y [rows, cols]: tanh-GELU(x), x + y, silu(x) * y, softmax of x
where y > 0 (-inf elsewhere), softmax of x, exp(x) * y, relu(x),
clamp(x, -1, 1), maximum(x, y), where(x > y, x, 2y). Milliseconds
per call: the median of --repeats timings of --iters calls. A private kilnd
on an ephemeral port serves unless --server is given.
"""

from __future__ import annotations

import argparse
import statistics

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd, ms_per_call

import torch
import torch.nn.functional as F

import kiln

OPS = {
    "gelu_tanh": lambda x, y: F.gelu(x, approximate="tanh"),
    "add": lambda x, y: x + y,
    "silu_mul": lambda x, y: F.silu(x) * y,
    # Half the scores masked, as a causal or padding mask does (session 36:
    # exp of -inf was slow in libmvec), and the same without a mask.
    "masked_softmax": lambda x, y: torch.softmax(
        torch.where(y > 0, x, float("-inf")), dim=-1
    ),
    "softmax": lambda x, y: torch.softmax(x, dim=-1),
    "exp_mul": lambda x, y: torch.exp(x) * y,
    # Compares and min/max (session 37: float16 ones ran one lane at a time).
    "relu": lambda x, y: torch.relu(x),
    "clamp": lambda x, y: torch.clamp(x, -1.0, 1.0),
    "maximum": lambda x, y: torch.maximum(x, y),
    "where_gt": lambda x, y: torch.where(x > y, x, y * 2),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=3072)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ops", default=",".join(OPS),
                    help="comma-separated subset of: " + ", ".join(OPS))
    ap.add_argument("--dtypes", default=",".join(DTYPES),
                    help="comma-separated subset of: " + ", ".join(DTYPES))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    kilnd = None if a.server else Kilnd()
    server = a.server or kilnd.address
    try:
        print(f"torch {torch.__version__}, {a.threads} threads, "
              f"[{a.rows}, {a.cols}]; ms per call")
        for dtype in (DTYPES[d] for d in a.dtypes.split(",")):
            torch.manual_seed(0)
            x = torch.randn(a.rows, a.cols, dtype=dtype)
            y = torch.randn(a.rows, a.cols, dtype=dtype)
            for name in a.ops.split(","):
                fn = OPS[name]
                torch._dynamo.reset()
                backends = {
                    "eager": fn,
                    "inductor": torch.compile(fn),
                    "kiln": torch.compile(fn, backend=kiln.backend(
                        server=server, fallback="error")),
                }
                want = fn(x, y).float()
                for b, f in backends.items():
                    err = (f(x, y).float() - want).abs().max().item()
                    assert err <= 0.02 * want.abs().max().item(), (b, err)
                times = {b: [] for b in backends}
                for _ in range(a.repeats):
                    for b, f in backends.items():
                        times[b].append(ms_per_call(lambda: f(x, y), a.iters,
                                                    False))
                ms = {b: statistics.median(t) for b, t in times.items()}
                print(f"  {str(dtype)[6:]:9} {name:14} " + "   ".join(
                    f"{b} {t:7.3f}" for b, t in ms.items()) +
                    f"   kiln / eager {ms['eager'] / ms['kiln']:.2f}x, "
                    f"kiln / inductor {ms['inductor'] / ms['kiln']:.2f}x")
    finally:
        if kilnd:
            kilnd.stop()


if __name__ == "__main__":
    main()
