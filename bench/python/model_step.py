"""Step time of one real model (real_models.py's list) on one backend, in
a process of its own: the harness behind bench/README.md's "One set of
threads" rows, and the process to attach perf to or to run with
KILN_CPU_PROFILE=N (each CPU executable's steps by time).

    PY=$(bash deploy/python-env.sh)
    KILN_REAL_MODELS_DIR=~/.cache/kiln/real-models \\
        $PY bench/python/model_step.py hf_bert --backend kiln --steps 100
    KILN_CPU_THREADS=kiln $PY bench/python/model_step.py hf_bert   # own pool

Sizes are real_models.py's `--scale 4 --seq 64 --image 64`; 3 warm-up
steps (the first compiles), then `--steps` timed steps (zero_grad,
forward, loss, backward); prints "BACKEND MODEL: X ms/step". A private
kilnd on an ephemeral port serves Kiln.
"""

from __future__ import annotations

import argparse

import real_models as rm  # noqa: E402 (sys.path and KILN_LIB via bench_util)
import torch  # noqa: E402

import kiln  # noqa: E402
from bench_util import Kilnd, ms_per_call  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=sorted(rm.MODELS))
    ap.add_argument("--backend", default="kiln",
                    choices=["kiln", "inductor", "eager"])
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    rm.SCALE, rm.SEQ, rm.IMAGE = 4, 64, 64
    torch.manual_seed(0)
    model, inputs = rm.MODELS[args.model]()
    rm._quiet_randomness(model)
    model.train()
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
            rm._step(call, model, inputs)

        ms = ms_per_call(step, args.steps, cuda=False, warmup=3)
        print(f"{args.backend} {args.model}: {ms:.2f} ms/step", flush=True)


if __name__ == "__main__":
    main()
