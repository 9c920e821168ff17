"""An optimizer step compiled with Kiln against PyTorch's eager foreach
step and Inductor's compiled one, side by side in one process.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/optimizer_step.py [--device cuda] [--layers 12]
        [--width 512] [--steps 50] [--optimizer adamw|adam|sgd]

The parameters are an MLP's (`--layers` Linear layers of `--width` with
biases) with random gradients; each row is ms per `optimizer.step()`:
eager (foreach=True, PyTorch's multi-tensor kernels), Kiln
(`torch.compile(step, backend=kiln.backend(foreach=True))`: the foreach
ops as per-tensor ops in one partition, python/kiln/foreach.py; the new
parameters and states stored in place, Graph.input_writes), "kiln,
copies" (the same without input writes: new tensors copied back by the
graph's trailing _foreach_copy_) and Inductor (`torch.compile(step)`).
Each compiled step is checked against eager's parameters after the timed
steps (the same gradients every step). A private kilnd serves.
"""

from __future__ import annotations

import argparse
import contextlib
import copy

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd, ms_per_call

import torch

import kiln
from kiln import dynamo


def _optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01,
                                 foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=True)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)


@contextlib.contextmanager
def _input_writes(on: bool):
    """With on=False the backend asks kilnd for no input writes (the
    partitions compiled inside return the new values as outputs)."""
    if on:
        yield
        return
    saved = dynamo.input_write_candidates
    dynamo.input_write_candidates = lambda *args: {}
    try:
        yield
    finally:
        dynamo.input_write_candidates = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--optimizer", default="adamw",
                    choices=["adamw", "adam", "sgd"])
    a = ap.parse_args()
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    base = torch.nn.Sequential(*[torch.nn.Linear(a.width, a.width)
                                 for _ in range(a.layers)]).to(device)
    for p in base.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    n = sum(p.numel() for p in base.parameters())
    print(f"optimizer step: {a.optimizer}, {len(list(base.parameters()))} "
          f"tensors, {n / 1e6:.1f}M parameters, {device}, torch "
          f"{torch.__version__}")

    def make():
        model = copy.deepcopy(base)
        for p, q in zip(model.parameters(), base.parameters()):
            p.grad = q.grad.clone()
        return model, _optimizer(a.optimizer, model.parameters())

    daemon = Kilnd()
    try:
        rows = {}
        eager_model, eager_opt = make()
        rows["eager (foreach)"] = ms_per_call(eager_opt.step, a.steps, cuda,
                                              warmup=3)
        backend = kiln.backend(server=daemon.address, fallback="error",
                               foreach=True)
        copies = kiln.backend(server=daemon.address, fallback="error",
                              foreach=True)
        for name, compile_with in (("kiln", backend),
                                   ("kiln, copies", copies),
                                   ("inductor", "inductor")):
            torch._dynamo.reset()
            model, opt = make()
            step = torch.compile(opt.step, backend=compile_with)
            # "kiln, copies": the new values as outputs copied back, as
            # before input writes (Graph.input_writes).
            with _input_writes(name != "kiln, copies"):
                rows[name] = ms_per_call(step, a.steps, cuda, warmup=3)
            err = max((p - q).abs().max().item() for p, q in
                      zip(model.parameters(), eager_model.parameters()))
            rows[name + " max |param - eager's|"] = err
        r = backend.report
        print(f"kiln: {r.kiln_nodes}/{r.kiln_nodes + r.fallback_nodes} nodes "
              f"in Kiln, {r.compiled_partitions} partition(s)")
        for key, value in rows.items():
            unit = "" if "max" in key else " ms"
            print(f"  {key:<32} {value:.3g}{unit}")
        print(f"  kiln / eager {rows['kiln'] / rows['eager (foreach)']:.2f}, "
              f"kiln / inductor {rows['kiln'] / rows['inductor']:.2f}, "
              f"kiln / kiln with copies "
              f"{rows['kiln'] / rows['kiln, copies']:.2f}")
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
