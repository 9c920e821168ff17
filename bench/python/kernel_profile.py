"""Where a training step's GPU time goes, per kernel, for eager, Inductor and
Kiln on one case of train_ops.py: torch.profiler (CUPTI sees Kiln's
driver-API launches and cuBLASLt's as it sees PyTorch's), 10 steps after 3
warm-up steps, kernels sorted by total CUDA time.

    KILN_LIB=.../libkiln_c.so KILN_KILND=.../kilnd python3 bench/python/kernel_profile.py --case batch_norm
"""

from __future__ import annotations

import argparse
import warnings

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch
from torch.profiler import ProfilerActivity, profile

import kiln
from train_ops import cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="batch_norm")
    ap.add_argument("--rows", type=int, default=12)
    a = ap.parse_args()
    daemon = Kilnd()
    try:
        name, module, inputs = next(c for c in cases("cuda", True)
                                    if c[0] == a.case)
        warnings.simplefilter("ignore")
        for label in ("eager", "inductor", "kiln"):
            torch._dynamo.reset()
            fn = module if label == "eager" else torch.compile(
                module, backend=kiln.backend(server=daemon.address,
                                             fallback="eager")
                if label == "kiln" else "inductor")
            for _ in range(3):
                fn(*inputs).backward()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn(*inputs).backward()
                torch.cuda.synchronize()
            print(f"== {name}: {label} (10 steps)")
            print(prof.key_averages().table(sort_by="cuda_time_total",
                                            row_limit=a.rows, max_name_column_width=60))
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
