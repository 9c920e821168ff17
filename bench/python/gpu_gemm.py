"""Matrix products on a CUDA device: Kiln's compiled mm / addmm / bmm (one
partition each, its GEMM a cuBLASLt call from Kiln's CUDA runtime) against
PyTorch's own call on the same tensors, side by side in one run, at the
shapes of a Llama-7B layer and of BERT-base, in bfloat16, float16 and
float32 (no TF32 on either side: PyTorch's default), and float32 with TF32
on both sides ("tf32": torch.set_float32_matmul_precision("high"), Kiln's
CompileOptions.allow_tf32). Also relu(x @ w + b) and tanh-gelu(x @ w + b)
as Kiln compiles them against torch._addmm_activation (cuBLASLt's fused
epilogues on both sides). The "unfused" column is Kiln with
CompileOptions.unfused_gemm_epilogues: the bias and activation as a Kiln
kernel after the product (what Kiln did before the epilogues). The "heur"
column is Kiln with KILN_GEMM_AUTOTUNE=0: cuBLASLt's heuristic's first
algorithm, where the "kiln" column times the heuristic's 8 best on the first
call and keeps the fastest.

    KILN_LIB=.../libkiln_c.so KILN_KILND=.../kilnd python3 bench/python/gpu_gemm.py

Each row: the median of `--repeats` timings (CUDA events) of `--iters`
back-to-back calls (the columns timed in turn within each repeat), TFLOP/s of both and Kiln / torch (≥ 1: Kiln faster).
Kiln's calls go through the executable's call path (the CPython extension
where it is built), as a compiled partition calls them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from typing import Callable, Dict, List, Tuple

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch

import kiln

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "tf32": torch.float32}
WIRE = {torch.bfloat16: "BFLOAT16", torch.float16: "FLOAT16",
        torch.float32: "FLOAT32"}

# (name, op, shapes of the inputs); mm: x[m,k] @ w^T where w is [n,k] as a
# Linear layer stores it (read in place, transposed).
CASES: List[Tuple[str, str, Tuple[int, int, int, int]]] = [
    # Llama-7B, 4096 tokens: q/k/v/o projections, gate/up, down.
    ("llama qkvo 4096x4096x4096", "mm", (1, 4096, 4096, 4096)),
    ("llama up 4096x11008x4096", "mm", (1, 4096, 11008, 4096)),
    ("llama down 4096x4096x11008", "mm", (1, 4096, 4096, 11008)),
    ("llama scores bmm 32x512x512x128", "bmm", (32 * 8, 512, 512, 128)),
    # BERT-base, 8 x 512 tokens.
    ("bert qkv addmm 4096x768x768", "addmm", (1, 4096, 768, 768)),
    ("bert ffn1 addmm 4096x3072x768", "addmm", (1, 4096, 3072, 768)),
    ("bert ffn2 addmm 4096x768x3072", "addmm", (1, 4096, 768, 3072)),
    ("bert scores bmm 96x512x512x64", "bmm", (8 * 12, 512, 512, 64)),
    ("relu(x@w+b) 8192x1024x4096", "relu_addmm", (1, 8192, 1024, 4096)),
    # GPT-2's MLP up-projection, 8 x 1024 tokens.
    ("gelu_tanh(x@w+b) 8192x3072x768", "gelu_addmm", (1, 8192, 3072, 768)),
]


def _dims(sizes):
    return [{"value": str(s)} for s in sizes]


def graph(op: str, shape: Tuple[int, int, int, int], dtype: torch.dtype) -> Dict:
    """The kiln.v1.Graph of one product (the weight transposed in place)."""
    b, m, n, k = shape
    t = WIRE[dtype]

    def inp(name, sizes, strides=None):
        meta = {"dtype": t, "sizes": _dims(sizes), "device": "CUDA",
                "alignment": 16}
        if strides:
            meta["strides"] = [{"value": str(s)} for s in strides]
        return {"name": name, "meta": meta}

    if op == "bmm":
        inputs = [inp("x", (b, m, k)), inp("w", (b, k, n))]
        nodes = [{"op": "aten.bmm.default", "args": [{"ref": "x"}, {"ref": "w"}],
                  "outputs": ["y"]}]
    else:
        # w is stored [n, k] (nn.Linear) and read as its transpose [k, n].
        inputs = [inp("x", (m, k)), inp("wt", (k, n), (1, k))]
        if op == "mm":
            nodes = [{"op": "aten.mm.default",
                      "args": [{"ref": "x"}, {"ref": "wt"}], "outputs": ["y"]}]
        else:
            inputs.append(inp("bias", (n,)))
            nodes = [{"op": "aten.addmm.default",
                      "args": [{"ref": "bias"}, {"ref": "x"}, {"ref": "wt"}],
                      "outputs": ["y" if op == "addmm" else "z"]}]
            if op == "relu_addmm":
                nodes.append({"op": "aten.relu.default", "args": [{"ref": "z"}],
                              "outputs": ["y"]})
            if op == "gelu_addmm":
                nodes.append({"op": "aten.gelu.default",
                              "args": [{"ref": "z"},
                                       {"name": "approximate", "str": "tanh"}],
                              "outputs": ["y"]})
    return {"inputs": inputs, "nodes": nodes, "outputs": ["y"]}


def tensors(op: str, shape, dtype, device) -> Tuple[List[torch.Tensor], Callable]:
    b, m, n, k = shape
    g = torch.Generator(device=device).manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g, device=device, dtype=dtype) * 0.1

    if op == "bmm":
        x, w = r(b, m, k), r(b, k, n)
        return [x, w], lambda: torch.bmm(x, w)
    x, w = r(m, k), r(n, k)
    if op == "mm":
        return [x, w.t()], lambda: torch.mm(x, w.t())
    bias = r(n)
    if op == "addmm":
        return [x, w.t(), bias], lambda: torch.addmm(bias, x, w.t())
    gelu = op == "gelu_addmm"
    return [x, w.t(), bias], lambda: torch._addmm_activation(
        bias, x, w.t(), use_gelu=gelu)


def time_cuda(fns: List[Callable[[], object]], iters: int,
              repeats: int) -> List[float]:
    """Median seconds per call of each of `fns`, timed in turn within every
    repeat (so that a change of clocks during the run falls on all)."""
    for fn in fns:
        for _ in range(3):
            fn()
    samples: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / iters)
    return [statistics.median(s) for s in samples]


def kernel_time(fn: Callable[[], object], iters: int) -> Tuple[float, str]:
    """Seconds of GPU kernels per call (CUPTI, through torch.profiler), and
    the kernels' names: what a call costs on the device, without the host
    time between launches."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    names = []
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None)
        if t is None:
            t = ev.self_cuda_time_total
        if t <= 0:
            continue
        total += t
        names.append(f"{ev.key[:60]} x{ev.count // iters}")
    return total / 1e6 / iters, "; ".join(names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="bf16,fp16,fp32,tf32")
    ap.add_argument("--cases", default="",
                    help="comma-separated substrings of case names (default all)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true",
                    help="also print GPU kernel time per call and the "
                    "kernels each side runs (torch.profiler)")
    ap.add_argument("--server", help="kilnd's address (default: a private one)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    warnings.simplefilter("ignore")
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda", 0)
    daemon = None if args.server else Kilnd()
    server = args.server or daemon.address
    major, minor = torch.cuda.get_device_capability(0)
    client = kiln.Client(server, rpc_deadline_seconds=300)
    heur_client = kiln.Client(server, rpc_deadline_seconds=300)
    print(f"GEMMs on {torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
          f"median of {args.repeats} x {args.iters} calls\n")
    print(f"{'case':<34}{'dtype':>6}{'torch us':>11}{'kiln us':>11}{'heur us':>10}"
          f"{'unfused us':>12}{'torch TF/s':>12}{'kiln TF/s':>11}"
          f"{'kiln/torch':>12}  max|diff|")
    wanted = [c for c in args.cases.split(",") if c]
    try:
        for name, op, shape in CASES:
            if wanted and not any(c in name for c in wanted):
                continue
            for dname in args.dtypes.split(","):
                dtype = DTYPES[dname]
                tf32 = dname == "tf32"
                torch.backends.cuda.matmul.allow_tf32 = tf32
                inputs, eager = tensors(op, shape, dtype, device)

                def compiled(options, via=client):
                    exe = via.cuda_executable(
                        graph(op, shape, dtype), target=f"sm_{major}{minor}",
                        device=0, options=options)
                    run = exe.call_path(range(len(inputs)), [("kiln", 0)],
                                        False) or (lambda *a: exe(*a)[0])
                    return lambda: run(*inputs)

                base = kiln._binding.OPTION_ALLOW_TF32 if tf32 else 0
                kiln_call = compiled(base)
                # The heuristic's first algorithm, untimed (another client:
                # each loads its own executable, and the setting is read
                # when one is loaded).
                os.environ["KILN_GEMM_AUTOTUNE"] = "0"
                try:
                    heur_call = compiled(base, via=heur_client)
                finally:
                    os.environ.pop("KILN_GEMM_AUTOTUNE")
                epilogue = op in ("addmm", "relu_addmm", "gelu_addmm")
                unfused = compiled(
                    base | kiln._binding.OPTION_UNFUSED_GEMM_EPILOGUES) \
                    if epilogue else None
                diff = (kiln_call().float() - eager().float()).abs().max().item()
                fns = [eager, kiln_call, heur_call] + ([unfused] if unfused else [])
                times = time_cuda(fns, args.iters, args.repeats)
                t_torch, t_kiln, t_heur = times[:3]
                t_unfused = times[3] if unfused else None
                b, m, n, k = shape
                flops = 2.0 * b * m * n * k
                unfused_text = f"{t_unfused * 1e6:>12.1f}" if t_unfused \
                    else f"{'-':>12}"
                print(f"{name:<34}{dname:>6}{t_torch * 1e6:>11.1f}"
                      f"{t_kiln * 1e6:>11.1f}{t_heur * 1e6:>10.1f}{unfused_text}"
                      f"{flops / t_torch / 1e12:>12.1f}"
                      f"{flops / t_kiln / 1e12:>11.1f}"
                      f"{t_torch / t_kiln:>11.3f}x  {diff:.2e}", flush=True)
                if args.profile:
                    for side, fn in (("torch", eager), ("kiln", kiln_call)):
                        t, names = kernel_time(fn, args.iters)
                        print(f"    {side} kernels {t * 1e6:.1f} us/call: {names}",
                              flush=True)
    finally:
        client.close()
        heur_client.close()
        if daemon:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
