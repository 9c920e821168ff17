"""A fresh process's first call to torch.compile(nn.TransformerEncoderLayer)
forward + backward (issue 15's first-call benchmark), on the CPU:

  eager         backend="eager": Dynamo's tracing alone, the floor
  aot_eager     backend="aot_eager_default_partitioner": Dynamo +
                AOTAutograd (forward and backward graphs, eager kernels)
                with the partitioner Kiln's backend uses: what an
                AOTAutograd backend pays before its own work. (backend=
                "aot_eager" runs the min-cut rematerialization partitioner,
                which costs more than Kiln's whole first call.)
  inductor cold backend="inductor", TORCHINDUCTOR_CACHE_DIR a new empty dir
  inductor warm the same, a second process on that dir
  kiln cold     backend=kiln against a fresh kilnd with an empty data dir
  kiln warm     a second process against the same daemon (its artifacts
                compiled) and the AOTAutograd cache the cold process filled
                (kiln/aot_cache.py: AOTAutograd's tracing skipped)
  kiln warm, no AOT cache
                the same with KILN_AOT_CACHE=0: the daemon's cache alone
                (the row this benchmark called "kiln warm" before)

Each row runs in its own Python process (imports and the model's
construction are not timed; the first call and backward are); printed as
one table with the difference to the floor. --cache-key-cost adds a third
Inductor process on the warm cache, under cProfile, and prints what
AOTAutograd's cache spends on its key and on the whole lookup (why Kiln does
not use that cache: bench/README.md). --runs N repeats each warm row
N times (median; each in a fresh process); cold rows run once per --runs
too, each with a new cache dir / daemon.

    PY=$(bash deploy/python-env.sh)
    $PY bench/python/first_call.py [--runs 3] [--d-model 256]

kilnd and libkiln_c.so from build/ (KILN_KILND, KILN_LIB override them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

import bench_util
from bench_util import Kilnd

CHILD = r"""
import json, os, sys, time, warnings
t_start = time.perf_counter()
import torch
import torch.nn as nn
backend, server, d = sys.argv[1], sys.argv[2], int(sys.argv[3])
if backend == "kiln":
    import kiln
    backend = kiln.backend(server=server, fallback="error")
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=d, nhead=8, dim_feedforward=4 * d,
                                   dropout=0.0, batch_first=True)
x = torch.randn(8, 64, d)
compiled = torch.compile(layer, backend=backend)
profile = None
if os.environ.get("FIRST_CALL_PROFILE") == "1":
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
t0 = time.perf_counter()
compiled(x).sum().backward()
first = time.perf_counter() - t0
extra = {}
if profile is not None:
    # Where AOTAutograd's cache spends a warm first call: computing its key
    # (Inductor's configs, torch's and Triton's source hashes) and the rest
    # of the lookup.
    import pstats
    profile.disable()
    stats = pstats.Stats(profile).stats
    for (_, _, name), (_, _, _, cum, _) in stats.items():
        if name in ("autograd_cache_key", "try_load"):
            extra[name + "_s"] = extra.get(name + "_s", 0.0) + cum
t0 = time.perf_counter()
compiled(x).sum().backward()
second = time.perf_counter() - t0
print(json.dumps(dict({"first_s": first, "second_s": second,
                       "import_s": t0 - t_start - first - second}, **extra)))
"""


def run_child(backend: str, server: str, d: int, env: Dict[str, str]) -> Dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, backend, server, str(d)],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"first_call: {backend} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--cache-key-cost", action="store_true",
                    help="also run a third Inductor process on the warm "
                    "cache under cProfile and print the seconds its "
                    "AOTAutogradCache spends computing the key and loading")
    a = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(bench_util.ROOT / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    rows: Dict[str, List[float]] = {k: [] for k in (
        "eager", "aot_eager", "inductor cold", "inductor warm", "kiln cold",
        "kiln warm", "kiln warm, no AOT cache")}
    keys: List[Dict[str, float]] = []
    for _ in range(a.runs):
        rows["eager"].append(run_child("eager", "", a.d_model, env)["first_s"])
        rows["aot_eager"].append(
            run_child("aot_eager_default_partitioner", "", a.d_model,
                      env)["first_s"])
        with tempfile.TemporaryDirectory(prefix="kiln_inductor_") as cache:
            ienv = dict(env, TORCHINDUCTOR_CACHE_DIR=cache)
            rows["inductor cold"].append(
                run_child("inductor", "", a.d_model, ienv)["first_s"])
            rows["inductor warm"].append(
                run_child("inductor", "", a.d_model, ienv)["first_s"])
            if a.cache_key_cost:
                keys.append(run_child("inductor", "", a.d_model,
                                      dict(ienv, FIRST_CALL_PROFILE="1")))
        with Kilnd() as daemon, \
                tempfile.TemporaryDirectory(prefix="kiln_aot_") as aot:
            kenv = dict(env, KILN_AOT_CACHE_DIR=aot, KILN_AOT_CACHE="1")
            rows["kiln cold"].append(
                run_child("kiln", daemon.address, a.d_model, kenv)["first_s"])
            rows["kiln warm"].append(
                run_child("kiln", daemon.address, a.d_model, kenv)["first_s"])
            rows["kiln warm, no AOT cache"].append(
                run_child("kiln", daemon.address, a.d_model,
                          dict(kenv, KILN_AOT_CACHE="0"))["first_s"])
    floor = statistics.median(rows["eager"])
    import torch  # noqa: PLC0415 (the version only)

    print(f"first call of torch.compile(nn.TransformerEncoderLayer(d_model="
          f"{a.d_model}, nhead=8)) fwd+bwd on (8, 64, {a.d_model}), fresh "
          f"process, torch {torch.__version__}, median of {a.runs}\n")
    print(f"{'backend':<24}{'first call s':>14}{'over eager s':>14}  runs")
    for name, values in rows.items():
        m = statistics.median(values)
        print(f"{name:<24}{m:>14.2f}{m - floor:>+14.2f}  "
              + " ".join(f"{v:.2f}" for v in values))
    if keys:
        print("\nAOTAutogradCache in a warm Inductor process (cProfile, "
              "cumulative s): key " + " ".join(
                  f"{k.get('autograd_cache_key_s', 0):.2f}" for k in keys)
              + "; whole lookup (key, load, post-compile) " + " ".join(
                  f"{k.get('try_load_s', 0):.2f}" for k in keys)
              + "; first call under the profiler " + " ".join(
                  f"{k['first_s']:.2f}" for k in keys))


if __name__ == "__main__":
    main()
