"""Where a training step's GPU time goes, per kernel, for eager, Inductor and
Kiln on one case of train_ops.py: torch.profiler (CUPTI sees Kiln's
driver-API launches and cuBLASLt's as it sees PyTorch's), 10 steps after 3
warm-up steps, kernels sorted by total CUDA time. With --timeline, also
where the steps' wall time goes: the GPU's busy time (the union of kernel,
memcpy and memset intervals) against the span from the first to the last,
the idle gaps between GPU activities with the activities on each side,
and the CPU ops by self time (is the step bound by the host?). With
--python, Kiln's 10 steps also run under cProfile (Python functions by
their own time: what the host does per step outside the kernels).

    KILN_LIB=.../libkiln_c.so KILN_KILND=.../kilnd python3 bench/python/kernel_profile.py --case batch_norm [--timeline]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import warnings

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import kiln
from train_ops import cases


def timeline(prof: profile, steps: int, rows: int) -> None:
    """Prints the GPU's busy time and idle gaps per step, and the CPU ops
    with the most self time."""
    gpu = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    if not gpu:
        print("  no GPU activity recorded")
        return
    busy = 0.0
    gaps = []
    end = gpu[0].time_range.start
    prev = None
    for e in gpu:
        start, stop = e.time_range.start, e.time_range.end
        if start > end and prev is not None:
            gaps.append((start - end, prev.name, e.name))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, prev = stop, e
    span = end - gpu[0].time_range.start
    idle = sum(g[0] for g in gaps)
    print(f"  per step: span {span / steps:.0f} us, GPU busy {busy / steps:.0f} us, "
          f"idle {idle / steps:.0f} us in {len(gaps) / steps:.1f} gaps; "
          f"{len(gpu) / steps:.1f} GPU activities")
    print("  largest gaps (us, after -> before):")
    for g, a, b in sorted(gaps, reverse=True)[:rows]:
        print(f"    {g:8.0f}  {a[:50]} -> {b[:50]}")
    print("  CPU ops by self time (all steps):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows,
                                    max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="batch_norm")
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--recompute", action="store_true",
                    help="also Kiln with recompute=True")
    ap.add_argument("--python", action="store_true",
                    help="also Kiln's steps under cProfile")
    ap.add_argument("--timeline", action="store_true",
                    help="also the GPU's idle gaps and the CPU ops' self time")
    a = ap.parse_args()
    daemon = Kilnd()
    try:
        name, module, inputs = next(c for c in cases("cuda", True)
                                    if c[0] == a.case)
        warnings.simplefilter("ignore")
        labels = ["eager", "inductor", "kiln"] + (["kiln-recompute"]
                                                  if a.recompute else [])
        for label in labels:
            torch._dynamo.reset()
            fn = module if label == "eager" else torch.compile(
                module, backend=kiln.backend(
                    server=daemon.address, fallback="eager",
                    recompute=label == "kiln-recompute")
                if label.startswith("kiln") else "inductor")
            for _ in range(3):
                fn(*inputs).backward()
            torch.cuda.synchronize()
            activities = [ProfilerActivity.CUDA]
            if a.timeline:
                activities.append(ProfilerActivity.CPU)
            with profile(activities=activities) as prof:
                for _ in range(10):
                    fn(*inputs).backward()
                torch.cuda.synchronize()
            print(f"== {name}: {label} (10 steps)")
            print(prof.key_averages().table(sort_by="cuda_time_total",
                                            row_limit=a.rows, max_name_column_width=60))
            if a.timeline:
                timeline(prof, 10, a.rows)
            if a.python and label == "kiln":
                torch.cuda.synchronize()
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(10):
                    fn(*inputs).backward()
                torch.cuda.synchronize()
                pr.disable()
                print(f"== {name}: kiln under cProfile (10 steps)")
                pstats.Stats(pr).sort_stats("tottime").print_stats(a.rows * 2)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
