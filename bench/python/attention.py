"""Attention forward + backward: PyTorch's fused kernel (eager) against
Kiln's decomposition (kiln/attention.py: two GEMMs around a masked softmax),
Kiln's fused op (attention="fused": cuDNN's fused attention on CUDA) and
Inductor, side by side in one run, to place the "auto" policy's CUDA
threshold (CUDA_MAX_SCORES) on measurements.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/attention.py [--device cuda] [--server HOST:PORT]
        [--dropout P] [--bias head|batch]

Rows: causal self-attention (--no-causal: without the mask) q, k, v of
shape (batch, heads, seq, 64), in bfloat16 on CUDA (float32 on the CPU;
--dtype), score elements = batch*heads*seq^2.
Median of 7 timings of 10 steps (CUDA: events around them). A private
kilnd on an ephemeral port unless --server is given. --dropout P adds
dropout_p=P to every call (eager: PyTorch's fused kernel with dropout; Kiln
decomposed: native_dropout in Kiln's kernels; Kiln fused:
kiln::attention_dropout, cuDNN's own generator on CUDA). On the CPU
"Kiln fused" is the CPU runtime's flash kernel (runtime/cpu_attention.h).
--bias head|batch passes a learned additive bias, [1, H, T, T] or
[B, 1, T, T], that needs a gradient, as attn_mask (not causal then): Kiln
fused is kiln::attention_backward_dbias, whose cuDNN call gives the bias's
gradient on CUDA; eager is PyTorch's efficient-attention kernel.
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
    ap.add_argument("--shape", metavar="B,H,T,D",
                    help="one shape instead of the table's (head dim D)")
    ap.add_argument("--dropout", type=float, default=0.0, metavar="P",
                    help="dropout_p of every call (default 0)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--no-causal", dest="causal", action="store_false",
                    help="attention without the causal mask")
    ap.add_argument("--bias", choices=["none", "head", "batch"],
                    default="none",
                    help="a learned bias [1,H,T,T] (head) or [B,1,T,T] "
                         "(batch) that needs a gradient, as attn_mask")
    ap.add_argument("--profile", action="store_true",
                    help="after the table, torch.profiler's kernel times of "
                         "5 steps of each Kiln variant and eager at the "
                         "largest shape")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    dtype = getattr(torch, a.dtype) if a.dtype else (
        torch.bfloat16 if cuda else torch.float32)
    shapes = ([(8, 4, 64), (8, 12, 128), (8, 12, 256), (8, 12, 512),
               (8, 12, 1024), (4, 16, 2048)]
              if cuda else [(4, 8, 128), (2, 8, 512)])
    head_dim = 64
    if a.shape:
        b, h, t, head_dim = (int(x) for x in a.shape.split(","))
        shapes = [(b, h, t)]
    daemon = None if a.server else Kilnd()
    server = a.server or daemon.address

    if a.bias != "none":
        a.causal = False

    def attn(q, k, v, bias=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                              is_causal=a.causal,
                                              dropout_p=a.dropout)

    where = torch.cuda.get_device_name() if cuda else "CPU"
    causal = "causal" if a.causal else "not causal"
    if a.bias != "none":
        causal += f", learned bias ({a.bias})"
    print(f"attention fwd+bwd, {causal}, dropout {a.dropout}, head dim "
          f"{head_dim}, {dtype}, {where}, "
          f"torch {torch.__version__}; ms per step (median of 7 x 10)")
    print(f"{'batch x heads x seq':<22} {'scores':>10} {'eager':>8} "
          f"{'inductor':>9} {'kiln':>8} {'kiln fused':>10} "
          f"{'kiln/eager':>10} {'fused/eager':>11}")
    try:
        for b, h, t in shapes:
            g = torch.Generator(device=a.device).manual_seed(0)
            q, k, v = (torch.randn(b, h, t, head_dim, device=a.device,
                                   dtype=dtype, generator=g).requires_grad_()
                       for _ in range(3))
            bias = None
            if a.bias != "none":
                bias = torch.randn(
                    (1, h, t, t) if a.bias == "head" else (b, 1, t, t),
                    device=a.device, dtype=dtype,
                    generator=g).requires_grad_()
            row = {"eager": step_ms(lambda: attn(q, k, v, bias).sum(), cuda)}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch._dynamo.reset()
                ind = torch.compile(attn)
                row["inductor"] = step_ms(lambda: ind(q, k, v, bias).sum(),
                                          cuda)
                torch._dynamo.reset()
                backend = kiln.backend(server=server, fallback="error",
                                       attention="decompose")
                kln = torch.compile(attn, backend=backend)
                row["kiln"] = step_ms(lambda: kln(q, k, v, bias).sum(), cuda)
                torch._dynamo.reset()
                fused = kiln.backend(server=server, fallback="error",
                                     attention="fused")
                kfu = torch.compile(attn, backend=fused)
                row["fused"] = step_ms(lambda: kfu(q, k, v, bias).sum(), cuda)
            print(f"{f'{b} x {h} x {t}':<22} {b * h * t * t:>10} "
                  f"{row['eager']:>8.3f} {row['inductor']:>9.3f} "
                  f"{row['kiln']:>8.3f} {row['fused']:>10.3f} "
                  f"{row['kiln'] / row['eager']:>9.2f}x "
                  f"{row['fused'] / row['eager']:>10.2f}x",
                  flush=True)
        if a.profile:
            profile(attn, shapes[-1], head_dim, a.device, dtype, server)
    finally:
        if daemon:
            daemon.stop()


def profile(attn, shape, head_dim, device, dtype, server) -> None:
    """The costliest kernels of 5 steps per variant, and the host time."""
    from torch.profiler import ProfilerActivity  # noqa: PLC0415
    b, h, t = shape
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, h, t, head_dim, device=device, dtype=dtype,
                           generator=g).requires_grad_() for _ in range(3))
    variants = {"eager": attn}
    for policy in ("fused",):
        torch._dynamo.reset()
        variants[policy] = torch.compile(attn, backend=kiln.backend(
            server=server, fallback="error", attention=policy))
    for name, fn in variants.items():
        for _ in range(3):
            fn(q, k, v).sum().backward()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[ProfilerActivity.CPU,
                                                ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                fn(q, k, v).sum().backward()
            torch.cuda.synchronize()
        print(f"\n--- {name}, {b} x {h} x {t}, 5 steps ---")
        print(p.key_averages().table(sort_by="self_cuda_time_total",
                                     row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
