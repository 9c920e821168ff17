"""Host cost of a compiled partition called from Python on the CPU
(issue 15 item 6, CPU side): torch.compile(backend=kiln) against eager and
against backend="aot_eager" (Dynamo + AOTAutograd, eager kernels: the
floor of any AOTAutograd backend), on a tiny
pointwise chain (the call overhead dominates) and on layer norm 4096x1024.

    PY=$(bash deploy/python-env.sh)
    build/server/kilnd --listen=127.0.0.1:7799 --metrics_listen= &
    KILN_LIB=build/client/libkiln_c.so PYTHONPATH=python \\
      $PY bench/python/cpu_call.py --server 127.0.0.1:7799
"""

import argparse
import time

import torch

import kiln


def per_call_us(fn, *args, iters=2000, warmup=50):
    for _ in range(warmup):
        fn(*args)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)

    def chain(x):
        return torch.tanh(x * 2 + 1).sigmoid()

    ln = torch.nn.LayerNorm(1024).eval()
    cases = [("chain 8x16", chain, torch.randn(8, 16), 2000),
             ("layer_norm 4096x1024", ln, torch.randn(4096, 1024), 20)]
    print(f"torch {torch.__version__}, 1 thread; microseconds per call (best of 5)")
    with torch.no_grad():
        for name, fn, x, iters in cases:
            backend = kiln.backend(server=a.server, fallback="error")
            compiled = torch.compile(fn, backend=backend)
            torch.testing.assert_close(compiled(x), fn(x), atol=1e-5, rtol=1e-5)
            floor = torch.compile(fn, backend="aot_eager")
            eager = per_call_us(fn, x, iters=iters)
            floor_us = per_call_us(floor, x, iters=iters)
            kiln_us = per_call_us(compiled, x, iters=iters)
            print(f"{name:24s} eager {eager:9.1f}  aot_eager {floor_us:9.1f}  "
                  f"kiln {kiln_us:9.1f}; partitions "
                  f"{backend.report.compiled_partitions}")


if __name__ == "__main__":
    main()
