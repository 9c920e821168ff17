"""How much of real models runs in Kiln (issue 17 item 5): every model of
the suite (tests/models/) and any module named on the command line goes
through torch.compile(backend=kiln) for one training step (forward, the
model's loss, backward); prints per model and in total the share of ATen
nodes that ran in Kiln, the partitions, and each op that still falls back
with its count (and why).

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/coverage.py                     # the suite
    $PY bench/python/coverage.py --dynamic --dtype bfloat16
    $PY bench/python/coverage.py mypkg.models:make_resnet --no-suite
    $PY bench/python/coverage.py --device cuda zoo:gpt2   # bench/python/zoo.py

A `module:callable` (module importable from the current directory or
PYTHONPATH) returns either a models.ModelSpec, or (model, inputs) with
inputs a tuple of example arguments (then the loss is the sum of the
floating outputs), or an nn.Module taking one float32 tensor of shape
(4, 3, 32, 32) when it has Conv2d layers, else (4, 16, in_features) of its
first Linear. A private kilnd on an ephemeral port (fresh cache) serves
unless --server is given. Needs a build (build/server/kilnd,
build/client/libkiln_c.so; KILN_KILND and KILN_LIB override them).
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib
import sys
import warnings
from typing import Any, Callable, List, Optional, Tuple

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch
import torch.nn as nn

import kiln
from kiln.dynamo import ExplainReport
from models import MODELS, ModelSpec

Runner = Callable[[Callable[..., Any]], None]


def _sum_loss(out: Any) -> Optional[torch.Tensor]:
    flat = out if isinstance(out, (list, tuple)) else [out]
    parts = [o.float().sum() for o in flat
             if isinstance(o, torch.Tensor) and o.requires_grad]
    return torch.stack(parts).sum() if parts else None


DEVICE = torch.device("cpu")


def _to_device(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(DEVICE)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_device(v) for v in x)
    return x


def _spec_runner(spec: ModelSpec, dtype: torch.dtype) -> Tuple[nn.Module, Runner]:
    model = spec.make(dtype).to(DEVICE)
    args, target = _to_device(spec.example(dtype=dtype))

    def run(compiled: Callable[..., Any]) -> None:
        spec.loss(compiled(*args), target).backward()

    return model, run


def _user_runner(obj: Any, dtype: torch.dtype) -> Tuple[nn.Module, Runner]:
    if isinstance(obj, ModelSpec):
        return _spec_runner(obj, dtype)
    if isinstance(obj, nn.Module):
        convs = [m for m in obj.modules() if isinstance(m, nn.Conv2d)]
        linears = [m for m in obj.modules() if isinstance(m, nn.Linear)]
        if convs:
            x = torch.randn(4, convs[0].in_channels, 32, 32)
        elif linears:
            x = torch.randn(4, 16, linears[0].in_features)
        else:
            raise SystemExit("coverage: cannot guess the inputs of a module "
                             "without Conv2d or Linear: return (model, inputs)")
        obj = (obj, (x,))
    model, inputs = obj
    model = model.to(dtype).to(DEVICE)
    inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and
                   x.is_floating_point() else x for x in inputs)
    inputs = _to_device(inputs)

    def run(compiled: Callable[..., Any]) -> None:
        loss = _sum_loss(compiled(*inputs))
        if loss is not None:
            loss.backward()

    return model, run


def _load(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not attr:
        raise SystemExit(f"coverage: {target!r}: expected module:callable")
    if "" not in sys.path:
        sys.path.insert(0, "")
    fn = getattr(importlib.import_module(module_name), attr)
    return fn() if callable(fn) and not isinstance(fn, nn.Module) else fn


def measure(name: str, model: nn.Module, run: Runner, server: str,
            dynamic: bool) -> ExplainReport:
    torch._dynamo.reset()
    backend = kiln.backend(server=server, fallback="eager")
    compiled = torch.compile(copy.deepcopy(model), backend=backend,
                             dynamic=dynamic)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(compiled)
    return backend.report


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "-"


def print_table(rows: List[Tuple[str, ExplainReport]]) -> None:
    total = ExplainReport()
    print(f"{'model':<28} {'in Kiln':>9} {'nodes':>6} {'share':>7} "
          f"{'partitions':>10} {'graphs':>6}")
    for name, r in rows:
        n = r.kiln_nodes + r.fallback_nodes
        print(f"{name:<28} {r.kiln_nodes:>9} {n:>6} {_pct(r.kiln_nodes, n):>7} "
              f"{r.compiled_partitions:>10} {r.graphs:>6}")
        total.merge(r)
    n = total.kiln_nodes + total.fallback_nodes
    print(f"{'total':<28} {total.kiln_nodes:>9} {n:>6} "
          f"{_pct(total.kiln_nodes, n):>7} {total.compiled_partitions:>10} "
          f"{total.graphs:>6}")
    print("\nfalls back (nodes, per model):")
    for name, r in rows:
        for op, reasons in r.fallbacks.items():
            for reason, count in sorted(reasons.items()):
                print(f"  {name:<22} {op:<48} x{count:<3} {reason}")
    print("\nfalls back (nodes, all models; views run eagerly at the edge "
          "of a partition, i.e. next to an op Kiln lacks):")
    per_op = collections.Counter()
    for op, reasons in total.fallbacks.items():
        for reason, count in reasons.items():
            per_op[(op, "view at an edge" if "view or copy" in reason
                    else reason)] += count
    for (op, reason), count in per_op.most_common():
        print(f"  {op:<48} x{count:<4} {reason}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", metavar="module:callable")
    ap.add_argument("--server", help="kilnd's address (default: a private "
                    "kilnd on an ephemeral port with a fresh cache)")
    ap.add_argument("--no-suite", action="store_true",
                    help="only the modules named on the command line")
    ap.add_argument("--dynamic", action="store_true", help="dynamic=True")
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "bfloat16"])
    ap.add_argument("--models", help="comma-separated suite models (default all)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(a.device)
    dtype = getattr(torch, a.dtype)
    runs: List[Tuple[str, nn.Module, Runner]] = []
    if not a.no_suite:
        names = a.models.split(",") if a.models else list(MODELS)
        for name in names:
            runs.append((name, *_spec_runner(MODELS[name], dtype)))
    for target in a.targets:
        runs.append((target, *_user_runner(_load(target), dtype)))
    daemon = None if a.server else Kilnd()
    server = a.server or daemon.address
    try:
        print(f"kiln coverage: torch {torch.__version__}, {a.device}, {a.dtype}, "
              f"{'dynamic' if a.dynamic else 'static'}, server {server}\n")
        rows = [(name, measure(name, model, run, server, a.dynamic))
                for name, model, run in runs]
        print_table(rows)
    finally:
        if daemon:
            daemon.stop()


if __name__ == "__main__":
    main()
