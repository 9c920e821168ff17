"""Training step time per model of the suite (tests/models/): forward, loss,
backward and AdamW(foreach=True).step() for eager PyTorch,
torch.compile(backend="inductor") and torch.compile(backend=kiln), side by
side in one run on the CPU. The optimizer step runs eagerly in all three
(only the model is compiled). Per backend and model: the first step
(compiles included, Inductor's cache dir as it is, Kiln a fresh daemon
cache), then `--warmup` steps, then the median of `--repeats` timings of
`--iters` steps each.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/step_time.py                      # all models
    $PY bench/python/step_time.py --models mlp,nanogpt --iters 20 --repeats 5

A private kilnd on an ephemeral port serves Kiln unless --server is given
(build/server/kilnd, build/client/libkiln_c.so; KILN_KILND and KILN_LIB
override them). --dynamic compiles with dynamic=True.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable, Dict, List

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch

import kiln
from models import MODELS, make_optimizer, train_step

BACKENDS = ("eager", "inductor", "kiln")


def time_backend(name: str, backend: str, server: str, args) -> Dict[str, float]:
    spec = MODELS[name]
    torch._dynamo.reset()
    model = spec.make()
    opt = make_optimizer(model, spec)
    if backend == "eager":
        step_model: Callable = model
    elif backend == "inductor":
        step_model = torch.compile(model, backend="inductor",
                                   dynamic=args.dynamic)
    else:
        step_model = torch.compile(
            model, backend=kiln.backend(server=server, fallback="eager"),
            dynamic=args.dynamic)
    inputs, target = spec.example()
    t0 = time.perf_counter()
    train_step(step_model, opt, spec, inputs, target)
    first = time.perf_counter() - t0
    for _ in range(args.warmup):
        train_step(step_model, opt, spec, inputs, target)
    samples: List[float] = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.iters):
            train_step(step_model, opt, spec, inputs, target)
        samples.append((time.perf_counter() - t0) / args.iters)
    return {"first_s": first, "step_ms": statistics.median(samples) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated (default: all)")
    ap.add_argument("--server", help="kilnd's address (default: a private one)")
    ap.add_argument("--iters", type=int, default=10, help="steps per timing")
    ap.add_argument("--repeats", type=int, default=5, help="timings (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dynamic", action="store_true")
    args = ap.parse_args()
    names = args.models.split(",") if args.models else list(MODELS)
    daemon = None if args.server else Kilnd()
    server = args.server or daemon.address
    warnings.simplefilter("ignore")
    try:
        print(f"training step (fwd + bwd + AdamW foreach), torch "
              f"{torch.__version__}, {torch.get_num_threads()} threads, "
              f"{'dynamic' if args.dynamic else 'static'}; median of "
              f"{args.repeats} x {args.iters} steps after {args.warmup} warm-up\n")
        print(f"{'model':<14}" + "".join(f"{b + ' ms':>13}" for b in BACKENDS) +
              f"{'kiln/ind':>10}{'kiln/eager':>11}" +
              "".join(f"{'1st ' + b + ' s':>15}" for b in BACKENDS[1:]))
        for name in names:
            r = {b: time_backend(name, b, server, args) for b in BACKENDS}
            k = r["kiln"]["step_ms"]
            print(f"{name:<14}" +
                  "".join(f"{r[b]['step_ms']:>13.3f}" for b in BACKENDS) +
                  f"{k / r['inductor']['step_ms']:>9.2f}x"
                  f"{k / r['eager']['step_ms']:>10.2f}x" +
                  "".join(f"{r[b]['first_s']:>15.2f}" for b in BACKENDS[1:]),
                  flush=True)
    finally:
        if daemon:
            daemon.stop()


if __name__ == "__main__":
    main()
