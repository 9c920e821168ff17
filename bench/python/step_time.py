"""Training step time per model of the suite (tests/models/): forward, loss,
backward and AdamW(foreach=True).step() for eager PyTorch,
torch.compile(backend="inductor") and torch.compile(backend=kiln), side by
side in one run on the CPU. The optimizer step runs eagerly in all three
(only the model is compiled). Per backend and model: the first step
(compiles included, Inductor's cache dir as it is, Kiln a fresh daemon
cache), then `--warmup` steps, then the median of `--repeats` timings of
`--iters` steps each, the three backends' timings interleaved (so that load
from other processes falls on all three alike).

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/step_time.py                      # all models
    $PY bench/python/step_time.py --models mlp,nanogpt --iters 20 --repeats 5
    $PY bench/python/step_time.py --device cuda --cudagraphs   # + CUDA graphs

A private kilnd on an ephemeral port serves Kiln unless --server is given
(build/server/kilnd, build/client/libkiln_c.so; KILN_KILND and KILN_LIB
override them). --dynamic compiles with dynamic=True.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from typing import Callable, Dict, List, Tuple

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd

import torch

import kiln
from models import MODELS, make_optimizer, train_step

BACKENDS = ("eager", "inductor", "kiln")


def make_step(name: str, backend: str, server: str,
              args) -> Tuple[Callable[[], None], float]:
    """The model's training step under `backend` and the time of its first
    call (compiles included)."""
    spec = MODELS[name]
    device = torch.device(args.device)
    model = spec.make().to(device)
    opt = make_optimizer(model, spec)
    if backend == "eager":
        step_model: Callable = model
    elif backend.startswith("inductor"):
        step_model = torch.compile(
            model, backend="inductor", dynamic=args.dynamic,
            mode="reduce-overhead" if backend.endswith("cg") else None)
    else:
        step_model = torch.compile(
            model, backend=kiln.backend(server=server, fallback="eager",
                                        cudagraphs=backend.endswith("cg")),
            dynamic=args.dynamic)
    inputs, target = spec.example()
    inputs = tuple(a.to(device) if isinstance(a, torch.Tensor) else a
                   for a in inputs)
    target = target.to(device) if target is not None else None

    def step() -> None:
        train_step(step_model, opt, spec, inputs, target)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    for _ in range(args.warmup):
        step()
    return step, first


def time_model(name: str, server: str, args) -> Dict[str, Dict[str, float]]:
    """Per backend: the first step's seconds and the median step in ms; the
    backends' timings are interleaved (one timing of each in turn, per
    repeat), so that load from elsewhere falls on all three alike."""
    torch._dynamo.reset()
    steps, firsts = {}, {}
    for b in BACKENDS:
        steps[b], firsts[b] = make_step(name, b, server, args)
    samples: Dict[str, List[float]] = {b: [] for b in BACKENDS}
    for _ in range(args.repeats):
        for b in BACKENDS:
            t0 = time.perf_counter()
            for _ in range(args.iters):
                steps[b]()
            samples[b].append((time.perf_counter() - t0) / args.iters)
    return {b: {"first_s": firsts[b],
                "step_ms": statistics.median(samples[b]) * 1e3}
            for b in BACKENDS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated (default: all)")
    ap.add_argument("--server", help="kilnd's address (default: a private one)")
    ap.add_argument("--iters", type=int, default=10, help="steps per timing")
    ap.add_argument("--repeats", type=int, default=5, help="timings (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dynamic", action="store_true")
    ap.add_argument("--device", default="cpu",
                    help="cpu or cuda (each step ends with a synchronize)")
    ap.add_argument("--cudagraphs", action="store_true",
                    help="also Inductor with mode='reduce-overhead' and Kiln "
                    "with cudagraphs=True (columns inductor-cg, kiln-cg)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    global BACKENDS  # noqa: PLW0603
    if args.cudagraphs:
        BACKENDS = BACKENDS + ("inductor-cg", "kiln-cg")
    names = args.models.split(",") if args.models else list(MODELS)
    daemon = None if args.server else Kilnd()
    server = args.server or daemon.address
    warnings.simplefilter("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        where = (torch.cuda.get_device_name(0) if args.device == "cuda"
                 else f"{torch.get_num_threads()} threads")
        print(f"training step (fwd + bwd + AdamW foreach), torch "
              f"{torch.__version__}, {where}, "
              f"{'dynamic' if args.dynamic else 'static'}, load average "
              f"{os.getloadavg()[0]:.1f}; median of "
              f"{args.repeats} x {args.iters} steps after {args.warmup} warm-up\n")
        print(f"{'model':<14}" + "".join(f"{b + ' ms':>16}" for b in BACKENDS) +
              f"{'kiln/ind':>10}{'kiln/eager':>11}" +
              "".join(f"{'1st ' + b + ' s':>18}" for b in BACKENDS[1:]))
        for name in names:
            r = time_model(name, server, args)
            k = r["kiln"]["step_ms"]
            print(f"{name:<14}" +
                  "".join(f"{r[b]['step_ms']:>16.3f}" for b in BACKENDS) +
                  f"{k / r['inductor']['step_ms']:>9.2f}x"
                  f"{k / r['eager']['step_ms']:>10.2f}x" +
                  "".join(f"{r[b]['first_s']:>18.2f}" for b in BACKENDS[1:]),
                  flush=True)
    finally:
        if daemon:
            daemon.stop()


if __name__ == "__main__":
    main()
