"""AOTAutograd without its eager graph printing, unless someone reads it.

aot_module_simplified builds its AOTConfig with enable_log=True and no way
to pass False. With it, every compile prints the joint, forward and
backward graphs to strings (GraphModule.print_readable with strides and
devices) before the loggers decide whether anyone listens: 2-4% of a warm
first call of a static graph, a fifth of AOTAutograd's time on a large
graph with dynamic shapes, where every stride prints as a sympy
expression (bench/python/first_call.py, real_models.py --dynamic;
README's "First call" numbers). enable_log gates nothing but that logging
(torch 2.6-2.15).

quiet_aot_logs() makes aot_module_simplified's config say enable_log=False
for one call, when nothing would read the logs: no TORCH_LOGS artifact
(aot_graphs, aot_joint_graph, ...), no log level set through
torch._logging, no TORCH_TRACE, and no handler but torch's own on its
structured-trace logger (pytest's log capture adds some: under pytest
the graphs print as before). It is a no-op where this torch's
AOTAutograd is not shaped as expected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Any, Iterator, Optional

__all__ = ["quiet_aot_logs"]

_lock = threading.Lock()
_quiet_class: Optional[type] = None


def _torch_logs_requested() -> bool:
    """Whether torch's logging could print AOTAutograd's graphs."""
    if os.environ.get("TORCH_TRACE") or os.environ.get("TORCH_LOGS"):
        return True
    try:
        from torch._logging import _internal  # noqa: PLC0415
        state = _internal.log_state
        if state.artifact_names or state.log_qname_to_level:
            return True
        return any(getattr(h, "root_dir", None) is not None
                   or type(h).__name__ != "LazyTraceHandler"
                   for h in _internal.trace_log.handlers)
    except Exception:  # noqa: BLE001 (another torch: assume someone reads)
        return True


def _quiet_config_class(base: Any) -> Optional[type]:
    """AOTConfig with enable_log defaulting to False, or None when base is
    not a dataclass with that field (frozen from some torch after 2.11,
    not before: the subclass is as frozen as its base)."""
    global _quiet_class  # noqa: PLW0603 (built once, on first use)
    if _quiet_class is not None and _quiet_class.__mro__[1] is base:
        return _quiet_class
    if not dataclasses.is_dataclass(base) or "enable_log" not in {
            f.name for f in dataclasses.fields(base)}:
        return None
    quiet = dataclasses.make_dataclass(
        "AOTConfig", [("enable_log", bool, dataclasses.field(default=False))],
        bases=(base,), frozen=base.__dataclass_params__.frozen)
    quiet.__module__ = base.__module__
    quiet.__qualname__ = base.__qualname__
    _quiet_class = quiet
    return quiet


@contextlib.contextmanager
def quiet_aot_logs() -> Iterator[None]:
    """Within: aot_module_simplified's AOTConfig has enable_log=False,
    unless torch's logs are requested (see the module's docstring).
    Thread-safe: one thread swaps the module's AOTConfig at a time (Dynamo
    compiles one frame at a time anyway); others run unchanged."""
    if _torch_logs_requested() or not _lock.acquire(blocking=False):
        yield
        return
    try:
        try:
            from torch._functorch import aot_autograd  # noqa: PLC0415
            base = aot_autograd.AOTConfig
            quiet = _quiet_config_class(base)
        except Exception:  # noqa: BLE001 (another torch: leave it be)
            quiet = None
        if quiet is None:
            yield
            return
        aot_autograd.AOTConfig = quiet
        try:
            yield
        finally:
            aot_autograd.AOTConfig = base
    finally:
        _lock.release()
