#!/usr/bin/env python3
"""PyTorch's side of the GPU benchmarks (bench/gpu/run.sh): eager and
torch.compile (Inductor) on the same graphs as bench/gpu/cuda_bench, timed
the same way: `calls` back-to-back calls then one torch.cuda.synchronize(),
divided by `calls`, median over `batches` timings.

  torch_bench.py launch NAME N [--dynamic]   chain-N + sum on 8x16 (or
                                             (4..13)x16 with --dynamic)
  torch_bench.py chain NAME N ELEMENTS       chain-N on ELEMENTS float32
  torch_bench.py softmax NAME ROWS COLS
  torch_bench.py layernorm NAME ROWS COLS
  torch_bench.py sum NAME ROWS COLS          x.sum(-1)
  torch_bench.py var NAME ROWS COLS          x.var(-1)
  torch_bench.py argmax NAME ROWS COLS       x.argmax(-1)
  torch_bench.py sum_amax NAME ROWS COLS     (x.sum(-1), x.amax(-1))
  torch_bench.py gelu|gelu_bwd|add NAME ROWS COLS [DTYPE]
                                             tanh-GELU, its backward, x + y
                                             (default bfloat16)

Output: `<name> eager_us <t>` and `<name> inductor_us <t>` lines.
"""
import statistics
import sys
import time

import torch

CYCLE = [
    ("add", 0.1), ("sin", None), ("mul", 1.1), ("cos", None),
    ("add", 0.2), ("relu", None), ("sub", 0.1), ("exp_mul", 0.5),
    ("add", 0.3), ("sigmoid", None), ("mul", 1.2), ("sin", None),
    ("add", 0.4), ("cos", None), ("sub", 0.2), ("relu", None),
    ("add", 0.5), ("exp_mul", 0.4), ("mul", 1.3), ("sigmoid", None),
]


def chain(n, with_sum):
    def f(x):
        for i in range(n):
            kind, c = CYCLE[i % len(CYCLE)]
            if kind == "add":
                x = x + c
            elif kind == "mul":
                x = x * c
            elif kind == "sub":
                x = x - c
            elif kind == "exp_mul":
                x = torch.exp(x * c)
            elif kind == "sin":
                x = torch.sin(x)
            elif kind == "cos":
                x = torch.cos(x)
            elif kind == "relu":
                x = torch.relu(x)
            elif kind == "sigmoid":
                x = torch.sigmoid(x)
        return x.sum() if with_sum else x
    return f


# Row-wise graphs over an x[rows, cols] float32, as gen_graphs.py's.
ROW_OPS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "sum": lambda x: x.sum(-1),
    "var": lambda x: x.var(-1),
    "argmax": lambda x: x.argmax(-1),
    "sum_amax": lambda x: (x.sum(-1), x.amax(-1)),
}


HALF_OPS = {
    "gelu": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), 1),
    "gelu_bwd": (lambda g, x: torch.ops.aten.gelu_backward(
        g, x, approximate="tanh"), 2),
    "add": (lambda x, y: x + y, 2),
}


def timed(fn, inputs, calls=100, batches=20):
    for i in range(3):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for c in range(calls):
            fn(*inputs[c % len(inputs)])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def report(name, fn, inputs, dynamic=False):
    print("%s eager_us %.2f" % (name, timed(fn, inputs)), flush=True)
    compiled = torch.compile(fn, dynamic=dynamic)
    print("%s inductor_us %.2f" % (name, timed(compiled, inputs)), flush=True)
    # Inductor's deviation from eager float32 (accurate libm-style math),
    # over the first 16 rows as Kiln's kiln_err is measured.
    with torch.no_grad():
        got, want = compiled(*inputs[0]), fn(*inputs[0])
        if isinstance(got, tuple):  # several outputs: the first one's error
            got, want = got[0], want[0]
        if got.dim() >= 1:
            rows = 16 * (got.numel() // got.shape[0]) if got.dim() >= 2 else 16 * 1024
            got, want = got.reshape(-1)[:rows], want.reshape(-1)[:rows]
        err = (got.double() - want.double()).abs().max().item()
    print("%s inductor_err %.3g" % (name, err), flush=True)


def main():
    mode, name = sys.argv[1], sys.argv[2]
    dev = "cuda"
    torch.manual_seed(0)
    if mode == "launch":
        n = int(sys.argv[3])
        dynamic = "--dynamic" in sys.argv
        rows = range(4, 14) if dynamic else [8]
        inputs = [(torch.randn(r, 16, device=dev),) for r in rows]
        report(name, chain(n, True), inputs, dynamic)
    elif mode == "chain":
        n, elements = int(sys.argv[3]), int(sys.argv[4])
        report(name, chain(n, False),
               [(torch.randn(elements, device=dev),)])
    elif mode in ROW_OPS:
        r, c = int(sys.argv[3]), int(sys.argv[4])
        report(name, ROW_OPS[mode], [(torch.randn(r, c, device=dev),)])
    elif mode == "layernorm":
        r, c = int(sys.argv[3]), int(sys.argv[4])
        x = torch.randn(r, c, device=dev)
        w = torch.randn(c, device=dev)
        b = torch.randn(c, device=dev)
        report(name,
               lambda x, w, b: torch.nn.functional.layer_norm(
                   x, (c,), w, b, 1e-5),
               [(x, w, b)])
    elif mode in HALF_OPS:
        r, c = int(sys.argv[3]), int(sys.argv[4])
        dtype = getattr(torch, sys.argv[5] if len(sys.argv) > 5 else
                        "bfloat16")
        fn, inputs = HALF_OPS[mode]
        report(name, fn, [tuple(torch.randn(r, c, device=dev, dtype=dtype)
                                for _ in range(inputs))])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
