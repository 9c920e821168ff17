#!/usr/bin/env python3
"""Per-call cost from Python: chain-N + sum() on 8x16 float32 through the
Kiln Python binding (python/kiln: ctypes over libkiln_c.so, outputs as torch
tensors through DLPack, allocator "torch" or "kiln") next to eager PyTorch and
torch.compile (Inductor), in the same process. What a PyTorch user calling
Kiln from Python pays per call; the C++ runtime's own figure is cuda_bench's
launch rows (bench/gpu/run.sh).

  KILN_KILND=<bundle>/kiln/bin/kilnd KILN_LIB=<bundle>/kiln/lib/libkiln_c.so \\
    PYTHONPATH=<bundle>/kiln/python python3 bench/gpu/python_launch.py [N ...]

Starts its own kilnd (127.0.0.1, ephemeral port, temporary data dir). Each
row: median over 20 batches of 200 calls, synchronised per batch.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch

import kiln

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def chain_graph(n):
    out = subprocess.run([sys.executable, str(ROOT / "examples/graphs/gen_chain.py"),
                          str(n), "--sum"], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def chain_fn(n):
    sys.path.insert(0, str(HERE))
    from torch_bench import chain  # the same ops as gen_chain.py
    return chain(n, True)


def per_call_us(fn, x, calls=200, batches=20):
    for _ in range(20):
        fn(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    times.sort()
    return times[len(times) // 2]


def main():
    ns = [int(a) for a in sys.argv[1:]] or [1, 10, 30]
    tmp = tempfile.TemporaryDirectory()
    port_file = pathlib.Path(tmp.name) / "port"
    kilnd = subprocess.Popen(
        [os.environ["KILN_KILND"], "--listen=127.0.0.1:0", "--metrics_listen=",
         f"--data_dir={tmp.name}/data", f"--port_file={port_file}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if port_file.exists() and port_file.read_text().split():
                break
            time.sleep(0.05)
        server = "127.0.0.1:" + port_file.read_text().split()[0]
        arch = "sm_%d%d" % torch.cuda.get_device_capability()
        x = torch.randn(8, 16, device="cuda")
        print("| graph | Kiln (Python, torch allocator) µs | Kiln (Python, kiln allocator) µs | eager µs | Inductor µs | max err vs eager |")
        print("|---|---|---|---|---|---|")
        with kiln.Client(server) as client:
            for n in ns:
                graph = chain_graph(n)
                eager = chain_fn(n)
                row = []
                for allocator in ("torch", "kiln"):
                    exe = client.cuda_executable(graph, target=arch,
                                                 allocator=allocator)
                    row.append(per_call_us(lambda t: exe(t), x))
                err = (exe(x)[0] - eager(x)).abs().max().item()
                compiled = torch.compile(eager)
                print("| chain-%d + sum | %.1f | %.1f | %.1f | %.1f | %.2g |" % (
                    n, row[0], row[1], per_call_us(eager, x),
                    per_call_us(compiled, x), err), flush=True)
    finally:
        kilnd.terminate()
        kilnd.wait(timeout=30)


if __name__ == "__main__":
    main()
