"""The `kilnd` and `kilnctl` commands of an installed wheel: each runs the
binary of the same name in kiln/_native/bin with the command's arguments
(exec: same process, same exit status). From a source tree or a bundle,
run build/server/kilnd or kiln/bin/kilnd directly."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import NoReturn

__all__ = ["kilnctl", "kilnd"]


def _exec(name: str) -> NoReturn:
    path = pathlib.Path(__file__).resolve().parent / "_native" / "bin" / name
    if not path.is_file():
        sys.exit(f"{name}: not found at {path} (this kiln package is not an "
                 "installed wheel)")
    os.execv(str(path), [str(path), *sys.argv[1:]])


def kilnd() -> NoReturn:
    """Runs kiln/_native/bin/kilnd."""
    _exec("kilnd")


def kilnctl() -> NoReturn:
    """Runs kiln/_native/bin/kilnctl."""
    _exec("kilnctl")
