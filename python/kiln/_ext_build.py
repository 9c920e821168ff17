"""Builds the CPython extension _kiln_call on first use, for a Python that
the shipped one was not built for (as Triton builds its launcher).

A wheel or bundle carries _kiln_call built for the Python it was made with,
next to libkiln_c.so, and the extension's source (kiln_call.c and
client/kiln_c.h). Another Python (say 3.12 on a GPU machine where the wheel
was built with 3.11) would fall back to the ctypes call path, which costs
tens of microseconds per call; instead, when a C compiler and the Python
headers are there, build() compiles the source once into

    ${XDG_CACHE_HOME:-~/.cache}/kiln/ext/<hash>/_kiln_call<EXT_SUFFIX>

(<hash> over the source, the header, the interpreter's ABI and the
library's path) and later processes load it from there. A failed build is
not an error: it returns None and the ctypes path serves (the reason is in
build.log next to where the module would be). KILN_BUILD_EXTENSION=0 turns
it off; CC names the compiler (default: cc, else gcc).

Thread- and process-safety: the module is written to a temporary name and
renamed into place, so concurrent first uses build at most a few times and
never load a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Iterator, Optional, Tuple

__all__ = ["build", "sources"]


def sources(lib_path: pathlib.Path) -> Optional[Tuple[pathlib.Path, pathlib.Path]]:
    """(kiln_call.c, the include root holding client/kiln_c.h) for the
    library at lib_path, or None: a wheel's kiln/_native, a bundle's kiln/,
    or a source tree."""
    here = pathlib.Path(__file__).resolve().parent
    root = lib_path.resolve().parent.parent  # kiln/_native or the bundle's kiln/

    def pairs() -> Iterator[Tuple[pathlib.Path, pathlib.Path]]:
        yield root / "share" / "kiln" / "src" / "kiln_call.c", root / "include"
        yield here.parent / "ext" / "kiln_call.c", here.parent.parent  # source tree
    for src, inc in pairs():
        if src.is_file() and (inc / "client" / "kiln_c.h").is_file():
            return src, inc
    return None


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "kiln" / "ext"


def _compiler() -> Optional[str]:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return shutil.which("cc") or shutil.which("gcc")


def build(lib_path: pathlib.Path) -> Optional[pathlib.Path]:
    """The path of a _kiln_call module for this interpreter linked against
    the libkiln_c.so at lib_path: cached, or compiled now; None when it
    cannot be built here (see the module docstring)."""
    if os.environ.get("KILN_BUILD_EXTENSION", "") == "0":
        return None
    found = sources(lib_path)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    include = sysconfig.get_paths().get("include")
    if found is None or not suffix or not include or \
            not (pathlib.Path(include) / "Python.h").is_file():
        return None
    src, inc = found
    lib = lib_path.resolve()
    h = hashlib.sha256()
    for part in (src.read_bytes(), (inc / "client" / "kiln_c.h").read_bytes(),
                 suffix.encode(), sys.version.encode(), str(lib).encode()):
        h.update(hashlib.sha256(part).digest())
    out_dir = _cache_dir() / h.hexdigest()[:24]
    out = out_dir / f"_kiln_call{suffix}"
    if out.is_file():
        return out
    cc = _compiler()
    if cc is None:
        return None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp", suffix=suffix, dir=out_dir)
        os.close(fd)
        cmd = [cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden",
               f"-I{include}", f"-I{inc}", str(src), "-o", tmp, str(lib),
               f"-Wl,-rpath,{lib.parent}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        (out_dir / "build.log").write_text(
            " ".join(cmd) + "\n" + done.stdout + done.stderr)
        if done.returncode != 0:
            os.unlink(tmp)
            return None
        os.replace(tmp, out)
        return out
    except (OSError, subprocess.SubprocessError):
        return None
