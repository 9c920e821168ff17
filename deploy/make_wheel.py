#!/usr/bin/env python3
"""Packs a staged bundle (deploy/bundle.sh --stage-only) into a wheel:

    kiln/*.py                     the package (python/kiln)
    kiln/_native/bin/             kilnd, kilnctl (the per-user kilnd that
                                  kiln/autostart.py starts is this one)
    kiln/_native/lib/             libkiln_c.so.1, its private shared
                                  libraries (RPATH $ORIGIN), _kiln_call for
                                  the Python the build had
    kiln/_native/share/kiln/      libdevice, glibc's link inputs for kilnd's
                                  CPU kernels, the extension's source
    kiln/_native/include/client/  kiln_c.h (the extension's build, C users)

so that `pip install kiln-*.whl` works on a machine without gRPC, RocksDB
or LLVM (glibc >= 2.36, libstdc++ from GCC >= 12; NVIDIA's libraries come
with the GPU machine). Tag py3-none-linux_x86_64: the package is pure
Python over a C ABI, and the extension, where it does not match the running
Python, is rebuilt on first use (kiln/_ext_build.py) or skipped.

    deploy/make_wheel.py --stage build-bundle/bundle-stage/kiln \\
        --pyproject python/pyproject.toml --out-dir dist

Prints the wheel's path. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import pathlib
import re
import stat
import sys
import zipfile
from typing import List, Tuple

TAG = "py3-none-linux_x86_64"


def _version(pyproject: pathlib.Path) -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
    if not m:
        raise SystemExit(f"make_wheel: no version in {pyproject}")
    return m.group(1)


def _files(stage: pathlib.Path) -> List[Tuple[pathlib.Path, str]]:
    """(source file, path in the wheel) for everything the wheel holds."""
    out = []
    for f in sorted((stage / "python" / "kiln").glob("*.py")):
        out.append((f, f"kiln/{f.name}"))
    for sub in ("bin", "lib", "share/kiln"):
        base = stage / sub
        for f in sorted(base.rglob("*")):
            rel = f.relative_to(stage).as_posix()
            if f.is_symlink() or not f.is_file():
                continue  # sonames are the files; dev symlinks are not needed
            if rel.startswith(("lib/pkgconfig", "share/kiln/tests",
                               "share/kiln/examples")):
                continue
            if rel.startswith("lib/libkiln_client"):
                continue  # the C++ API: the bundle's, with its headers
            out.append((f, f"kiln/_native/{rel}"))
    header = stage / "include" / "client" / "kiln_c.h"
    out.append((header, "kiln/_native/include/client/kiln_c.h"))
    return out


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "sha256=" + digest.rstrip(b"=").decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", required=True, type=pathlib.Path)
    ap.add_argument("--pyproject", required=True, type=pathlib.Path)
    ap.add_argument("--out-dir", required=True, type=pathlib.Path)
    a = ap.parse_args()
    stage = a.stage.resolve()
    if not (stage / "lib" / "libkiln_c.so.1").is_file():
        raise SystemExit(f"make_wheel: {stage}/lib/libkiln_c.so.1 not found "
                         "(not a staged bundle)")
    version = _version(a.pyproject)
    dist_info = f"kiln-{version}.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: kiln",
        f"Version: {version}",
        'Summary: Kiln: a compile service for PyTorch graphs; '
        'torch.compile(model, backend="kiln")',
        "Requires-Python: >=3.9",
        "Provides-Extra: torch",
        'Requires-Dist: torch>=2.6; extra == "torch"',
        "", "torch.compile(model, backend=\"kiln\"): graphs compiled once by "
        "kilnd, run on Kiln's runtime. kilnd and kilnctl are inside "
        "(kiln/_native/bin; the `kilnd` and `kilnctl` commands). See the "
        "repository README.", ""])
    wheel = "\n".join(["Wheel-Version: 1.0", "Generator: kiln make_wheel.py",
                       "Root-Is-Purelib: false", f"Tag: {TAG}", ""])
    entry_points = "\n".join([
        "[torch_dynamo_backends]", "kiln = kiln:_dynamo_backend", "",
        "[console_scripts]", "kilnd = kiln._tools:kilnd",
        "kilnctl = kiln._tools:kilnctl", ""])
    a.out_dir.mkdir(parents=True, exist_ok=True)
    path = a.out_dir / f"kiln-{version}-{TAG}.whl"
    tmp = path.with_suffix(".whl.tmp")
    records = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            records.append(f"{name},{_record_hash(data)},{len(data)}")
        for src, name in _files(stage):
            mode = 0o755 if os.access(src, os.X_OK) and "/bin/" in name else 0o644
            add(name, src.read_bytes(), mode)
        add(f"{dist_info}/METADATA", metadata.encode())
        add(f"{dist_info}/WHEEL", wheel.encode())
        add(f"{dist_info}/entry_points.txt", entry_points.encode())
        add(f"{dist_info}/top_level.txt", b"kiln\n")
        records.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        z.writestr(info, "\n".join(records) + "\n", zipfile.ZIP_DEFLATED)
    os.replace(tmp, path)
    print(path)


if __name__ == "__main__":
    sys.exit(main())
