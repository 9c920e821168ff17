"""Shared by the Python benchmarks: the checkout's paths on sys.path
(python/ for kiln, tests/ for the model suite `models`), KILN_LIB defaulting
to the build tree's libkiln_c.so, a private kilnd on an ephemeral port and
a private, empty AOTAutograd cache. Imports without torch."""

from __future__ import annotations

import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (ROOT / "python", ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
os.environ.setdefault("KILN_LIB", str(ROOT / "build" / "client" / "libkiln_c.so"))
# A benchmark's first calls are cold: its own AOTAutograd cache
# (kiln/aot_cache.py), empty, removed at exit, inherited by the processes it
# starts; set KILN_AOT_CACHE_DIR to measure with another.
if "KILN_AOT_CACHE_DIR" not in os.environ:
    _AOT_DIR = tempfile.TemporaryDirectory(prefix="kiln_bench_aot_")
    os.environ["KILN_AOT_CACHE_DIR"] = _AOT_DIR.name


def step_ms(loss: Callable[[], Any], cuda: bool) -> float:
    """A training step's time: `loss()` (a scalar tensor) and its backward,
    3 warm-up steps, then the median of 7 timings of 10 steps, ms per step
    (CUDA: synchronized around each timing)."""
    import torch  # noqa: PLC0415 (this module imports without torch)

    for _ in range(3):
        loss().backward()
    times = []
    for _ in range(7):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            loss().backward()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / 10 * 1e3)
    return statistics.median(times)


def ms_per_call(call: Callable[[], Any], calls: int, cuda: bool,
                warmup: int = 2) -> float:
    """Milliseconds per `call()` over `calls` calls after `warmup` ones
    (CUDA: synchronized before and after the timed calls)."""
    import torch  # noqa: PLC0415 (this module imports without torch)

    for _ in range(warmup):
        call()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    if cuda:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / calls


def kilnd_binary() -> str:
    return os.environ.get("KILN_KILND", str(ROOT / "build" / "server" / "kilnd"))


class Kilnd:
    """kilnd on 127.0.0.1:0 with `data_dir` (default: a fresh temporary
    one, removed by stop()); .address; a context manager."""

    def __init__(self, data_dir: Optional[str] = None,
                 extra: List[str] = (), compile_threads: int = 2) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kiln_bench_")
        self.data_dir = data_dir or os.path.join(self._tmp.name, "data")
        port_file = pathlib.Path(self._tmp.name) / "port"
        self._log = open(pathlib.Path(self._tmp.name) / "kilnd.log", "wb")
        self.proc = subprocess.Popen(
            [kilnd_binary(), "--listen=127.0.0.1:0", "--metrics_listen=",
             f"--compile_threads={compile_threads}",
             f"--data_dir={self.data_dir}", f"--port_file={port_file}",
             *extra], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        port = 0
        while time.time() < deadline and not port:
            if port_file.exists() and port_file.read_text().split():
                port = int(port_file.read_text().split()[0])
            elif self.proc.poll() is not None:
                break
            else:
                time.sleep(0.01)
        if not port:
            self.stop()
            raise RuntimeError(f"kilnd did not start ({kilnd_binary()})")
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._tmp.cleanup()

    def __enter__(self) -> "Kilnd":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
