"""Host cost of Kiln's cuBLASLt epilogues (issue 16): one linear layer,
compiled by torch.compile(backend=kiln) with its epilogues (bias, tanh-GELU
and, in training, the bias gradient folded into cuBLASLt's calls) and
without them (kiln.backend(fuse_gemm_epilogues=False): Kiln kernels do that
work), against eager, side by side in one run, interleaved.

    # on a GPU (deploy/run-on-gpu.sh BUNDLE epiloguecost, $EPI_ARGS):
    python3 bench/python/epilogue_cost.py [--dtype bfloat16] [--sizes 64x256,8192x768]

Cases per size TxD (x [T, D], the layer D -> 4D):
  linear       F.linear(x, w, b) under torch.no_grad
  linear_gelu  gelu_tanh(F.linear(x, w, b)) under torch.no_grad
  train        F.linear(x, w, b) forward + backward (x, w, b need grads)
Each figure is "host/synced" in microseconds per call: the loop's wall time
per call before the final torch.cuda.synchronize() (what the host spends to
enqueue a call) and after it. The median of --repeats timings of --iters
calls. A private kilnd on an ephemeral port serves unless --server is given.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch
import torch.nn.functional as F

import kiln


def host_and_synced(call: Callable[[], None], iters: int) -> tuple:
    """(host µs, synced µs) per call over `iters` calls."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    synced = time.perf_counter() - start
    return 1e6 * host / iters, 1e6 * synced / iters


def host_profile(name: str, call: Callable[[], None], calls: int) -> None:
    """The host events of `calls` calls, by self CPU time per call."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU,
                             ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    rows = [(e.self_cpu_time_total / calls, e.count / calls, e.key)
            for e in prof.key_averages() if e.self_cpu_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows if "Activity Buffer" not in r[2])
    print(f"  {name}: host events per call, self CPU µs ({total:.1f} in "
          f"all, the profiler's buffer requests left out)")
    for us, count, key in rows[:18]:
        print(f"    {us:8.1f} us  x{count:<5.1f} {key[:100]}")


def partitions(case: str, fn: Callable, tensors: tuple, server: str) -> None:
    """Each Kiln partition of `case` called alone, fused and unfused, and
    eager's matrix products alone."""
    import call_cost  # noqa: PLC0415 (a sibling script)
    call_cost.CUDA = True
    x, w, b, g = tensors

    def run(c):
        if case == "train":
            xs, ws, bs = (v.detach().requires_grad_() for v in (x, w, b))
            c(xs, ws, bs).backward(g)
        else:
            with torch.no_grad():
                c(x, w, b)

    for fuse in (True, False):
        torch._dynamo.reset()
        _, parts = call_cost.compile_kiln(
            fn, None, server, ext=True, run=run,
            options={"fuse_gemm_epilogues": fuse})
        for i, (p, p_args) in enumerate(parts):
            us = call_cost.per_call_us(p, *p_args, iters=500, warmup=20)
            before = torch.cuda.memory_stats()["allocation.all.allocated"]
            p(*p_args)
            allocs = (torch.cuda.memory_stats()["allocation.all.allocated"]
                      - before)
            print(f"    {case} {'fused' if fuse else 'unfused'} partition "
                  f"{i} ({len(p_args)} args): {us} µs, {allocs} blocks")
    mm = lambda: torch.mm(g.t(), x)  # noqa: E731
    addmm = lambda: torch.addmm(b, x, w.t())  # noqa: E731
    print(f"    eager mm {call_cost.per_call_us(mm, iters=500)} µs, addmm "
          f"{call_cost.per_call_us(addmm, iters=500)} µs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server")
    ap.add_argument("--dtype", default="bfloat16",
                    choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--sizes", default="64x256,8192x768",
                    help="comma-separated TxD")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also N calls of each column under "
                    "torch.profiler: host calls (runtime and driver API "
                    "included) per call, by self CPU time")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="also N calls of the kiln column under cProfile: "
                    "the Python functions by own time")
    ap.add_argument("--partitions", action="store_true",
                    help="also each Kiln partition of each case alone "
                    "(call_cost.py's spy): host/synced µs per call and the "
                    "blocks it allocates from PyTorch's allocator, with and "
                    "without the epilogues; and eager's ops alone")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    kilnd = None if a.server else Kilnd()
    server = a.server or kilnd.address
    try:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
              f"{a.dtype}; µs per call, host/synced")

        def linear(x, w, b):
            return F.linear(x, w, b)

        def linear_gelu(x, w, b):
            return F.gelu(F.linear(x, w, b), approximate="tanh")

        # "train": linear's forward and backward.
        cases = {"linear": linear, "linear_gelu": linear_gelu, "train": linear}
        for size in a.sizes.split(","):
            t, d = (int(v) for v in size.split("x"))
            torch.manual_seed(0)
            x = torch.randn(t, d, device="cuda", dtype=dtype)
            w = torch.randn(4 * d, d, device="cuda", dtype=dtype) / d ** 0.5
            b = torch.randn(4 * d, device="cuda", dtype=dtype)
            g = torch.randn(t, 4 * d, device="cuda", dtype=dtype)
            for case, fn in cases.items():
                torch._dynamo.reset()
                backends: Dict[str, Callable] = {"eager": fn}
                for name, fuse in (("kiln", True), ("kiln unfused", False)):
                    backends[name] = torch.compile(
                        fn, dynamic=False, backend=kiln.backend(
                            server=server, fallback="error",
                            fuse_gemm_epilogues=fuse))
                calls: Dict[str, Callable[[], None]] = {}
                for name, f in backends.items():
                    if case == "train":
                        xs, ws, bs = (v.detach().requires_grad_()
                                      for v in (x, w, b))

                        def call(f=f, xs=xs, ws=ws, bs=bs) -> None:
                            xs.grad = ws.grad = bs.grad = None
                            f(xs, ws, bs).backward(g)
                    else:
                        def call(f=f) -> None:
                            with torch.no_grad():
                                f(x, w, b)
                    for _ in range(3):
                        call()
                    calls[name] = call
                times: Dict[str, List[tuple]] = {n: [] for n in calls}
                for _ in range(a.repeats):
                    for n, call in calls.items():
                        times[n].append(host_and_synced(call, a.iters))
                cells = []
                for n, ts in times.items():
                    host = statistics.median(h for h, _ in ts)
                    synced = statistics.median(s for _, s in ts)
                    cells.append(f"{n} {host:7.1f}/{synced:7.1f}")
                print(f"{size:>10} {case:12} " + "   ".join(cells))
                if a.partitions:
                    partitions(case, fn, (x, w, b, g), server)
                if a.cprofile:
                    import cProfile
                    import pstats
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(a.cprofile):
                        calls["kiln"]()
                    torch.cuda.synchronize()
                    prof.disable()
                    print(f"  {size} {case} kiln under cProfile, "
                          f"{a.cprofile} calls:")
                    pstats.Stats(prof).sort_stats("tottime").print_stats(22)
                if a.profile:
                    for n in calls:
                        host_profile(f"{size} {case} {n}", calls[n],
                                     a.profile)
    finally:
        if kilnd:
            kilnd.stop()


if __name__ == "__main__":
    main()
