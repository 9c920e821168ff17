"""A ResNet-18 basic block (conv3x3 - BatchNorm - ReLU - conv3x3 -
BatchNorm, residual, ReLU; 64 channels, 56x56) forward + backward, eager
vs Inductor vs Kiln side by side in one run, the backends' timings
interleaved (issue 16: on the CPU convolutions are im2col + the GEMM
extern, on CUDA cuDNN calls). Also a single conv3x3 forward + backward, to
separate the convolution from the rest of the block.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/conv_block.py [--batch 4] [--threads 2] [--repeats 5]
    # on a GPU (deploy/run-on-gpu.sh BUNDLE convblock, $CONV_ARGS):
    python3 bench/python/conv_block.py --device cuda --batch 32 \
        --dtype bfloat16 --iters 20 [--cudnn-benchmark]

A private kilnd on an ephemeral port (fresh cache) serves unless --server
is given (bench_util.Kilnd; build/ or KILN_KILND / KILN_LIB). Times are the
median of --repeats timings of --iters steps after warm-up; GFLOP/s counts
the convolutions' 2 * MACs, forward and both backward products.
"""

from __future__ import annotations

import argparse
import statistics
import time

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch
import torch.nn as nn

import kiln


class BasicBlock(nn.Module):
    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class OneConv(nn.Module):
    def __init__(self, c: int = 64) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv(x)


def step(model, x):
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def timed(fn, iters, cuda):
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def bench(make, x, server, repeats, iters, warmup):
    """ms per step per backend (interleaved) and Kiln's max output error."""
    models = {}
    for name in ("eager", "inductor", "kiln"):
        torch.manual_seed(0)
        m = make().to(device=x.device, dtype=x.dtype)
        if name == "inductor":
            m = torch.compile(m)
        elif name == "kiln":
            backend = kiln.backend(server=server, fallback="error")
            m = torch.compile(m, backend=backend)
        models[name] = m
    xs = {n: x.clone().requires_grad_(True) for n in models}
    # The forward output's error (gradients through ReLU can differ by a
    # whole unit where an output lies within rounding of 0).
    with torch.no_grad():
        err = (models["kiln"](x) - models["eager"](x)).abs().max().item()
    for n, m in models.items():
        for _ in range(warmup):
            step(m, xs[n])
    times = {n: [] for n in models}
    for _ in range(repeats):
        for n, m in models.items():
            times[n].append(timed(lambda: step(m, xs[n]), iters, x.is_cuda))
    return {n: statistics.median(t) for n, t in times.items()}, err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True for every "
                    "backend (eager, Inductor and Kiln each time their "
                    "algorithms)")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    kilnd = None if a.server else Kilnd()
    server = a.server or kilnd.address
    try:
        where = (torch.cuda.get_device_name() if a.device == "cuda"
                 else f"{a.threads} threads")
        print(f"torch {torch.__version__}, {where}, {a.dtype}, batch "
              f"{a.batch}, 64 channels, 56x56, cudnn.benchmark "
              f"{a.cudnn_benchmark}")
        x = torch.randn(a.batch, 64, 56, 56, device=a.device, dtype=dtype)
        # One 3x3 conv: forward, grad_input and grad_weight.
        conv_flops = 2 * a.batch * 64 * 64 * 9 * 56 * 56
        for label, make, flops in (("conv3x3", OneConv, 3 * conv_flops),
                                   ("basic block", BasicBlock,
                                    6 * conv_flops)):
            ms, err = bench(make, x, server, a.repeats, a.iters, a.warmup)
            base = ms["eager"]
            print(f"{label} fwd+bwd: " + "   ".join(
                f"{n} {t:8.2f} ms ({flops / t / 1e6:5.1f} GFLOP/s, "
                f"{base / t:4.2f}x eager)" for n, t in ms.items()) +
                  f"   max |y kiln - eager| {err:.2e}")
    finally:
        if kilnd:
            kilnd.stop()


if __name__ == "__main__":
    main()
