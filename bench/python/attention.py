"""Attention forward + backward: PyTorch's fused kernel (eager) against
Kiln's decomposition (kiln/attention.py: two GEMMs around a masked softmax)
and Inductor, side by side in one run, to place the "auto" policy's CUDA
threshold (CUDA_MAX_SCORES) on measurements.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/attention.py [--device cuda] [--server HOST:PORT]

Rows: causal self-attention q, k, v of shape (batch, heads, seq, 64), in
bfloat16 on CUDA (float32 on the CPU), score elements = batch*heads*seq^2.
Median of 7 timings of 10 steps (CUDA: events around them). A private
kilnd on an ephemeral port unless --server is given.
"""

from __future__ import annotations

import argparse
import warnings

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd, step_ms

import torch
import torch.nn.functional as F

import kiln


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--server")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes = ([(8, 12, 256), (8, 12, 512), (8, 12, 1024), (4, 16, 2048)]
              if cuda else [(4, 8, 128), (2, 8, 512)])
    daemon = None if a.server else Kilnd()
    server = a.server or daemon.address

    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"attention fwd+bwd, causal, head dim 64, {dtype}, {where}, "
          f"torch {torch.__version__}; ms per step (median of 7 x 10)")
    print(f"{'batch x heads x seq':<22} {'scores':>10} {'eager':>8} "
          f"{'inductor':>9} {'kiln':>8} {'kiln/eager':>10}")
    try:
        for b, h, t in shapes:
            g = torch.Generator(device=a.device).manual_seed(0)
            q, k, v = (torch.randn(b, h, t, 64, device=a.device, dtype=dtype,
                                   generator=g).requires_grad_()
                       for _ in range(3))
            row = {"eager": step_ms(lambda: attn(q, k, v).sum(), cuda)}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch._dynamo.reset()
                ind = torch.compile(attn)
                row["inductor"] = step_ms(lambda: ind(q, k, v).sum(), cuda)
                torch._dynamo.reset()
                backend = kiln.backend(server=server, fallback="error",
                                       attention="decompose")
                kln = torch.compile(attn, backend=backend)
                row["kiln"] = step_ms(lambda: kln(q, k, v).sum(), cuda)
            print(f"{f'{b} x {h} x {t}':<22} {b * h * t * t:>10} "
                  f"{row['eager']:>8.3f} {row['inductor']:>9.3f} "
                  f"{row['kiln']:>8.3f} {row['kiln'] / row['eager']:>9.2f}x",
                  flush=True)
    finally:
        if daemon:
            daemon.stop()


if __name__ == "__main__":
    main()
