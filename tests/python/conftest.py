"""pytest set-up for the Python package's tests against a real kilnd.

ctest runs them (tests/CMakeLists.txt, tests/python/run_pytest.sh) with the
project's venv (deploy/python-env.sh: torch from PyPI) and KILN_LIB
(libkiln_c.so), KILN_KILND (kilnd) and KILN_PYTHON_DIR (the package's
parent) set. By hand:

    PY=$(bash deploy/python-env.sh)
    KILN_LIB=build/client/libkiln_c.so KILN_KILND=build/server/kilnd \\
      $PY -m pytest tests/python -q
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_DIR = os.environ.get("KILN_PYTHON_DIR", str(ROOT / "python"))
sys.path.insert(0, PYTHON_DIR)
# The model suite (tests/models/) as the package `models`.
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("KILN_LIB", str(ROOT / "build" / "client" / "libkiln_c.so"))
KILND = os.environ.get("KILN_KILND", str(ROOT / "build" / "server" / "kilnd"))
# The AOTAutograd cache (kiln/aot_cache.py) of this pytest run: a fresh
# directory, shared by every test and subprocess of the run (so a graph an
# earlier test compiled is a hit in a later one), never the user's.
_AOT_DIR = tempfile.TemporaryDirectory(prefix="kiln_pytest_aot_")
os.environ["KILN_AOT_CACHE_DIR"] = _AOT_DIR.name


class Daemon:
    """kilnd on 127.0.0.1:0 with its own data dir; .address, .stop()."""

    def __init__(self, extra: List[str] = ()) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="kiln_pytest_")
        port_file = pathlib.Path(self.dir.name) / "port"
        # Output to a file: a daemon left behind must not hold ctest's pipe.
        self.log = open(pathlib.Path(self.dir.name) / "kilnd.log", "wb")
        self.proc = subprocess.Popen(
            [KILND, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
             "--compile_threads=2", f"--data_dir={self.dir.name}/data",
             f"--port_file={port_file}", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        port = 0
        deadline = time.time() + 30
        while time.time() < deadline and not port:
            lines = port_file.read_text().split() if port_file.exists() else []
            if lines:
                port = int(lines[0])
            elif self.proc.poll() is not None:
                break
            else:
                time.sleep(0.02)
        if not port:
            self.stop()
            raise RuntimeError("kilnd did not start")
        self.address = f"127.0.0.1:{port}"
        lines = port_file.read_text().split()
        self.metrics_port = int(lines[1]) if len(lines) > 1 else 0

    def metrics(self) -> Dict[str, float]:
        """kilnd's /metrics: {name: value} of its unlabelled samples
        (kiln_compiles_total, kiln_joins_total, kiln_cache_entries, ...)."""
        import urllib.request  # noqa: PLC0415

        with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
                values[parts[0]] = float(parts[1])
        return values

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()
        self.dir.cleanup()


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test compiles from scratch (Dynamo's caches are per process)."""
    try:
        import torch._dynamo  # noqa: PLC0415
    except ImportError:
        yield
        return
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def symbolic_module_ints() -> bool:
    """Whether this torch's Dynamo makes the int attributes of modules
    (a head count, a maximum length) symbols under dynamic=True. torch 2.6
    does (it has no allow_unspec_int_on_nn_module; 2.11 and 2.15 keep them
    constants): `d // heads` and `table[:seq]` then relate symbols Kiln
    cannot bound (`heads * (d // heads) == d`, `seq <= max_len`), so kilnd
    refuses those nodes and, with fallback="eager", they run eagerly."""
    import torch._dynamo.config  # noqa: PLC0415
    return not hasattr(torch._dynamo.config, "allow_unspec_int_on_nn_module")
