"""The Dynamo backend: ``torch.compile(model, backend="kiln")``.

KilnBackend is a Dynamo backend built on AOTAutograd
(torch._dynamo.backends.common.aot_autograd) with the Core ATen
decompositions minus every op Kiln lowers itself (_softmax, _log_softmax,
native_layer_norm, gelu, ...: whatever kiln.supported_ops() holds), for the
forward and the backward graph alike. Each graph is partitioned by what Kiln
runs (kiln/partition.py); each partition is translated (kiln/fx_graph.py)
and compiled once through kilnd when AOTAutograd hands the graph over, and
called on the CPU or CUDA runtime without copies: inputs are passed as they
are (strides and storage offsets included); CPU outputs are written into
tensors allocated here with torch.empty, CUDA outputs are allocated by
PyTorch's caching allocator. Everything else runs eagerly in between.
Complex values (rotary embeddings written with view_as_complex) are held as
pairs of reals before partitioning (kiln/complex.py).

Outputs: a partition output that is one of its inputs is returned as
itself; an output whose expected strides (the fake tensor's) are a dense
layout in another dim order (a transpose, channels-last) is written by Kiln
in that order and handed over as a permuted view (kiln/fx_graph.py,
permuted_layout: no copy); any other non-contiguous expectation (gaps,
overlaps) is copied once into a tensor of those strides.

Call path: a partition without scalar inputs or restrided outputs is
called through the extension _kiln_call where it is built (kiln._binding's
docstring): reading the inputs, torch.empty for the outputs, the program and
the result tuple in C, from the FX module's call straight to it. Otherwise,
or with KILN_NO_EXTENSION=1, the Python path below does the same through
ctypes.

Server: kiln.backend(server=...), else $KILN_SERVER, else 127.0.0.1:7733
when it answers, else a per-user kilnd on a Unix socket started on first use
(kiln/autostart.py; KILN_AUTOSTART=0 turns that off). A kilnd with tokens,
TLS or signed artifacts (README.md, "Running kilnd for a team"):
kiln.backend(token=... or token_file=..., trusted_keys=[...], tls_ca=...,
tls_cert=..., tls_key=..., tls_server_name=...), each else its environment
variable (KILN_TOKEN, KILN_TOKEN_FILE, KILN_TRUSTED_KEYS, KILN_TLS_CA, ...).
A token kilnd refuses (UNAUTHENTICATED, PERMISSION_DENIED) or an artifact
not signed by a trusted key is a failed compile: eager with one warning,
or KilnError with fallback="error".

Failures: an op Kiln lacks runs eagerly, always. An index out of range
(embedding, gather, index_select, index, index_put, scatter, nll_loss
target) raises kiln.KilnIndexError, an IndexError as in eager PyTorch,
naming Kiln's node and op; it is never retried eagerly. On CUDA, as
PyTorch's device-side assert, it is raised by a later call of the same
partition (CudaExecutable.Run's comment). A server that cannot be
reached or a partition that fails to compile runs eagerly with one warning
per backend (fallback="eager", the default), or raises KilnError
(fallback="error"). Graphs compiled within 10 s after kilnd was unreachable
run eagerly without trying it; later ones try again. KILN_LOG=fallback prints, per compiled graph, each op
that did not run in Kiln, why, and how often; explain() returns the same
report for a model.

dynamic=True: symbolic sizes become Kiln symbols, except in a graph with
a convolution or pooling over symbolic channel or spatial sizes (Kiln lays
their windows out at compile time): that graph is compiled per concrete
size on its first call with it (SpecializedGraph), without a Dynamo
recompile.

Devices: a partition's tensors are all on the CPU or all on one CUDA
device (a node mixing devices runs eagerly). CUDA partitions are compiled
for that device's architecture (sm_XY) and run on PyTorch's current stream
with PyTorch's caching allocator, outputs handed over without copies
(DLPack).
"""

from __future__ import annotations

import collections
import copy
import functools
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx

from . import _binding
from .aot_cache import (Capture, NotCacheable, default_store, graph_key,
                        load_graph, make_runtime)
from .aot_logs import quiet_aot_logs
from .attention import resolve_policy, rewrite_attention
from .complex import BOUNDARY as COMPLEX_BOUNDARY, lower_complex
from .cudagraphs import cudagraph_aot
from .foreach import foreach_decompositions
from .remat import kiln_default_partition
from .decompositions import extra_decompositions
from .autostart import resolve_server
from .fx_graph import (COMPARISON_OPS, RANDOM_OPS, KilnGraph, Unsupported,
                       ViewOutput,
                       align_norm_stats_with_eager,
                       arange_from_symbolic_starts, batch_input_writes,
                       draw_seed, give_constants_values,
                       input_write_candidates, is_contiguous,
                       share_float64_scalar_converts, size_input_tensor,
                       to_kiln_graph)
from .partition import (KilnOperatorSupport, graph_device, partition,
                        symbolic_window_op)

__all__ = ["ExplainReport", "KilnBackend", "default_backend", "explain"]


@dataclass
class OpReport:
    """How one op's nodes ran: in Kiln, or eagerly and why."""

    kiln: int = 0
    fallback: collections.Counter = field(default_factory=collections.Counter)


@dataclass
class ExplainReport:
    """The fallback report of the graphs a backend compiled.

    ops: per Core ATen overload, nodes run in Kiln and fallbacks by reason.
    graphs: FX graphs compiled (forward and backward count apart).
    partitions: partitions sent to Kiln (compiled or not).
    compiled_partitions: of those, compiled and run in Kiln.
    dynamic_partitions: of those, with symbolic sizes (Graph.symbols).
    specializations: static copies of graphs compiled per concrete size
        (SpecializedGraph; not counted in `graphs`).
    """

    ops: Dict[str, OpReport] = field(default_factory=dict)
    graphs: int = 0
    partitions: int = 0
    compiled_partitions: int = 0
    dynamic_partitions: int = 0
    specializations: int = 0

    def op(self, name: str) -> OpReport:
        return self.ops.setdefault(name, OpReport())

    @property
    def fallbacks(self) -> Dict[str, Dict[str, int]]:
        """{op: {reason: count}} for every op that fell back."""
        return {name: dict(r.fallback) for name, r in sorted(self.ops.items())
                if r.fallback}

    @property
    def kiln_nodes(self) -> int:
        return sum(r.kiln for r in self.ops.values())

    @property
    def fallback_nodes(self) -> int:
        return sum(sum(r.fallback.values()) for r in self.ops.values())

    def merge(self, other: "ExplainReport") -> None:
        self.graphs += other.graphs
        self.partitions += other.partitions
        self.compiled_partitions += other.compiled_partitions
        self.dynamic_partitions += other.dynamic_partitions
        self.specializations += other.specializations
        for name, r in other.ops.items():
            mine = self.op(name)
            mine.kiln += r.kiln
            mine.fallback.update(r.fallback)

    def __str__(self) -> str:
        total = self.kiln_nodes + self.fallback_nodes
        sizes = (f" (+{self.specializations} per-size compile(s))"
                 if self.specializations else "")
        lines = [f"kiln: {self.graphs} graph(s){sizes}, "
                 f"{self.compiled_partitions}/{self.partitions} partition(s) "
                 f"compiled, {self.kiln_nodes}/{total} ATen nodes in Kiln"]
        for name, reasons in self.fallbacks.items():
            for reason, count in sorted(reasons.items()):
                lines.append(f"  fallback {name} x{count}: {reason}")
        return "\n".join(lines)


# Ops the Core ATen table decomposes that stay whole here:
# _scaled_dot_product_flash_attention_for_cpu's decomposition (the math
# path) returns the attention weights where the backward op expects the
# logsumexp: wrong gradients (Inductor excludes it too, see
# torch/_decomp/decompositions.py). Fused attention is an extern step for
# Kiln (DESIGN.md decision 10); until then it runs eagerly.
_KEEP = frozenset({"aten._scaled_dot_product_flash_attention_for_cpu.default"})


def _core_aten_table() -> Dict[Any, Callable[..., Any]]:
    """Core ATen's decompositions. Since torch 2.6 core_aten_decompositions()
    materialises torch.export's table, which adds PyTorch's
    CompositeImplicitAutograd ops (they decompose by themselves while
    AOTAutograd traces) and took 0.07-0.17 s of a process's first compile;
    the post-autograd table it starts from is the same for AOTAutograd and
    takes 2 ms. Older torch: core_aten_decompositions()."""
    import torch._decomp as decomp  # noqa: PLC0415

    post_autograd = getattr(decomp, "_core_aten_decompositions_post_autograd",
                            None)
    if post_autograd is not None:
        return post_autograd()
    return decomp.core_aten_decompositions()


# After kilnd was unreachable, graphs compiled within this many seconds run
# eagerly without trying it again.
_RETRY_SECONDS = 10.0


@functools.lru_cache(maxsize=None)
def _prepare_cpu_runtime() -> threading.Thread:
    """Starts, once per process, a thread that pays the CPU runtime's BLAS
    start-up (kiln_cpu_runtime_prepare: about 70 ms for oneDNN on the
    2-core machine) while Dynamo traces the model, instead of the first
    run of a partition with a matrix product. A failure is left to that
    run, which reports it."""
    def prepare() -> None:
        try:
            _binding.prepare_cpu_runtime()
        except Exception:  # noqa: BLE001 (the first run reports it)
            pass

    thread = threading.Thread(target=prepare, name="kiln-cpu-prepare",
                              daemon=True)
    thread.start()
    return thread


def _aot_graphs_logged() -> bool:
    """Whether torch's logs ask for AOTAutograd's graphs (TORCH_LOGS=
    aot_graphs, aot_joint_graph): then it traces, cache or not."""
    try:
        from torch._logging._internal import log_state  # noqa: PLC0415

        return any(log_state.is_artifact_enabled(a)
                   for a in ("aot_graphs", "aot_joint_graph"))
    except (ImportError, AttributeError):
        return False


def _log_enabled(category: str = "fallback") -> bool:
    """Whether KILN_LOG names `category` ("fallback", "aot")."""
    return category in os.environ.get("KILN_LOG", "").split(",")


# How a backend reaches kilnd beyond its address: kiln.Client's keyword
# arguments (token, token_file, trusted_keys, tls_*) as sorted pairs, the
# unset ones left out.
_Auth = Tuple[Tuple[str, str], ...]
_CLIENTS: Dict[Tuple[str, int, _Auth], "_binding.Client"] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(server: str, max_retries: int, auth: _Auth = ()) -> "_binding.Client":
    """One kiln Client per (server, retries, credentials) for the process,
    so that its in-process cache serves every graph of every backend."""
    key = (server, max_retries, auth)
    with _CLIENTS_LOCK:
        c = _CLIENTS.get(key)
        if c is None:
            c = _CLIENTS[key] = _binding.Client(
                server, rpc_deadline_seconds=300, max_retries=max_retries,
                **dict(auth))
        return c


def _drop_client(server: str, max_retries: int, auth: _Auth = ()) -> None:
    """Forgets the client of a server that was unreachable: its gRPC channel
    waits out a reconnect backoff (seconds) before it tries again, so the
    next attempt gets a new channel. (Loaded executables stay alive in the
    partitions that hold them.)"""
    with _CLIENTS_LOCK:
        _CLIENTS.pop((server, max_retries, auth), None)


class KilnPartition(torch.nn.Module):
    """A partition's submodule replaced by its Kiln executable (the eager
    submodule is kept for a call whose inputs the executable refuses)."""

    def __init__(self, name: str, eager: torch.fx.GraphModule,
                 graph: KilnGraph, exe: Any,
                 backend: "KilnBackend", tuple_output: bool = True) -> None:
        super().__init__()
        self._tuple_output = tuple_output
        self.name = name
        self.eager = eager
        self.graph = graph
        self.exe = exe
        self.backend = backend
        self._static_sizes: Optional[List[Tuple[int, ...]]] = None
        if not graph.dynamic:
            self._static_sizes = [tuple(int(s) for s in m.shape)
                                  for m in graph.output_meta]
        self._dtypes = [m.dtype for m in graph.output_meta]
        # Per Kiln output: None when PyTorch expects it contiguous (what Kiln
        # writes), else its strides: ints, or sympy expressions over the
        # symbols of the inputs' sizes (evaluated per call).
        self._strides: List[Any] = []
        self._symbol_dims: Dict[Any, Tuple[int, int]] = {}  # symbol -> (input, dim)
        for k, size_input in graph.size_inputs.items():
            if size_input.expr.is_Symbol:
                self._symbol_dims.setdefault(size_input.expr, (k, 0))
        for k, m in enumerate(graph.input_meta):
            if m is None:  # a size input
                continue
            for d, size in enumerate(m.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    self._symbol_dims.setdefault(size.node.expr, (k, d))
        for m in graph.output_meta:
            if is_contiguous(m):
                self._strides.append(None)
            elif all(isinstance(s, int) for s in m.stride()):
                self._strides.append(tuple(m.stride()))
            else:
                exprs = [s.node.expr if isinstance(s, torch.SymInt) else s
                         for s in m.stride()]
                unbound = {sym for e in exprs
                           for sym in getattr(e, "free_symbols", ())
                           } - set(self._symbol_dims)
                if unbound:
                    raise Unsupported(
                        "an output's expected strides depend on sizes the "
                        "partition's inputs do not give ("
                        f"{', '.join(sorted(map(str, unbound)))})")
                self._strides.append(exprs)
        # The extension's callable for the whole call (None: the Python
        # path): when every Kiln input is a tensor argument and every output
        # is wanted contiguous.
        # Otherwise, the extension's run of the Kiln inputs (the tensors
        # forward builds) to the Kiln outputs, else None: ctypes.
        self._fast: Optional[Callable[..., Any]] = None
        self._run: Optional[Callable[..., Any]] = None
        self._cuda = graph.device.type == "cuda"
        # CPU executables take the outputs' sizes when they are static.
        sizes = () if self._cuda else (self._static_sizes,)
        # Outputs Kiln writes in a permuted order (KilnGraph.output_perms):
        # permuted back here, a view.
        self._perms = [(j, p) for j, p in enumerate(graph.output_perms) if p]
        # Under CUDA graph trees (kiln/cudagraphs.py: a graph compiled with
        # owned_outputs) outputs must be memory PyTorch's allocator owns
        # with its own deleter: written into torch.empty tensors
        # (run_into), never handed over by DLPack.
        # (Symbolic sizes are never captured: cudagraphs.py skips them.)
        self._owned_outputs = self._cuda and not graph.dynamic and getattr(
            backend._tls, "owned_outputs", False)
        if self._owned_outputs:
            return  # forward runs _run_owned; no call path
        if not graph.scalar_inputs and not graph.size_inputs and \
                not self._perms and not graph.moved_inputs and \
                all(s is None for s in self._strides) and \
                all(v.static for v in graph.view_outputs):
            self._fast = exe.call_path(graph.tensor_inputs,
                                       self._call_outputs(), tuple_output,
                                       *sizes)
        else:
            self._run = exe.call_path(
                range(len(graph.tensor_inputs)),
                [("kiln", j) for j in range(len(graph.output_meta))],
                True, *sizes)

    def _call_outputs(self) -> List[Tuple[Any, ...]]:
        """graph.outputs as call_path takes them (views static)."""
        entries: List[Tuple[Any, ...]] = []
        for kind, i in self.graph.outputs:
            if kind != "view":
                entries.append((kind, i))
                continue
            v = self.graph.view_outputs[i]
            entries.append((f"view_{v.base[0]}", v.base[1], v.sizes,
                            v.strides, v.offset))
        return entries

    def _run_owned(self, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
        """The CUDA run into torch.empty outputs (_owned_outputs; captured
        graphs have static sizes). Where the program needs larger output
        buffers, the run's own outputs are copied into them."""
        outs = [torch.empty(s, dtype=d, device=self.graph.device)
                for s, d in zip(self._static_sizes, self._dtypes)]
        try:
            self.exe.run_into(tensors, outs)
            return outs
        except _binding.KilnError as e:
            if e.code != 9:  # FAILED_PRECONDITION: larger buffers
                raise
        return [torch.empty_like(o, memory_format=torch.contiguous_format)
                .copy_(o) for o in self.exe(*tensors)]

    def _symbol_values(self, tensors: List[torch.Tensor]) -> Dict[Any, int]:
        return {sym: tensors[k].shape[d]
                for sym, (k, d) in self._symbol_dims.items()}

    def _expected_strides(self, j: int, tensors: List[torch.Tensor]) -> Tuple[int, ...]:
        want = self._strides[j]
        if isinstance(want, tuple):
            return want
        return _evaluate(want, self._symbol_values(tensors))

    def _view(self, v: ViewOutput, outs: List[torch.Tensor],
              args: Tuple[Any, ...], tensors: List[torch.Tensor]) -> torch.Tensor:
        """ViewOutput v of this call."""
        kind, i = v.base
        base = outs[i] if kind == "kiln" else args[i]
        if v.static:
            sizes, strides, offset = v.sizes, v.strides, v.offset
        else:
            values = self._symbol_values(tensors)
            sizes, strides = (_evaluate(v.sizes, values),
                              _evaluate(v.strides, values))
            offset = _evaluate((v.offset,), values)[0]
        return base.as_strided(sizes, strides, base.storage_offset() + offset)

    def __call__(self, *args: Any) -> Any:
        # What the FX module calls (nn.Module.__call__'s hook machinery
        # skipped: a partition has no hooks).
        fast = self._fast
        if fast is None:
            return self.forward(*args)
        try:
            if self.graph.seeded:
                return fast(*args, draw_seed(self.graph.device))
            return fast(*args)
        except Exception as e:  # noqa: BLE001 (KilnError: a guard, memory)
            return self._failed(e, args)

    def _failed(self, e: Exception, args: Tuple[Any, ...]) -> Any:
        if isinstance(e, _binding.KilnIndexError):
            # The user's error, not Kiln's: an index out of range raises
            # IndexError as PyTorch would, whatever the fallback (running
            # the partition eagerly would only raise PyTorch's own).
            raise _binding.KilnIndexError(e.code, f"{self.name}: {e.message}") \
                from None
        if self.backend.fallback == "error":
            if isinstance(e, _binding.KilnError):
                got = ", ".join(
                    f"{tuple(t.shape)} {str(t.dtype)[6:]}"
                    if isinstance(t, torch.Tensor) else type(t).__name__
                    for t in (args[i] for i in self.graph.tensor_inputs))
                want = ", ".join(i["meta"]["dtype"].lower()
                                 for i in self.graph.graph["inputs"])
                raise _binding.KilnError(
                    e.code, f"{self.name}: {e.message} (called with {got}; "
                    f"compiled for {want})") from e
            raise e
        self.backend._warn_once(f"kiln: {self.name}: {e}; running it eagerly")
        return self.eager(*args)

    def forward(self, *args: Any) -> Any:
        kiln_args = (args + (draw_seed(self.graph.device),) if self.graph.seeded
                     else args)
        tensors = [kiln_args[i] for i in self.graph.tensor_inputs]
        for k, dtype in self.graph.scalar_inputs.items():
            tensors[k] = torch.tensor(tensors[k], dtype=dtype,
                                      device=self.graph.device)
        for k, size_input in self.graph.size_inputs.items():
            tensors[k] = size_input_tensor(size_input.value(tensors[k]),
                                           self.graph.device)
        for k in self.graph.moved_inputs:
            tensors[k] = tensors[k].to(self.graph.device)
        try:
            if self._owned_outputs:
                outs = self._run_owned(tensors)
            elif self._run is not None:
                outs = list(self._run(*tensors))
            elif self._cuda:
                outs = self.exe(*tensors)
            else:
                sizes = self._static_sizes or self.exe.output_sizes(tensors)
                outs = [torch.empty(s, dtype=d)
                        for s, d in zip(sizes, self._dtypes)]
                self.exe.run_into(tensors, outs)
        except Exception as e:  # noqa: BLE001 (KilnError: a guard, memory)
            return self._failed(e, args)
        for j, perm in self._perms:
            outs[j] = outs[j].permute(perm)
        for j, want in enumerate(self._strides):
            if want is not None:
                outs[j] = restrided(outs[j], self._expected_strides(j, tensors))
        result = tuple(
            outs[i] if kind == "kiln" else args[i] if kind == "input" else
            self._view(self.graph.view_outputs[i], outs, args, tensors)
            for kind, i in self.graph.outputs)
        return result if self._tuple_output else result[0]

    _tuple_output = True


def _evaluate(exprs: Sequence[Any], values: Dict[Any, int]) -> Tuple[int, ...]:
    """Sizes given as ints or sympy expressions, for symbol values."""
    return tuple(int(e.xreplace(values)) if hasattr(e, "xreplace") else int(e)
                 for e in exprs)


def restrided(t: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    """t's values in a tensor with the given strides (what PyTorch's own
    kernel would have returned). A stride of 0 over a dim longer than 1 is
    an expanded value (PyTorch returns a broadcast view, e.g. BERT's
    token-type ids): its first slice is stored once and expanded, since no
    tensor can be written through overlapping strides."""
    zero = [d for d, (n, s) in enumerate(zip(t.shape, strides))
            if s == 0 and n > 1]
    src = t
    for d in zero:
        src = src.narrow(d, 0, 1)
    base = torch.empty_strided(src.shape, tuple(strides), dtype=t.dtype,
                               device=t.device).copy_(src)
    return base.expand(t.shape) if zero else base


def recompute_partition(joint_module: torch.fx.GraphModule,
                        joint_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """AOTAutograd's min-cut rematerialization partitioner (Inductor's),
    except that a value the backward compares is saved, never recomputed.
    The backward of amax and max compares the saved maximum with the input
    it came from (eq); recomputed by another kernel, with another fusion,
    vector width or libm variant than the forward's, that input can differ
    from the forward's in its last bit, no element equals the maximum and
    the gradient is 0/0 (found by tests/python/test_backend.py). So every
    value a comparison reads that does not depend on the tangents (one the
    backward could otherwise recompute) is tagged MUST_SAVE
    (torch.utils.checkpoint's policy, which the partitioner honours): the
    comparison reads the forward's own bits, saved or compared there.
    Values computed from the tangents are the backward's own and stay."""
    from torch._functorch.partitioners import (  # noqa: PLC0415
        min_cut_rematerialization_partition)
    from torch.utils.checkpoint import CheckpointPolicy  # noqa: PLC0415

    backward: set = set()
    for node in joint_module.graph.nodes:
        if (node.op == "placeholder" and node.name.startswith("tangents")) or \
                any(isinstance(a, torch.fx.Node) and a in backward
                    for a in node.all_input_nodes):
            backward.add(node)
    for node in joint_module.graph.nodes:
        if node.op != "call_function" or str(node.target) not in COMPARISON_OPS:
            continue
        for arg in node.all_input_nodes:
            if arg not in backward and arg.op != "placeholder":
                arg.meta["recompute"] = CheckpointPolicy.MUST_SAVE
    return min_cut_rematerialization_partition(joint_module, joint_inputs,
                                               **kwargs)


class KilnBackend:
    """A Dynamo backend (see the module docstring): ``backend(gm,
    example_inputs)`` returns the compiled callable. ``report`` accumulates
    the fallback report of every graph it compiled."""

    def __init__(self, server: Optional[str] = None, fast_math: bool = False,
                 fallback: str = "eager", fuse_gemm_epilogues: bool = True,
                 recompute: bool = False, foreach: Optional[bool] = None,
                 cudagraphs: Optional[bool] = None,
                 attention: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None,
                 trusted_keys: Optional[Any] = None,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None,
                 aot_cache: Optional[bool] = None,
                 eager_random: Optional[bool] = None) -> None:
        if fallback not in ("eager", "error"):
            raise ValueError(f"fallback={fallback!r}: expected 'eager' or 'error'")
        self.attention = resolve_policy(attention)
        if trusted_keys is not None and not isinstance(trusted_keys, str):
            trusted_keys = ",".join(trusted_keys)
        auth = {"token": token, "token_file": token_file,
                "trusted_keys": trusted_keys, "tls_ca": tls_ca,
                "tls_cert": tls_cert, "tls_key": tls_key,
                "tls_server_name": tls_server_name}
        for name, value in auth.items():
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise TypeError(f"{name}: expected a string, got "
                                f"{type(value).__name__}")
        self._auth: _Auth = tuple(sorted((k, os.fspath(v))
                                         for k, v in auth.items() if v))
        self.server = server
        self.fast_math = bool(fast_math)
        # None: resolved per graph (eager_random()).
        self._eager_random = eager_random
        self.fuse_gemm_epilogues = bool(fuse_gemm_epilogues)
        # The devices whose graphs run _foreach_* ops in Kiln (kiln.backend's
        # `foreach`): by default the CPU's, where the update written in place
        # beats PyTorch's foreach kernels; on CUDA those are one launch per
        # group of tensors against Kiln's per tensor (bench/README.md,
        # session 25).
        env = os.environ.get("KILN_FOREACH")
        if foreach is None and env in ("0", "1"):
            foreach = env == "1"
        self.foreach_devices = (frozenset({"cpu"}) if foreach is None else
                                frozenset({"cpu", "cuda"}) if foreach else
                                frozenset())
        env = os.environ.get("KILN_CUDAGRAPHS")
        if cudagraphs is None:
            cudagraphs = env == "1"
        # CUDA graphs around each compiled CUDA graph (kiln/cudagraphs.py).
        self.cudagraphs = bool(cudagraphs)
        self.fallback = fallback
        self.report = ExplainReport()
        self._warned = False
        self._server_down: Optional[str] = None
        self._server_down_until = 0.0
        self._address: Optional[str] = None
        self._lock = threading.Lock()
        self._tls = threading.local()  # owned_outputs of the compile in hand
        self._ops: Optional[frozenset] = None
        from torch._dynamo.backends.common import aot_autograd  # noqa: PLC0415

        # recompute=True: as Inductor, the backward recomputes what is cheap
        # to recompute (in its own fused kernels) instead of the forward
        # saving it (kiln.backend's `recompute`).
        self.recompute = bool(recompute)

        def aot(foreach_ops: bool) -> Any:
            return aot_autograd(fw_compiler=self._compile_graph,
                                bw_compiler=self._compile_graph,
                                **self._aot_options(foreach_ops))

        # Graphs of a device in foreach_devices take the second.
        self._aot, self._aot_foreach = aot(False), aot(True)
        self.__name__ = "kiln"
        # AOTAutograd's results kept between processes (kiln/aot_cache.py):
        # None follows KILN_AOT_CACHE.
        self._aot_store = default_store() if aot_cache is not False else None
        self._aot_counts: collections.Counter = collections.Counter()
        if os.environ.get("KILN_CPU_PREPARE", "1") != "0":
            _prepare_cpu_runtime()

    def _aot_options(self, foreach_ops: bool) -> Dict[str, Any]:
        """aot_autograd's arguments other than the compilers."""
        return dict(decompositions=lambda: self._decompositions(foreach_ops),
                    partition_fn=(recompute_partition if self.recompute
                                  else kiln_default_partition),
                    keep_inference_input_mutations=True)

    def _cuda_options(self) -> int:
        """The matrix-product and convolution CompileOptions of a CUDA
        graph: PyTorch's flags as they are now (Dynamo guards on the
        matrix-product and determinism flags, so a change recompiles) and
        this backend's epilogue choice."""
        matmul = torch.backends.cuda.matmul
        flags = 0
        if torch.get_float32_matmul_precision() != "highest":
            flags |= _binding.OPTION_ALLOW_TF32
        if not matmul.allow_fp16_reduced_precision_reduction:
            flags |= _binding.OPTION_STRICT_FP16_REDUCTION
        if not matmul.allow_bf16_reduced_precision_reduction:
            flags |= _binding.OPTION_STRICT_BF16_REDUCTION
        if not self.fuse_gemm_epilogues:
            flags |= _binding.OPTION_UNFUSED_GEMM_EPILOGUES
        cudnn = torch.backends.cudnn
        if cudnn.allow_tf32:
            flags |= _binding.OPTION_ALLOW_TF32_CONVOLUTION
        if cudnn.deterministic or torch.are_deterministic_algorithms_enabled():
            flags |= _binding.OPTION_DETERMINISTIC_CONVOLUTIONS
        if torch.are_deterministic_algorithms_enabled():
            flags |= _binding.OPTION_DETERMINISTIC_ALGORITHMS
        if cudnn.benchmark:
            flags |= _binding.OPTION_CUDNN_BENCHMARK
        return flags

    # -- Dynamo entry ------------------------------------------------------
    def __call__(self, gm: torch.fx.GraphModule,
                 example_inputs: Sequence[Any]) -> Callable[..., Any]:
        # Attention as products and a softmax, or as Kiln's fused op
        # (kiln/attention.py), before AOTAutograd derives the backward.
        ops = self.ops()
        rewrite_attention(
            gm, self.attention, fused="kiln.attention.default" in ops,
            dropout="kiln.attention_dropout.default" in ops and
            not self.eager_random(),
            bias_grad="kiln.attention_backward_dbias.default" in ops)
        devices = {x.device.type for x in example_inputs
                   if isinstance(x, torch.Tensor)}
        foreach_ops = bool(devices) and devices <= self.foreach_devices
        aot = self._aot_foreach if foreach_ops else self._aot
        graphs = self.cudagraphs and devices == {"cuda"}
        capture = None
        if self._aot_store is not None and not graphs:
            compiled, capture = self._cached_aot(gm, example_inputs,
                                                 foreach_ops)
            if compiled is not None:
                return compiled
            if capture is not None:
                aot = self._capturing_aot(capture, foreach_ops)
        if graphs:
            graphs = cudagraph_aot(
                self._compile_graph,
                functools.partial(self._compile_graph, owned_outputs=True),
                len(example_inputs), **self._aot_options(foreach_ops))
            if graphs is None:
                self._warn_once("kiln: cudagraphs: this torch has no CUDA "
                                "graph trees; running without")
            else:
                aot = graphs
        with quiet_aot_logs():  # (kiln/aot_logs.py)
            try:
                compiled = aot(gm, example_inputs)
                # Kiln's own runtime for the graphs once they are captured,
                # as a later process's hit runs them (kiln/aot_cache.py).
                return (capture.dispatch(compiled) if capture is not None
                        else compiled)
            except Exception as e:  # noqa: BLE001
                if self.fallback == "error" or _dynamo_control(e):
                    raise
                return self._eager_graph(gm, e)

    def _cached_aot(self, gm: torch.fx.GraphModule,
                    example_inputs: Sequence[Any], foreach_ops: bool
                    ) -> Tuple[Optional[Callable[..., Any]], Any]:
        """AOTAutograd's cached result for Dynamo's graph gm
        (kiln/aot_cache.py): (the compiled function, None) on a hit; on a
        miss (None, the Capture that stores its graphs once compiled:
        _capturing_aot); (None, None) for a graph the cache does not
        hold."""
        store = self._aot_store
        assert store is not None
        salt = repr((sorted(self.ops()), self.attention, self.recompute,
                     foreach_ops, self.eager_random()))
        try:
            if _aot_graphs_logged():
                raise NotCacheable("torch's logs ask for AOTAutograd's graphs")
            key = graph_key(gm, example_inputs, salt)
        except Exception as e:  # noqa: BLE001 (the cache never fails a compile)
            if not isinstance(e, NotCacheable):
                e = NotCacheable(f"{type(e).__name__}: {e}".splitlines()[0])
            self._aot_log(f"not cached: {e}")
            self._aot_counts["uncacheable"] += 1
            return None, None
        entry = store.get(key)
        if entry is not None:
            try:
                fw = self._compile_graph(load_graph(entry.fw), [])
                bw = (self._compile_graph(load_graph(entry.bw), [])
                      if entry.bw is not None else None)
                compiled = make_runtime(entry, fw, bw)
            except Exception as e:  # noqa: BLE001 (trace again instead)
                if self.fallback == "error" and isinstance(e, _binding.KilnError):
                    raise
                self._aot_log(f"entry {key[:16]} dropped: "
                              f"{type(e).__name__}: {e}")
                store.drop(key)
            else:
                self._aot_counts["hits"] += 1
                self._aot_log(f"hit {key[:16]}")
                return compiled, None
        self._aot_counts["misses"] += 1

        def report(outcome: str, detail: str) -> None:
            self._aot_counts[outcome] += 1
            self._aot_log(f"{outcome} {key[:16]} {detail}".rstrip())

        return None, Capture(store, key, len(example_inputs), report)

    def _capturing_aot(self, capture: Capture, foreach_ops: bool) -> Any:
        """The aot_autograd function whose compilers hand their graphs to
        `capture`."""
        from torch._dynamo.backends.common import aot_autograd  # noqa: PLC0415
        options = self._aot_options(foreach_ops)
        options["partition_fn"] = capture.partition_fn(options["partition_fn"])
        return aot_autograd(
            fw_compiler=capture.compiler(self._compile_graph),
            bw_compiler=capture.compiler(self._compile_graph), **options)

    def aot_cache_counters(self) -> Dict[str, int]:
        """How this backend's graphs used the AOTAutograd cache
        (kiln/aot_cache.py): {"hits", "misses", "stored", "store_failed",
        "uncacheable"}."""
        return {k: self._aot_counts[k] for k in
                ("hits", "misses", "stored", "store_failed", "uncacheable")}

    def _aot_log(self, message: str) -> None:
        if _log_enabled("aot"):
            print(f"kiln: aot cache: {message}", file=sys.stderr)

    def _eager_graph(self, gm: torch.fx.GraphModule, e: Exception
                     ) -> Callable[..., Any]:
        """Dynamo's graph run eagerly, with a warning, where AOTAutograd or
        one of Kiln's passes over its graphs raised: nothing a user writes
        may fail because of Kiln (fallback="eager"). The report counts its
        nodes as fallbacks for that reason."""
        reason = f"the backend raised {type(e).__name__}: {e}".splitlines()[0]
        report = ExplainReport(graphs=1)
        for node in gm.graph.nodes:
            if node.op == "call_function":
                report.op(_op_name(node)).fallback[reason[:200]] += 1
        with self._lock:
            self.report.merge(report)
        if _log_enabled():
            print(f"kiln: fallback: a graph of {len(gm.graph.nodes)} nodes "
                  f"runs eagerly: {reason}", file=sys.stderr)
        self._warn_once(f"kiln: a graph runs eagerly: {reason}")
        return gm.forward

    def counters(self) -> Dict[str, int]:
        """How this process's client for the backend's server has served
        requests so far (shared by every backend of that server):
        {"local_hits", "lookup_hits", "compiles"} (kiln_client_counters)."""
        if self._address is None:
            self._address = resolve_server(self.server)
        return _client(self._address, 1, self._auth).counters()

    def ops(self) -> frozenset:
        if self._ops is None:
            self._ops = _binding.supported_ops()
        return self._ops

    def eager_random(self) -> bool:
        """Whether random ops run eagerly, drawing PyTorch's own numbers
        (kiln.backend's `eager_random`): the backend's setting, else
        $KILN_EAGER_RANDOM ("1" or "0"), else False. Inductor's
        torch._inductor.config.fallback_random is not followed: with it
        set, AOTAutograd gave transformers' Phimoe a backward graph that
        draws its random ops again (bench/README.md, session 41)."""
        if self._eager_random is not None:
            return bool(self._eager_random)
        return os.environ.get("KILN_EAGER_RANDOM") == "1"

    def _eager_ops(self) -> Dict[str, str]:
        """Op name -> why, for ops of Kiln's set this compile runs
        eagerly."""
        if not self.eager_random():
            return {}
        why = ("a random op, run eagerly for PyTorch's own numbers "
               "(eager_random)")
        return {name: why for name in RANDOM_OPS}

    def _decompositions(self, foreach_ops: bool
                        ) -> Dict[Any, Callable[..., Any]]:
        """Core ATen decompositions minus the ops Kiln lowers itself and
        those that must not be decomposed in training graphs, plus a few
        that Core ATen leaves whole (kiln/decompositions.py), plus (with
        foreach_ops) the foreach ops of a compiled optimizer step as
        per-tensor ops (kiln/foreach.py)."""
        table = _core_aten_table()
        ops = self.ops()
        out = {op: table[op] for op in list(table.keys())
               if str(op) not in ops and str(op) not in _KEEP}
        out.update(extra_decompositions(ops))
        if foreach_ops:
            out.update(foreach_decompositions(ops, frozenset(map(str, out))))
        return out

    # -- one AOTAutograd graph ---------------------------------------------
    def _compile_graph(self, gm: torch.fx.GraphModule,
                       example_inputs: Sequence[Any],
                       owned_outputs: bool = False) -> Callable[..., Any]:
        """Partitions gm, compiles each partition, returns the module.
        A partition kilnd refuses because of one node (its error names
        "node N (op)") is partitioned again without that node, up to
        _NODE_RETRIES times per graph (fallback="eager"): with partitions
        as large as whole graphs, one node Kiln cannot compile must not send
        the whole graph back to eager. owned_outputs: the graph will be
        captured by CUDA graph trees (kiln/cudagraphs.py), whose outputs
        must be memory PyTorch's allocator owns (KilnPartition._run_owned)."""
        self._tls.owned_outputs = owned_outputs
        try:
            return self._compile_prepared(gm)
        finally:
            self._tls.owned_outputs = False

    def _compile_prepared(self, gm: torch.fx.GraphModule) -> Callable[..., Any]:
        """_compile_graph's work: gm's graph passes, then its partitions."""
        from torch._functorch.aot_autograd import make_boxed_func  # noqa: PLC0415

        give_constants_values(gm)
        lower_complex(gm)  # complex values as real pairs (kiln/complex.py)
        align_norm_stats_with_eager(gm)
        share_float64_scalar_converts(gm)
        arange_from_symbolic_starts(gm)
        batch_input_writes(gm)
        window = symbolic_window_op(gm)
        if window is not None:
            with self._lock:
                self.report.merge(ExplainReport(graphs=1))
            return SpecializedGraph(self, gm, window)
        return make_boxed_func(self._compile_static(gm))

    def _compile_static(self, gm: torch.fx.GraphModule,
                        specialization: bool = False) -> torch.fx.GraphModule:
        """_compile_graph's partitioning and compiles (gm prepared); a
        specialization (SpecializedGraph) counts as one, not as a graph."""
        pristine = None
        excluded: Dict[str, str] = {}
        for attempt in range(_NODE_RETRIES + 1):
            if attempt == 0:
                work = gm
                if self.fallback == "eager":
                    pristine = _copy_graph_module(gm)
            else:
                work = _copy_graph_module(pristine)
            module, report, refused = self._compile_partitions(work, excluded)
            if not refused or pristine is None or attempt == _NODE_RETRIES:
                break
            excluded.update(_alike(pristine, refused))
        if refused:
            self._warn_once("kiln: a partition failed to compile, running it "
                            "eagerly: " + "; ".join(refused.values()))
        if specialization:
            report.graphs, report.specializations = 0, 1
        with self._lock:
            self.report.merge(report)
        if _log_enabled():
            print(report, file=sys.stderr)
        return module

    def _compile_partitions(
            self, gm: torch.fx.GraphModule, excluded: Dict[str, str]
    ) -> Tuple[torch.fx.GraphModule, ExplainReport, Dict[str, str]]:
        """One partitioning of gm (nodes named in `excluded` kept out with
        their reason) and its compiles: (module, report, {node name: why}
        for partitions kilnd refused because of one node)."""
        report = ExplainReport(graphs=1)
        support = KilnOperatorSupport(self.ops(), excluded, graph_device(gm),
                                      self._eager_ops())
        try:
            result = partition(gm, support)
        except Exception as e:  # noqa: BLE001 (never fail the user's graph)
            if self.fallback == "error":
                raise
            self._warn_once(f"kiln: partitioning failed, running the graph "
                            f"eagerly: {e!r}")
            for node in gm.graph.nodes:
                if node.op == "call_function" and _computes_tensors(node):
                    report.op(_op_name(node)).fallback[
                        f"partitioning failed: {e!r}"] += 1
            return gm, report, {}
        for node, reason in support.reasons.items():
            # (Not SymInt arithmetic, not the graph's input writes, not the
            # views between complex values and their pairs.)
            if _computes_tensors(node) and "kiln_input_writes" not in \
                    node.meta and COMPLEX_BOUNDARY not in node.meta:
                report.op(_op_name(node)).fallback[reason] += 1
        for name, reasons in result.left_out.items():
            report.op(name).fallback.update(reasons)
        module = result.module
        refused: Dict[str, str] = {}
        for name, ops in result.partitions.items():
            report.partitions += 1
            sub = getattr(module, name)
            why = self._compile_partition(module, name, sub, refused)
            if why is None:
                report.compiled_partitions += 1
                report.dynamic_partitions += int(getattr(module, name).graph.dynamic)
                for op in ops:
                    report.op(op).kiln += 1
            else:
                for op in ops:
                    report.op(op).fallback[why] += 1
        module.recompile()
        return module, report, refused

    def _compile_partition(self, module: torch.fx.GraphModule, name: str,
                           sub: torch.fx.GraphModule,
                           refused: Optional[Dict[str, str]] = None
                           ) -> Optional[str]:
        """Replaces submodule `name` by a KilnPartition; returns None, or
        why it stays eager. When kilnd refuses the graph because of one
        node, that node's FX name and the reason go into `refused`."""
        try:
            graph = to_kiln_graph(sub)
        except Unsupported as e:
            return f"partition not expressible: {e}"
        except Exception as e:  # noqa: BLE001 (a translator bug: stay eager)
            if self.fallback == "error":
                raise
            self._warn_once(f"kiln: could not translate {name}, running it "
                            f"eagerly: {e!r}")
            return f"translation failed: {e!r}"
        # Outputs that are new values of inputs the graph mutates (an
        # optimizer's parameters): kilnd may store them into the inputs.
        call = next((n for n in module.graph.nodes
                     if n.op == "call_module" and n.target == name), None)
        if call is not None:
            graph.request_input_writes(
                input_write_candidates(module, call, graph))
        if self._server_down is not None:
            if time.monotonic() < self._server_down_until:
                return self._server_down
            self._server_down, self._address = None, None  # try again
        if self._address is None:
            self._address = resolve_server(self.server)
        def compile_graph() -> Any:
            client = _client(self._address, 1, self._auth)
            if graph.device.type == "cuda":
                index = graph.device.index or 0
                major, minor = torch.cuda.get_device_capability(index)
                return client.cuda_executable(
                    graph.graph, target=f"sm_{major}{minor}",
                    fast_math=self.fast_math, allocator="torch", device=index,
                    options=self._cuda_options())
            return client.cpu_executable(graph.graph, fast_math=self.fast_math)

        try:
            try:
                exe = compile_graph()
            except _binding.KilnError as e:
                # Input writes kilnd does not take (a kilnd that checks
                # them otherwise): the graph without them.
                if e.code_name != "INVALID_ARGUMENT" or \
                        "input write" not in e.message or \
                        "inputWrites" not in graph.graph:
                    raise
                del graph.graph["inputWrites"]
                exe = compile_graph()
        except _binding.KilnError as e:
            if self.fallback == "error":
                raise
            if e.code_name == "UNAVAILABLE":
                _drop_client(self._address, 1, self._auth)
                self._server_down = f"kilnd unreachable ({e.message})"
                self._server_down_until = time.monotonic() + _RETRY_SECONDS
                self._warn_once(f"kiln: kilnd unreachable, running eagerly: {e}")
                return self._server_down
            if e.code_name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
                # kilnd refused the token, or this client the artifact's
                # signature (trusted_keys).
                self._warn_once(f"kiln: refused (check the token and the "
                                f"trusted keys), running eagerly: {e}")
                return f"refused: {e}"
            node = _refused_node(e, graph)
            if node is not None and refused is not None and \
                    e.code_name in ("INVALID_ARGUMENT", "UNIMPLEMENTED"):
                # Partitioned again without it (_compile_graph): no warning.
                refused[node] = f"kilnd refused it: {e.message}"
                return f"compile failed: {e}"
            self._warn_once(f"kiln: a partition failed to compile, running it "
                            f"eagerly: {e}")
            return f"compile failed: {e}"
        graph.take_input_writes(exe.input_writes)
        if exe.num_outputs != len(graph.output_meta):
            return "Kiln's outputs differ from PyTorch's"
        if any(d != str(m.dtype).replace("torch.", "")
               for d, m in zip(exe.output_dtypes, graph.output_meta)):
            # Partitioned again without the nodes (_compile_graph): one op
            # whose dtype rule differs from PyTorch's must not send a whole
            # graph to eager.
            if refused is not None:
                refused.update(_wrong_dtypes(graph, exe.output_dtypes))
            return "Kiln's output dtypes differ from PyTorch's"
        out_node = next(n for n in sub.graph.nodes if n.op == "output")
        try:
            wrapper = KilnPartition(name, sub, graph, exe, self,
                                    tuple_output=isinstance(out_node.args[0],
                                                            (list, tuple)))
        except Unsupported as e:
            return f"partition not expressible: {e}"
        setattr(module, name, wrapper)
        return None

    def _warn_once(self, message: str) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# How many times a graph is partitioned again without a node kilnd refused.
_NODE_RETRIES = 8


_NOT_RUN = object()  # SpecializedGraph._run_and_note: nothing computed


class SpecializedGraph:
    """An AOTAutograd graph with a convolution or pooling over symbolic
    channel or spatial sizes (dynamic=True on a vision model: Kiln lays
    their windows out at compile time), compiled per concrete size: on the
    first call with a size, the graph runs on fake copies of the arguments
    (torch.fx.Interpreter), every node's value noted as a fake tensor of
    its concrete sizes and strides; that static copy, its integer inputs
    made constants, is partitioned and compiled as any static graph (kilnd
    keeps it for every process) and serves that call and each later one
    with that size. The size is the values of the graph's integer inputs
    (AOTAutograd passes the symbols as such) and the sizes of its tensor
    inputs whose sizes are symbolic.
    One Dynamo graph, no recompile: dynamic=True's promise stays. Called
    boxed (AOTAutograd's convention for compiled graphs)."""

    def __init__(self, backend: "KilnBackend", gm: torch.fx.GraphModule,
                 why: str) -> None:
        # An instance attribute: torch._dynamo.disable's wrapper copies the
        # callable's __dict__ (functools.wraps), and AOTAutograd reads it.
        self._boxed_call = True
        self.backend = backend
        self.gm = gm
        self.why = why
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        vals = [n.meta.get("val") for n in placeholders]
        self._ints = [i for i, v in enumerate(vals)
                      if isinstance(v, (int, torch.SymInt))]
        self._shapes = [i for i, v in enumerate(vals)
                        if isinstance(v, torch.Tensor) and
                        any(isinstance(d, torch.SymInt) for d in v.shape)]
        self._compiled: Dict[Tuple[Any, ...], Callable[..., Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, args: List[Any]) -> Any:
        call_args = list(args)
        args.clear()
        key = tuple(call_args[i] for i in self._ints) + tuple(
            tuple(call_args[i].shape) for i in self._shapes)
        fn = self._compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self._compiled.get(key)
                if fn is None:
                    result, static = self._run_and_note(call_args)
                    fn = self._compiled[key] = self._compile(static)
                    if result is not _NOT_RUN:
                        return result
        return fn(*call_args)

    def _run_and_note(self, args: List[Any]) -> Tuple[Any, torch.fx.GraphModule]:
        """A copy of gm whose nodes' meta["val"] are fake tensors of the
        concrete sizes `args` give them, its integer inputs and size
        arithmetic replaced by their values; and _NOT_RUN. The sizes come
        from running gm on fake copies of args; where that fails (an op
        whose result's size depends on data), from running it on args
        themselves, whose result is returned then."""
        from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

        metas: Dict[str, Any] = {}
        mode = FakeTensorMode(allow_non_fake_inputs=True)

        def fake(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return mode.from_tensor(v, static_shapes=True)
            if isinstance(v, (list, tuple)):
                return type(v)(fake(x) for x in v)
            return v

        class Noting(torch.fx.Interpreter):
            def run_node(self, n: torch.fx.Node) -> Any:
                value = super().run_node(n)
                metas[n.name] = fake(value)
                return value

        result: Any = _NOT_RUN
        try:
            with mode:
                Noting(self.gm).run(*[fake(a) for a in args])
        except Exception:  # noqa: BLE001 (data-dependent sizes: run it)
            metas.clear()
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            result = Noting(self.gm).run(*args)
        static = _copy_graph_module(self.gm)
        placeholders = [n for n in static.graph.nodes if n.op == "placeholder"]
        for node in static.graph.nodes:
            if node.name in metas:
                node.meta = dict(node.meta, val=metas[node.name])
        # Sizes are constants now: the integer inputs, and integer
        # arithmetic on them and on tensor sizes (AOTAutograd's sym_size,
        # mul, floordiv... nodes).
        const = {placeholders[i] for i in self._ints}
        for node in list(static.graph.nodes):
            if node.op != "call_function" or \
                    not isinstance(metas.get(node.name), int):
                continue
            if str(node.target).startswith("aten.sym_") or (
                    _size_arithmetic(node) and
                    all(a in const for a in node.all_input_nodes)):
                const.add(node)
        for node in const:  # every node ran: metas holds its value
            for user in list(node.users):
                user.replace_input_with(node, int(metas[node.name]))
        for node in reversed(list(static.graph.nodes)):
            if node in const and node.op == "call_function" and not node.users:
                static.graph.erase_node(node)
        static.recompile()
        return result, static

    def _compile(self, static: torch.fx.GraphModule) -> Callable[..., Any]:
        try:
            return self.backend._compile_static(static, specialization=True)
        except Exception as e:  # noqa: BLE001 (never fail the user's graph)
            if self.backend.fallback == "error":
                raise
            self.backend._warn_once(
                f"kiln: a graph specialised for its sizes ({self.why}) "
                f"failed to compile, running it eagerly: {e!r}")
            return self.gm


def _dynamo_control(e: Exception) -> bool:
    """Whether e is one of Dynamo's own exceptions (a graph break, a
    recompile, a skipped frame), which must reach Dynamo as raised."""
    return type(e).__module__.startswith("torch._dynamo")


def _size_arithmetic(node: torch.fx.Node) -> bool:
    """Whether node is integer arithmetic: Python's operators, torch.sym_*
    functions."""
    target = node.target
    module = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", "") or str(target)
    return module in ("_operator", "operator") or name.startswith("sym_")


def _signature(node: torch.fx.Node) -> Optional[Tuple[Any, ...]]:
    """What kilnd sees of a node: its op, its arguments, and the dtype and
    sizes of each tensor among them (None for a node without a target)."""
    if node.op != "call_function":
        return None

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor):
                return ("tensor", str(val.dtype),
                        tuple(str(s) for s in val.shape))
            return ("node", a.name)
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        return repr(a)

    return (str(node.target), arg(node.args),
            tuple(sorted((k, arg(v)) for k, v in node.kwargs.items())))


def _alike(gm: torch.fx.GraphModule, refused: Dict[str, str]) -> Dict[str, str]:
    """`refused` and every other node of gm with the same signature as a
    refused one (the same op on tensors of the same dtypes and sizes: kilnd
    would refuse it for the same reason), so that a graph with many copies
    of one refused node (an upsampling's scatters in each decoder stage) is
    partitioned again once, not once per copy."""
    by_name = {n.name: n for n in gm.graph.nodes}
    wanted: Dict[Tuple[Any, ...], str] = {}
    for name, why in refused.items():
        sig = _signature(by_name[name]) if name in by_name else None
        if sig is not None:
            wanted[sig] = why
    out = dict(refused)
    for n in gm.graph.nodes:
        sig = _signature(n)
        if sig is not None and sig in wanted and n.name not in out:
            out[n.name] = wanted[sig]
    return out


_NODE_IN_ERROR = re.compile(r"\bnode (\d+) \(")


def _refused_node(e: "_binding.KilnError", graph: KilnGraph) -> Optional[str]:
    """The FX node name behind the Kiln node an error names ("node N
    (aten...)"), or None."""
    m = _NODE_IN_ERROR.search(e.message)
    if m is None:
        return None
    k = int(m.group(1))
    origin = graph.node_origin
    return origin[k] if 0 <= k < len(origin) else None


def _wrong_dtypes(graph: KilnGraph, dtypes: Sequence[str]) -> Dict[str, str]:
    """{FX node name: why} for the nodes behind the Kiln outputs whose
    dtype differs from PyTorch's (meta['val'])."""
    producer = {out: k for k, n in enumerate(graph.graph["nodes"])
                for out in n["outputs"]}
    wrong: Dict[str, str] = {}
    for value, got, meta in zip(graph.graph["outputs"], dtypes,
                                graph.output_meta):
        want = str(meta.dtype).replace("torch.", "")
        k = producer.get(value)
        if got == want or k is None or k >= len(graph.node_origin):
            continue
        node = graph.node_origin[k]
        if node is not None:
            wrong[node] = (f"Kiln gives {got} where PyTorch gives {want} "
                           f"({graph.graph['nodes'][k]['op']})")
    return wrong


def _copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule over a copy of gm's graph (same node names, shared
    meta values and attributes): partition() rewrites its argument."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _computes_tensors(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in val)
    return isinstance(val, torch.Tensor) or val is None


def _op_name(node: torch.fx.Node) -> str:
    from .fx_graph import op_name  # noqa: PLC0415

    return op_name(node.target)


_DEFAULT: Optional[KilnBackend] = None
# backend="kiln" with options=: one backend per distinct set of options, so
# that every graph of a model (and of every model compiled with the same
# options) shares its client, counters and report.
_BY_OPTIONS: Dict[Tuple[Tuple[str, Any], ...], KilnBackend] = {}
_BY_OPTIONS_LOCK = threading.Lock()
# torch.compile's modes are Inductor's; what each means for Kiln.
_MODES = {
    "default": None,
    "reduce-overhead": None,  # kiln.backend(cudagraphs=True)
    "max-autotune": "Kiln times GEMM algorithms on the first call anyway "
                    "(mode ignored)",
    "max-autotune-no-cudagraphs": "Kiln times GEMM algorithms on the first "
                                  "call anyway (mode ignored)",
}


def default_backend() -> KilnBackend:
    """The backend ``backend="kiln"`` names: KILN_SERVER, accurate math,
    eager fallback; one per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = KilnBackend()
    return _DEFAULT


def option_names() -> Tuple[str, ...]:
    """The keys ``torch.compile(backend="kiln", options={...})`` takes:
    kiln.backend's keyword arguments."""
    import inspect  # noqa: PLC0415

    from . import backend  # noqa: PLC0415

    return tuple(inspect.signature(backend).parameters)


def named_backend(options: Optional[Dict[str, Any]] = None,
                  mode: Optional[str] = None) -> KilnBackend:
    """The backend for ``torch.compile(model, backend="kiln", mode=...,
    options={...})``: default_backend() without options, else the
    backend kiln.backend(**options) builds, one per distinct options in the
    process. Raises ValueError naming an unknown option key (with the known
    ones) or an unknown mode; torch.compile reports it as a backend error
    before anything runs. mode="reduce-overhead" is options' cudagraphs
    (True unless options say otherwise); Inductor's other modes are
    accepted with one warning saying what Kiln does instead."""
    if mode is not None and mode not in _MODES:
        raise ValueError(f"kiln: unknown mode {mode!r} (torch.compile's "
                         f"modes: {', '.join(_MODES)})")
    if mode is not None and _MODES[mode] is not None:
        warnings.warn(f"kiln: mode={mode!r}: {_MODES[mode]}", RuntimeWarning,
                      stacklevel=3)
    if mode == "reduce-overhead":
        options = {"cudagraphs": True, **(options or {})}
    if not options:
        return default_backend()
    known = option_names()
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise ValueError(f"kiln: unknown option(s) {', '.join(unknown)} "
                         f"(kiln.backend takes: {', '.join(known)})")
    key = tuple(sorted((k, _hashable(v)) for k, v in options.items()))
    with _BY_OPTIONS_LOCK:
        if key not in _BY_OPTIONS:
            from . import backend  # noqa: PLC0415

            _BY_OPTIONS[key] = backend(**options)
        return _BY_OPTIONS[key]


def _hashable(value: Any) -> Any:
    """An option's value as a dict key (trusted_keys may be a list)."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value


def explain(model: Callable[..., Any], *inputs: Any,
            **kwargs: Any) -> ExplainReport:
    """Compiles a copy of `model` with a fresh Kiln backend, runs it on
    `inputs` (and backward through the sum of its floating outputs when they
    require grad) and returns the backend's report."""
    backend = KilnBackend(**kwargs)
    if isinstance(model, torch.nn.Module):
        model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    out = compiled(*inputs)
    flat = out if isinstance(out, (list, tuple)) else [out]
    loss = [o.sum() for o in flat
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if loss:
        torch.stack(loss).sum().backward()
    return backend.report
