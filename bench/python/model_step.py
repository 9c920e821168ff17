"""Step time of one real model (real_models.py's list, or timm:NAME or
hf:CLASS as real_models.py takes them) on one backend, in
a process of its own: the harness behind bench/README.md's "One set of
threads" rows, and the process to attach perf to or to run with
KILN_CPU_PROFILE=N (each CPU executable's steps by time).

    PY=$(bash deploy/python-env.sh)
    KILN_REAL_MODELS_DIR=~/.cache/kiln/real-models \\
        $PY bench/python/model_step.py hf_bert --backend kiln --steps 100
    KILN_CPU_THREADS=kiln $PY bench/python/model_step.py hf_bert   # own pool
    python3 bench/python/model_step.py tv_resnet18 --device cuda \\
        --amp bfloat16 --scale 16 --image 128 --profile 25

Sizes are real_models.py's, `--scale 4 --seq 64 --image 64` by default;
3 warm-up steps (the first compiles), then `--steps` timed steps
(zero_grad, forward, loss, backward); prints "BACKEND MODEL: X ms/step".
`--profile N` then profiles 5 more steps (torch.profiler) and prints the N
kernels (CPU ops on the CPU) that took the most time, with their share: a
Kiln kernel is named kiln_k<i> after its executable's kernel number
(KILN_DUMP_DIR's files say what each computes). A private kilnd on an
ephemeral port serves Kiln.
"""

from __future__ import annotations

import argparse
import contextlib

import real_models as rm  # noqa: E402 (sys.path and KILN_LIB via bench_util)
import torch  # noqa: E402

import kiln  # noqa: E402
from bench_util import Kilnd, ms_per_call  # noqa: E402


def _print_profile(step, count: int, cuda: bool) -> None:
    """Profiles 5 calls of `step`; prints the `count` costliest kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(5):
            step()
        if cuda:
            torch.cuda.synchronize()

    def self_time(e) -> float:
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    events = [e for e in prof.key_averages() if self_time(e) > 0]
    cost = {e.key: self_time(e) for e in events}
    key = "device time" if cuda else "CPU time"
    total = sum(cost.values()) or 1
    print(f"top {count} {'kernels' if cuda else 'ops'} of 5 steps "
          f"(by self {key}; all of them: {total / 5 / 1000:.3f} ms/step):")
    for name, us in sorted(cost.items(), key=lambda kv: -kv[1])[:count]:
        calls = next(e.count for e in events if e.key == name)
        print(f"  {us / 5 / 1000:8.3f} ms/step {100 * us / total:5.1f}% "
              f"x{calls // 5:<4d} {name[:100]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="one of real_models.py's MODELS, "
                    "timm:NAME or hf:CLASS")
    ap.add_argument("--backend", default="kiln",
                    choices=["kiln", "inductor", "eager"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--amp", choices=["bfloat16", "float16"],
                    help="the step under torch.autocast to this dtype")
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then print the N costliest kernels of 5 steps")
    ap.add_argument("--dropout", action="store_true",
                    help="keep the model's dropout (real_models.py's flag)")
    args = ap.parse_args()
    if args.model not in rm.MODELS and \
            not args.model.startswith(("timm:", "hf:")):
        ap.error(f"unknown model {args.model!r}: one of "
                 f"{', '.join(sorted(rm.MODELS))}, timm:NAME or hf:CLASS")
    rm.SCALE, rm.SEQ, rm.IMAGE = args.scale, args.seq, args.image
    rm.KEEP_DROPOUT = args.dropout
    torch.manual_seed(0)
    model, inputs = rm._model(args.model)
    rm._quiet_randomness(model)
    model = model.to(args.device).train()
    inputs = tuple(x.to(args.device) for x in inputs)
    cuda = args.device == "cuda"
    mode = rm.Mode(amp=getattr(torch, args.amp) if args.amp else None)
    with Kilnd() as server:
        if args.backend == "kiln":
            call = torch.compile(model, backend=kiln.backend(
                server=server.address, fallback="eager"))
        elif args.backend == "inductor":
            call = torch.compile(model)
        else:
            call = model

        def step() -> None:
            model.zero_grad(set_to_none=True)
            rm._step(call, model, inputs, mode)

        ms = ms_per_call(step, args.steps, cuda=cuda, warmup=3)
        print(f"{args.backend} {args.model}: {ms:.2f} ms/step", flush=True)
        if args.profile:
            with contextlib.suppress(KeyboardInterrupt):
                _print_profile(step, args.profile, cuda)


if __name__ == "__main__":
    main()
