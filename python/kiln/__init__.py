"""Kiln from Python: ``torch.compile(model, backend="kiln")`` and the binding
over libkiln_c.so (client/kiln_c.h).

The three lines a user writes::

    import torch
    model = torch.compile(model, backend="kiln")      # by name, once installed
    model = torch.compile(model, backend=kiln.backend(fallback="error"))

The Dynamo backend (kiln/dynamo.py) takes the graph through AOTAutograd with
Core ATen decompositions (forward and backward), partitions it by what Kiln
compiles (kiln/partition.py), sends each supported partition to kilnd once
(kiln/fx_graph.py turns it into a kiln.v1.Graph) and runs it on the CPU or
CUDA runtime without copies; everything else runs eagerly. ``KILN_LOG=fallback``
logs per op why it did not run in Kiln; ``kiln.explain(model, *inputs)``
returns that report.

This package imports without PyTorch and without a GPU: torch is imported
when a backend is created or a tensor is run. The binding's names
(Client, CpuExecutable, CudaExecutable, CudaOutput, KilnError,
load_library, supported_ops) are documented in kiln/_binding.py.

Environment: KILN_SERVER (kilnd's address, "HOST:PORT" or "unix:PATH", or
a fleet's replicas comma-separated;
default 127.0.0.1:7733 when it answers, else a per-user kilnd started on a
Unix socket, kiln/autostart.py), KILN_AUTOSTART=0 (never start one),
KILN_LIB (libkiln_c.so), KILN_KILND (the kilnd to start),
KILN_IDLE_EXIT_SECONDS (the started kilnd exits after that long without an
RPC; default 1800, 0: never), KILN_LOG=fallback, KILN_TRUSTED_KEYS (kilnd
public keys, 64 hex digits each, comma-separated: `kilnctl public-key`;
artifacts not signed by one of them are refused, KilnError with
PERMISSION_DENIED, before any code is loaded).

CPU and CUDA tensors both run in Kiln (a partition's tensors on one
device). Not yet (issue 15): `make wheel`, output strides and aliases in
the wire format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from ._binding import (C_API_VERSION, Client, CpuExecutable, CudaExecutable,
                       CudaOutput, KilnError, KilnIndexError, load_library,
                       supported_ops)

if TYPE_CHECKING:  # pragma: no cover
    from .dynamo import ExplainReport

__all__ = [
    "C_API_VERSION", "Client", "CpuExecutable", "CudaExecutable", "CudaOutput",
    "KilnError", "KilnIndexError", "backend", "explain", "load_library", "supported_ops",
]


def backend(server: Optional[str] = None, fast_math: bool = False,
            fallback: str = "eager", attention: Optional[str] = None, *,
            fuse_gemm_epilogues: bool = True,
            recompute: bool = False,
            foreach: Optional[bool] = None,
            cudagraphs: Optional[bool] = None,
            token: Optional[str] = None,
            token_file: Optional[str] = None, trusted_keys: Any = None,
            tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
            tls_key: Optional[str] = None,
            tls_server_name: Optional[str] = None,
            aot_cache: Optional[bool] = None,
            eager_random: Optional[bool] = None) -> Callable[..., Any]:
    """A configured Dynamo backend for ``torch.compile(backend=...)``.

    server: kilnd's address ("HOST:PORT" or "unix:PATH"; None: $KILN_SERVER,
    else 127.0.0.1:7733 when it answers, else the per-user kilnd, started if
    needed: kiln/autostart.py). fast_math: CompileOptions.fast_math.
    fallback: "eager" (default: a partition Kiln cannot compile, or an
    unreachable server, runs eagerly with one warning) or "error" (raise
    KilnError instead). Ops Kiln does not have always run eagerly.
    attention: how scaled_dot_product_attention runs (kiln/attention.py):
    "auto" (None: $KILN_ATTENTION, else "auto": as GEMMs and a softmax in
    Kiln, except on CUDA above 2^20 score elements, where Kiln's own fused
    op, kiln::attention, runs it as one cuDNN call per direction where it
    takes the call, else PyTorch's fused kernel eagerly), "fused" (Kiln's
    fused op wherever it takes the call), "decompose" (always as GEMMs and
    a softmax in Kiln) or "eager" (never in Kiln).
    fuse_gemm_epilogues: on CUDA, a product's bias and ReLU / tanh-GELU are
    applied by cuBLASLt as it writes the product, rounded once, as
    PyTorch's own addmm does (default); False adds them in Kiln's kernels
    after the product is rounded. The same switch covers a linear layer's
    bias gradient, which the weight gradient's cuBLASLt call writes.
    TF32 and reduced-precision reductions
    follow PyTorch's flags (torch.set_float32_matmul_precision,
    torch.backends.cuda.matmul.allow_{fp16,bf16}_reduced_precision_reduction).
    recompute: split forward from backward as Inductor does
    (AOTAutograd's min-cut rematerialization partitioner): the backward
    recomputes cheap pointwise values from the forward's inputs inside its
    own fused kernels instead of the forward saving them, which saves
    activation memory (values a backward comparison reads are still saved:
    kiln.dynamo.recompute_partition). False (default): AOTAutograd's
    default partitioner, which saves every value the backward reads; on an
    H100 it did as much GPU work or less in the batch- and group-norm steps
    of bench/python/train_ops.py (bench/README.md).
    foreach: run a compiled optimizer step's _foreach_* ops in Kiln as
    their per-tensor ops, one partition for the whole update
    (kiln/foreach.py), the parameters and states written in place
    (kiln.v1.Graph.input_writes). True: on every device; False: never;
    None (default): $KILN_FOREACH ("1" or "0") when set, else on CPU
    graphs only. On the 2-core CPU AdamW's step takes 0.29x eager's time
    and 0.90x Inductor's, Adam's 0.37x and 1.06x, SGD's 0.91x and 1.42x;
    on an H100 the per-tensor kernels lose to PyTorch's multi-tensor ones
    (AdamW 0.77x eager's time, Adam 1.86x, SGD 4.4x: bench/README.md,
    session 25; bench/python/optimizer_step.py).

    cudagraphs: on CUDA, each compiled forward and backward graph is
    captured once and replayed as a CUDA graph by PyTorch's CUDA graph
    trees (kiln/cudagraphs.py), as torch.compile's mode="reduce-overhead"
    does for Inductor (that mode sets it here too): one launch per graph
    instead of Python and a driver call per partition and eager op.
    None (default): $KILN_CUDAGRAPHS ("1" or "0") when set, else False.
    Graphs CUDA graphs cannot hold (CPU tensors, mutated inputs) and, for
    now, graphs with symbolic sizes run without, as PyTorch logs.

    A kilnd with tokens, TLS or signed artifacts (README.md, "Running kilnd
    for a team"), each keyword else its environment variable, as
    kiln.Client takes them: token ($KILN_TOKEN) or token_file
    ($KILN_TOKEN_FILE, its first line); trusted_keys (kilnd public keys, a
    list or comma-separated, 64 hex digits each; $KILN_TRUSTED_KEYS:
    artifacts not signed by one are refused before any code loads);
    tls_ca, tls_cert, tls_key, tls_server_name ($KILN_TLS_CA, ...). A
    token kilnd refuses fails the compile: eager with one warning, or
    KilnError (UNAUTHENTICATED, PERMISSION_DENIED) with fallback="error".

    aot_cache: keep AOTAutograd's forward and backward graphs on disk, so
    that a process compiling a graph again (a restart, another rank on the
    host) skips AOTAutograd's tracing (kiln/aot_cache.py: static graphs of
    plain tensors without aliased outputs). None (default): on unless
    $KILN_AOT_CACHE=0; the directory is $KILN_AOT_CACHE_DIR, else
    ~/.cache/kiln/aot. KILN_LOG=aot prints each hit, miss and why a graph
    is not cached.

    eager_random: run the random ops (dropout, rand, randn, bernoulli and
    their _like forms) eagerly, so that a seeded run draws PyTorch's own
    numbers and matches eager bit for bit there (what Inductor's
    torch._inductor.config.fallback_random is for; Kiln does not read that
    flag). By default they run in Kiln from a Philox stream seeded from
    torch's generator, as Inductor's do: reproducible under
    torch.manual_seed, but not eager's numbers. None (default): True when
    $KILN_EAGER_RANDOM is "1".
    """
    from .dynamo import KilnBackend  # noqa: PLC0415 (needs torch)

    return KilnBackend(server=server, fast_math=fast_math, fallback=fallback,
                       fuse_gemm_epilogues=fuse_gemm_epilogues,
                       recompute=recompute, foreach=foreach,
                       cudagraphs=cudagraphs, attention=attention,
                       token=token, token_file=token_file,
                       trusted_keys=trusted_keys, tls_ca=tls_ca,
                       tls_cert=tls_cert, tls_key=tls_key,
                       tls_server_name=tls_server_name, aot_cache=aot_cache,
                       eager_random=eager_random)


def explain(model: Callable[..., Any], *inputs: Any,
            **kwargs: Any) -> "ExplainReport":
    """Compiles ``model`` with the Kiln backend on ``inputs`` (forward, and
    backward when an output requires grad) and returns the report: per op,
    how many nodes ran in Kiln and how many fell back and why; the number of
    partitions. kwargs go to kiln.backend (server, fast_math, fallback,
    token, trusted_keys, ...)."""
    from .dynamo import explain as _explain  # noqa: PLC0415 (needs torch)

    return _explain(model, *inputs, **kwargs)


def _dynamo_backend(gm: Any, example_inputs: Any, *,
                    options: Optional[Dict[str, Any]] = None,
                    mode: Optional[str] = None,
                    name: Optional[str] = None) -> Callable[..., Any]:
    """The ``torch_dynamo_backends`` entry point ``kiln``: the default
    backend (KILN_SERVER, accurate math, eager fallback), or with
    ``torch.compile(..., options={...})`` the one kiln.backend(**options)
    builds (the keys are kiln.backend's keyword arguments; an unknown key is
    a ValueError naming it). ``mode`` is Inductor's: "reduce-overhead"
    turns on kiln.backend's cudagraphs; "default" and the others are
    accepted, the others with a warning (Kiln has no other modes).
    ``name`` (torch.compile's, for logs) is not used."""
    from .dynamo import named_backend  # noqa: PLC0415 (needs torch)

    del name
    return named_backend(options, mode)(gm, example_inputs)
