"""A transformer MLP block (LayerNorm, Linear d -> 4d, tanh-GELU, Linear
4d -> d, residual; the linears with biases) forward + backward: eager vs
Inductor vs Kiln vs Kiln without its cuBLASLt epilogues
(kiln.backend(fuse_gemm_epilogues=False): bias, activation and the bias
gradients as Kiln kernels), side by side in one run, the backends'
timings interleaved (issue 16's "MLP block" row; the bias-gradient
epilogue of compiler/gemm_epilogue.h).

    # on a GPU (deploy/run-on-gpu.sh BUNDLE mlpblock, $MLP_ARGS):
    python3 bench/python/mlp_block.py --device cuda --dtype bfloat16 \\
        --tokens 8192 --dim 768 [--iters 20 --repeats 7]
    # the 2-core CPU:
    PY=$(bash deploy/python-env.sh)
    $PY bench/python/mlp_block.py --tokens 256 --dim 1024 --threads 2

A private kilnd on an ephemeral port (fresh cache) serves unless --server
is given (bench_util.Kilnd; build/ or KILN_KILND / KILN_LIB). Times are the
median of --repeats timings of --iters steps after --warmup steps; each
step's gradients are checked against eager's first.
"""

from __future__ import annotations

import argparse
import statistics

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd, ms_per_call

import torch
import torch.nn as nn

import kiln


class MlpBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


def step(model: nn.Module, x: torch.Tensor, g: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x).backward(g)


def profile(name: str, fn, steps: int) -> None:
    """GPU time per step of each kernel of `steps` steps of fn, largest
    first."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / steps, e.count // steps, e.key)
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"  {name}: {total:.1f} us of GPU kernels per step")
    for us, count, key in rows[:14]:
        print(f"    {us:8.1f} us  x{count:<3} {key[:110]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server")
    ap.add_argument("--tokens", type=int, default=256,
                    help="rows: batch x sequence")
    ap.add_argument("--batch", type=int, default=1,
                    help="the tokens as [batch, tokens / batch, dim]")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also N steps per backend under torch.profiler: "
                    "GPU time per kernel (CUDA)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    kilnd = None if a.server else Kilnd()
    server = a.server or kilnd.address
    try:
        where = (torch.cuda.get_device_name() if a.device == "cuda"
                 else f"{a.threads} threads")
        print(f"torch {torch.__version__}, {where}, {a.dtype}, tokens "
              f"{a.tokens} as [{a.batch}, {a.tokens // a.batch}], dim {a.dim}")
        torch.manual_seed(0)
        shape = (a.batch, a.tokens // a.batch, a.dim) if a.batch > 1 else \
            (a.tokens, a.dim)
        x = torch.randn(*shape, device=a.device, dtype=dtype)
        g = torch.randn(*shape, device=a.device, dtype=dtype)
        models = {}
        for name in ("eager", "inductor", "kiln", "kiln unfused"):
            torch.manual_seed(1)
            m = MlpBlock(a.dim).to(device=a.device, dtype=dtype)
            if name == "inductor":
                m = torch.compile(m)
            elif name.startswith("kiln"):
                backend = kiln.backend(
                    server=server, fallback="error",
                    fuse_gemm_epilogues=name == "kiln")
                m = torch.compile(m, backend=backend)
            models[name] = m
        grads = {}
        for n, m in models.items():
            for _ in range(a.warmup):
                step(m, x, g)
            grads[n] = [p.grad.float() for p in m.parameters()]
        for n in models:
            err = max(((p - q).abs().max() / q.abs().max().clamp_min(1e-30))
                      .item() for p, q in zip(grads[n], grads["eager"]))
            print(f"  {n:13} largest relative gradient difference from "
                  f"eager {err:.1e}")
        times = {n: [] for n in models}
        for _ in range(a.repeats):
            for n, m in models.items():
                times[n].append(ms_per_call(lambda: step(m, x, g), a.iters,
                                            x.is_cuda, warmup=0))
        ms = {n: statistics.median(t) for n, t in times.items()}
        if a.profile and x.is_cuda:
            for n, m in models.items():
                profile(n, lambda: step(m, x, g), a.profile)
        flops = 3 * 2 * 2 * a.tokens * a.dim * 4 * a.dim
        print("MLP block fwd+bwd: " + "   ".join(
            f"{n} {t:8.3f} ms ({flops / t / 1e9:6.1f} TFLOP/s)"
            for n, t in ms.items()))
        print(f"  kiln / inductor {ms['inductor'] / ms['kiln']:.3f}x, "
              f"kiln / eager {ms['eager'] / ms['kiln']:.3f}x, epilogues "
              f"{ms['kiln unfused'] / ms['kiln']:.3f}x (speed-ups, > 1: "
              f"kiln faster)")
    finally:
        if kilnd:
            kilnd.stop()


if __name__ == "__main__":
    main()
