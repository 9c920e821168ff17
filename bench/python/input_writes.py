"""A graph's input mutations written by one foreach copy (issue 15): batch
norm's running statistics and count, three buffers per layer, which a
training step's forward writes back.

Before: AOTAutograd's runtime wrapper copies each mutated input after the
compiled forward (keep_inference_input_mutations=False), one eager copy_
and one kernel each. Now: the forward graph keeps the writes
(keep_inference_input_mutations=True) and fx_graph.batch_input_writes
makes them one torch._foreach_copy_. Side by side in one run, measured in
turn: eager, Inductor, Kiln before ("kiln-copies"), Kiln now.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/input_writes.py [--device cuda] [--layers 10] [--rounds 3]

Cases: one BatchNorm2d(64) on (8, 64, 16, 16) and a stack of `--layers`
conv 3x3 + BatchNorm2d + ReLU blocks (a ResNet's stem-to-stage pattern) on
(8, 32, 16, 16) (CPU: batch 2), loss = mean of squares. Printed per case:
ms per step (median of the rounds' medians of 7 x 10 steps) and, with
--device cuda, GPU activities per step (torch.profiler: kernels, copies,
sets) for Kiln before and now.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from typing import Callable, Dict, List

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd, step_ms

import torch
import torch.nn as nn

import kiln
from kiln.remat import kiln_default_partition


def copies_backend(server: str) -> "kiln.dynamo.KilnBackend":
    """A Kiln backend whose AOTAutograd copies mutated inputs after the
    forward (keep_inference_input_mutations=False), as before."""
    from torch._dynamo.backends.common import aot_autograd  # noqa: PLC0415

    b = kiln.backend(server=server, fallback="error")
    b._aot = aot_autograd(fw_compiler=b._compile_graph,
                          bw_compiler=b._compile_graph,
                          decompositions=b._decompositions,
                          partition_fn=kiln_default_partition)
    return b


class Loss(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x).square().mean()


def blocks(n: int, c: int) -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Conv2d(c, c, 3, padding=1,
                                                   bias=False),
                                         nn.BatchNorm2d(c), nn.ReLU())
                           for _ in range(n)])


def gpu_activities(fn: Callable[[], torch.Tensor]) -> float:
    from torch.autograd import DeviceType  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    for _ in range(3):
        fn().backward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            fn().backward()
        torch.cuda.synchronize()
    return sum(e.device_type == DeviceType.CUDA for e in p.events()) / 5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    cuda = a.device == "cuda"
    dev = torch.device(a.device)
    batch = 8 if cuda else 2
    daemon = Kilnd()
    cases = [
        ("batch_norm", Loss(nn.BatchNorm2d(64)).to(dev),
         torch.randn(batch, 64, 16, 16, device=dev)),
        (f"{a.layers} conv+bn+relu", Loss(blocks(a.layers, 32)).to(dev),
         torch.randn(batch, 32, 16, 16, device=dev)),
    ]
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"input writes, {where}, torch {torch.__version__}; ms per step "
          f"(median of {a.rounds} rounds in turn)")
    print(f"{'case':<20} {'eager':>8} {'inductor':>9} {'kiln-copies':>12} "
          f"{'kiln':>8}" + ("  GPU activities/step copies -> kiln" if cuda else ""))
    try:
        for name, module, x in cases:
            x.requires_grad_()
            rows: Dict[str, List[float]] = {}
            acts = ""
            for r in range(a.rounds):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fns = {"eager": module}
                    torch._dynamo.reset()
                    fns["inductor"] = torch.compile(module)
                    rows.setdefault("inductor", []).append(
                        step_ms(lambda: fns["inductor"](x), cuda))
                    rows.setdefault("eager", []).append(
                        step_ms(lambda: module(x), cuda))
                    for label, backend in (
                            ("kiln-copies", copies_backend(daemon.address)),
                            ("kiln", kiln.backend(server=daemon.address,
                                                  fallback="error"))):
                        torch._dynamo.reset()
                        fn = torch.compile(module, backend=backend)
                        rows.setdefault(label, []).append(
                            step_ms(lambda: fn(x), cuda))
                        if cuda and r == 0:
                            acts += f" {gpu_activities(lambda: fn(x)):.1f}"
            med = {k: statistics.median(v) for k, v in rows.items()}
            print(f"{name:<20} {med['eager']:>8.3f} {med['inductor']:>9.3f} "
                  f"{med['kiln-copies']:>12.3f} {med['kiln']:>8.3f}"
                  + (f"  {acts}" if cuda else ""), flush=True)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
