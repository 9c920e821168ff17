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
                compiled; the process's own caches empty)

Each row runs in its own Python process (imports and the model's
construction are not timed; the first call and backward are); printed as
one table with the difference to the floor. --runs N repeats each warm row
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
import json, sys, time, warnings
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
t0 = time.perf_counter()
compiled(x).sum().backward()
first = time.perf_counter() - t0
t0 = time.perf_counter()
compiled(x).sum().backward()
second = time.perf_counter() - t0
print(json.dumps({"first_s": first, "second_s": second,
                  "import_s": t0 - t_start - first - second}))
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
    a = ap.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(bench_util.ROOT / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    rows: Dict[str, List[float]] = {k: [] for k in (
        "eager", "aot_eager", "inductor cold", "inductor warm", "kiln cold", "kiln warm")}
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
        with Kilnd() as daemon:
            rows["kiln cold"].append(
                run_child("kiln", daemon.address, a.d_model, env)["first_s"])
            rows["kiln warm"].append(
                run_child("kiln", daemon.address, a.d_model, env)["first_s"])
    floor = statistics.median(rows["eager"])
    import torch  # noqa: PLC0415 (the version only)

    print(f"first call of torch.compile(nn.TransformerEncoderLayer(d_model="
          f"{a.d_model}, nhead=8)) fwd+bwd on (8, 64, {a.d_model}), fresh "
          f"process, torch {torch.__version__}, median of {a.runs}\n")
    print(f"{'backend':<16}{'first call s':>14}{'over eager s':>14}  runs")
    for name, values in rows.items():
        m = statistics.median(values)
        print(f"{name:<16}{m:>14.2f}{m - floor:>+14.2f}  "
              + " ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
