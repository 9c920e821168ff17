"""Dropout at 2^26 float32 elements on the CPU (issue 17 item 3):
F.dropout(x, p=0.1, training=True) through torch.compile(backend=kiln)
(Philox4x32-10 in the fused kernel: the output and the bool mask in one
pass) against eager PyTorch (bernoulli_ from mt19937, then the multiply)
and, with --inductor, torch.compile's default backend. Forward only; the
milliseconds per call are the median of --iters calls after a warm-up.
Also prints the keep fraction of each, as a check.

    PY=$(bash deploy/python-env.sh)
    build/server/kilnd --listen=127.0.0.1:7799 --metrics_listen= &
    KILN_LIB=build/client/libkiln_c.so PYTHONPATH=python \\
      $PY bench/python/dropout.py --server 127.0.0.1:7799 [--threads 2]
"""

import argparse
import statistics
import time

import torch

import kiln


def median_ms(fn, x, iters, warmup=2):
    for _ in range(warmup):
        fn(x)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--log2", type=int, default=26)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--inductor", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    n = 1 << a.log2

    def drop(x):
        return torch.nn.functional.dropout(x, 0.1, True)

    x = torch.randn(n)
    rows = [("eager", drop)]
    rows.append(("kiln", torch.compile(
        drop, backend=kiln.backend(server=a.server, fallback="error"))))
    if a.inductor:
        rows.append(("inductor", torch.compile(drop)))
    gbytes = n * (4 + 4 + 1) / 1e9  # read x, write y and the mask
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"dropout p=0.1 over 2^{a.log2} float32")
    base = None
    with torch.no_grad():
        for name, fn in rows:
            ms = median_ms(fn, x, a.iters)
            base = base or ms
            keep = (fn(x) != 0).float().mean().item()
            print(f"{name:9s} {ms:9.1f} ms  {gbytes / ms * 1e3:6.2f} GB/s  "
                  f"eager/this {base / ms:5.2f}x  keep {keep:.4f}")


if __name__ == "__main__":
    main()
