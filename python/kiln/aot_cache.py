"""AOTAutograd's results for a Dynamo graph, kept on disk between processes.

A process that compiles a model Kiln has compiled before (a restart, another
rank on the host) still traced the model twice: Dynamo captures its graph
(the floor every backend pays) and AOTAutograd traces the forward and the
backward again (+0.26 s for one TransformerEncoderLayer on the 2-core box,
seconds for a large model), before kilnd answers from its cache at once.
This module keeps what AOTAutograd produced for a Dynamo graph: the forward
and backward ATen graphs its partitioner handed Kiln, and the little of its
metadata the runtime needs. A later process with the same Dynamo graph,
input metadata, global state and configuration loads them, compiles them
through kilnd as usual (partitions, lookups) and runs them in an
autograd.Function of its own, without AOTAutograd. The process that
captured them switches to that runtime too once the capture is complete
(Capture.dispatch): AOTAutograd's runtime wrappers cost ~100 µs more host
time per training step.

PyTorch's own AOTAutogradCache does this for Inductor; its key imports
Inductor and hashes torch's and Triton's sources, which costs a Kiln
process more than the tracing it saves (bench/README.md, session 25).

Which graphs: the common case only, checked from AOTAutograd's metadata when
the entry is made; anything else compiles as before, every time:
- static sizes (no SymInt input, no symbolic dim);
- plain tensors in, plain tensors out, no input appearing twice;
- no output that aliases an input or an intermediate (but for a view of
  an intermediate nothing else reads, returned as a tensor of its own as
  AOTAutograd does), no effect tokens,
  no functionalized RNG, no tensor subclass;
- inputs written only inside the graph (BatchNorm's running statistics:
  MutationType.MUTATED_IN_GRAPH), never by AOTAutograd's runtime;
- every call_function of the Dynamo graph a torch, operator or kiln
  callable (a function of the user's program would be keyed by name only),
  no call_module, get_attr only of tensors (keyed by their bytes).

The key hashes the Dynamo graph's code, each input's size, stride, storage
offset, dtype, device, requires_grad and which inputs share storage, the
constants' bytes, grad mode, autocast, the default dtype, determinism,
torch's version, functorch's configuration, Kiln's Python sources, the ops
the client library lowers and the backend's options that change the graphs
(the caller's salt). An entry holds plain Python values only (no pickled
classes: it is read with an unpickler that refuses every global).

Where: $KILN_AOT_CACHE_DIR, else $XDG_CACHE_HOME/kiln/aot, else
~/.cache/kiln/aot (mode 0700); KILN_AOT_CACHE=0 turns it off. Writes are
atomic (a temporary file renamed); the directory is kept under
$KILN_AOT_CACHE_MAX_MB (default 512) by removing the oldest entries.

Thread-safety: Store is safe to share; an entry's runtime (make_runtime)
is as thread-safe as the compiled graphs it calls.
"""

from __future__ import annotations

import functools
import hashlib
import io
import operator
import os
import pickle
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx
from torch._subclasses.fake_tensor import (FakeTensor, FakeTensorMode,
                                           unset_fake_temporarily)

__all__ = ["Capture", "Entry", "NotCacheable", "Store", "default_store",
           "entry_from", "graph_key", "load_graph", "make_runtime",
           "save_graph", "summarize_metadata"]

FORMAT = 1


class NotCacheable(Exception):
    """A graph, value or metadata this cache does not hold (the message says
    what); the graph compiles as before."""


# -- the key -------------------------------------------------------------

_SAFE_MODULES = ("torch", "_operator", "operator", "math", "builtins", "kiln")


def _safe_target(target: Any) -> bool:
    """A call_function target whose behaviour the key covers: torch's own
    (its version is keyed), Python's operators and math, Kiln's (its sources
    are keyed). A function of the user's program is not: it would be keyed
    by its name, not its body."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    module = getattr(target, "__module__", None) or ""
    return module.split(".")[0] in _SAFE_MODULES


def _tensor_meta(t: torch.Tensor) -> Tuple[Any, ...]:
    for n in (*t.shape, *t.stride(), t.storage_offset()):
        if not isinstance(n, int):
            raise NotCacheable("a symbolic size (dynamic shapes)")
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and \
            type(t).__name__ not in ("FakeTensor", "FunctionalTensor"):
        raise NotCacheable(f"a tensor subclass ({type(t).__name__})")
    return (tuple(t.shape), tuple(t.stride()), t.storage_offset(),
            str(t.dtype), str(t.device), bool(t.requires_grad),
            str(t.layout))


@functools.lru_cache(maxsize=1)
def _static_salt() -> str:
    """What does not change within a process: torch's version and Kiln's
    Python sources."""
    h = hashlib.sha256()
    h.update(f"format {FORMAT}\n".encode())
    h.update(f"torch {torch.__version__} {torch.version.git_version}\n"
             .encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


def _global_state() -> str:
    """The state AOTAutograd traces under that Dynamo does not put in its
    graph."""
    amp = []
    for device in ("cpu", "cuda"):
        try:
            on = torch.is_autocast_enabled(device)
            dtype = torch.get_autocast_dtype(device)
        except (TypeError, AttributeError, RuntimeError):
            on, dtype = None, None
        amp.append((device, on, str(dtype)))
    config = torch._functorch.config
    getter = getattr(config, "get_config_copy", None)
    items = sorted(getter().items()) if getter else []
    return repr((torch.is_grad_enabled(), amp, str(torch.get_default_dtype()),
                 torch.are_deterministic_algorithms_enabled(),
                 torch._C._is_any_autocast_enabled(),
                 [(k, repr(v)) for k, v in items]))


def graph_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
              salt: str) -> str:
    """The key of Dynamo's graph gm with these example inputs under the
    current global state; salt: the backend's options that change the
    graphs AOTAutograd makes. Raises NotCacheable (why) for a graph this
    cache does not hold."""
    from torch.multiprocessing.reductions import StorageWeakRef  # noqa: PLC0415

    h = hashlib.sha256()
    h.update(_static_salt().encode())
    h.update(salt.encode())
    h.update(_global_state().encode())
    h.update(gm.code.encode())
    for node in gm.graph.nodes:
        if node.op == "call_function" and not _safe_target(node.target):
            raise NotCacheable(f"node {node.name} calls "
                               f"{getattr(node.target, '__module__', '?')}."
                               f"{getattr(node.target, '__name__', '?')}")
        if node.op == "call_module":
            raise NotCacheable(f"node {node.name} calls a module")
        if node.op == "get_attr":
            value = _attr(gm, str(node.target))
            if not isinstance(value, torch.Tensor):
                raise NotCacheable(f"node {node.name} reads a "
                                   f"{type(value).__name__}")
            h.update(repr(_tensor_meta(value)).encode())
            h.update(_tensor_bytes(value))
    storages: Dict[Any, int] = {}
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise NotCacheable(f"input {i} is a {type(x).__name__}")
        meta = _tensor_meta(x)
        ref = StorageWeakRef(x.untyped_storage())
        h.update(repr((meta, storages.setdefault(ref, i))).encode())
    return h.hexdigest()


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """A real tensor's elements (a constant of the graph), read outside the
    fake mode the backend may be called under. NotCacheable for a fake
    tensor (no elements to key or keep)."""
    if isinstance(t, FakeTensor):
        raise NotCacheable("a constant without values (a fake tensor)")
    with unset_fake_temporarily():
        c = t.detach().cpu().contiguous()
        return c.view(-1).view(torch.uint8).numpy().tobytes() \
            if c.numel() else b""


def _attr(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


# -- graphs as plain values ---------------------------------------------

_PY_TARGETS = {("operator", "getitem"): operator.getitem}


def _encode(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.fx.Node):
        return ("n", v.name)
    if isinstance(v, (list, tuple)):
        return ("l" if isinstance(v, list) else "t",
                [_encode(x) for x in v])
    if isinstance(v, torch.dtype):
        return ("dtype", str(v).split(".")[-1])
    if isinstance(v, torch.device):
        return ("device", str(v))
    if isinstance(v, torch.layout):
        return ("layout", str(v).split(".")[-1])
    if isinstance(v, torch.memory_format):
        return ("mf", str(v).split(".")[-1])
    raise NotCacheable(f"an argument of type {type(v).__name__}")


def _decode(v: Any, nodes: Dict[str, torch.fx.Node]) -> Any:
    if not isinstance(v, tuple):
        return v
    tag, x = v
    if tag == "n":
        return nodes[x]
    if tag == "l":
        return [_decode(e, nodes) for e in x]
    if tag == "t":
        return tuple(_decode(e, nodes) for e in x)
    if tag == "dtype":
        return getattr(torch, x)
    if tag == "device":
        return torch.device(x)
    if tag in ("layout", "mf"):
        return getattr(torch, x)
    raise NotCacheable(f"an argument tagged {tag!r}")


def _encode_val(v: Any) -> Any:
    """A node's meta["val"]: fake tensors as their metadata."""
    if isinstance(v, torch.Tensor):
        m = _tensor_meta(v)
        return ("T", m[0], m[1], m[2], m[3].split(".")[-1], m[4])
    if isinstance(v, (list, tuple)):
        return ("l" if isinstance(v, list) else "t",
                [_encode_val(x) for x in v])
    if v is None or isinstance(v, (bool, int, float)):
        return v
    raise NotCacheable(f"a value of type {type(v).__name__}")


def _decode_val(v: Any, mode: Any) -> Any:
    if not isinstance(v, tuple):
        return v
    if v[0] == "T":
        _, shape, stride, offset, dtype, device = v
        # A meta tensor wrapped as the fake mode's own (FakeTensor's
        # constructor): 7-15x faster than torch.empty_strided under the
        # mode, which dispatches.
        meta = torch.empty_strided(shape, stride, dtype=getattr(torch, dtype),
                                   device="meta")
        if offset:
            meta = meta.as_strided(shape, stride, offset)
        return FakeTensor(mode, meta, torch.device(device))
    return (list if v[0] == "l" else tuple)(_decode_val(x, mode) for x in v[1])


def _encode_target(target: Any) -> Any:
    if isinstance(target, torch._ops.OpOverload):
        ns, rest = str(target).split(".", 1)
        name, overload = rest.rsplit(".", 1) if "." in rest else (rest,
                                                                 "default")
        if ns == "higher_order":
            raise NotCacheable(f"a higher-order op ({target})")
        return ("op", ns, name, overload)
    for (module, name), fn in _PY_TARGETS.items():
        if target is fn:
            return ("py", module, name)
    raise NotCacheable(f"a call of {target!r}")


def _decode_target(t: Any) -> Any:
    if t[0] == "op":
        _, ns, name, overload = t
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    return _PY_TARGETS[(t[1], t[2])]


def save_graph(gm: torch.fx.GraphModule) -> Dict[str, Any]:
    """gm (an ATen graph AOTAutograd made) as plain Python values. Raises
    NotCacheable for a node, argument or value outside them."""
    nodes: List[Any] = []
    consts: Dict[str, Any] = {}
    for node in gm.graph.nodes:
        val = _encode_val(node.meta["val"]) if "val" in node.meta else None
        if node.op == "placeholder":
            nodes.append((node.name, "placeholder", None, (), {}, val))
        elif node.op == "call_function":
            nodes.append((node.name, "call_function",
                          _encode_target(node.target), _encode(node.args),
                          {k: _encode(a) for k, a in node.kwargs.items()},
                          val))
        elif node.op == "get_attr":
            value = _attr(gm, str(node.target))
            if not isinstance(value, torch.Tensor) or "." in node.target or \
                    value.numel() * value.element_size() > (1 << 20):
                raise NotCacheable(f"node {node.name}: a constant that is "
                                   f"not a tensor of at most 1 MiB")
            consts[str(node.target)] = (
                str(value.dtype).split(".")[-1], tuple(value.shape),
                str(value.device), _tensor_bytes(value))
            nodes.append((node.name, "get_attr", str(node.target), (), {},
                          val))
        elif node.op == "output":
            nodes.append((node.name, "output", None, _encode(node.args), {},
                          None))
        else:
            raise NotCacheable(f"node {node.name} is a {node.op}")
    return {"nodes": nodes, "consts": consts}


def load_graph(data: Dict[str, Any]) -> torch.fx.GraphModule:
    """The graph save_graph wrote, its values fake tensors of a new fake
    mode (as AOTAutograd's are)."""
    mode = FakeTensorMode()
    root = torch.nn.Module()
    for name, (dtype, shape, device, raw) in data["consts"].items():
        if raw:
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) \
                .view(getattr(torch, dtype)).reshape(shape)
        else:
            t = torch.empty(shape, dtype=getattr(torch, dtype))
        t = t.to(device)
        root.register_buffer(name, t)
    graph = torch.fx.Graph()
    nodes: Dict[str, torch.fx.Node] = {}
    for name, op, target, args, kwargs, val in data["nodes"]:
        if op == "placeholder":
            node = graph.create_node("placeholder", name, name=name)
        elif op == "call_function":
            node = graph.create_node(
                "call_function", _decode_target(target),
                _decode(args, nodes),
                {k: _decode(a, nodes) for k, a in kwargs.items()}, name=name)
        elif op == "get_attr":
            node = graph.create_node("get_attr", target, name=name)
        else:
            node = graph.output(*_decode(args, nodes))
        if val is not None:
            node.meta["val"] = _decode_val(val, mode)
        nodes[name] = node
    return torch.fx.GraphModule(root, graph)


# -- AOTAutograd's metadata ------------------------------------------------

def summarize_metadata(meta: Any, num_inputs: int) -> Dict[str, Any]:
    """What the runtime needs of AOTAutograd's ViewAndMutationMeta (the
    TracingContext's fw_metadata), as plain values. Raises NotCacheable for
    a graph outside the common case this cache holds."""
    from torch._functorch._aot_autograd.schemas import (  # noqa: PLC0415
        MutationType, OutputType)

    if getattr(meta, "tokens", None):
        raise NotCacheable("effect tokens")
    if getattr(meta, "is_rng_op_functionalized", False):
        raise NotCacheable("functionalized RNG")
    if getattr(meta, "num_intermediate_bases", 0):
        raise NotCacheable("outputs alias intermediates")
    if getattr(meta, "grad_enabled_mutation", None) is not None:
        raise NotCacheable("the graph changes grad mode")
    for field_name in ("subclass_inp_meta", "subclass_fw_graph_out_meta"):
        for m in getattr(meta, field_name, None) or []:
            if not isinstance(m, int) and \
                    type(m).__name__ != "PlainTensorMeta":
                raise NotCacheable("a tensor subclass")
    if len(meta.input_info) != num_inputs:
        raise NotCacheable("AOTAutograd's inputs are not Dynamo's "
                           "(duplicates or tokens)")
    versions = []
    for i, info in enumerate(meta.input_info):
        kind = info.mutation_type
        if kind == MutationType.MUTATED_OUT_GRAPH:
            raise NotCacheable(f"input {i} is written outside the graph")
        if kind == MutationType.MUTATED_IN_GRAPH and \
                not info.mutations_hidden_from_autograd:
            versions.append(i)
    out_grad, tangents, unsafe_views = [], [], []
    for i, info in enumerate(meta.output_info):
        if info.output_type == OutputType.unsafe_view_alias:
            # A view of an intermediate nothing else sees: AOTAutograd
            # returns it as a tensor of its own (aten._unsafe_view).
            unsafe_views.append(i)
        elif info.output_type != OutputType.non_alias:
            raise NotCacheable(f"output {i} aliases ({info.output_type})")
        if not (isinstance(info.raw_type, type)
                and issubclass(info.raw_type, torch.Tensor)):
            raise NotCacheable(f"output {i} is not a tensor")
        out_grad.append(bool(info.requires_grad))
        if getattr(info, "requires_grad_for_backward", info.requires_grad):
            tangents.append(i)
    return {"outputs": len(meta.output_info), "out_grad": out_grad,
            "tangents": tangents, "versions": versions,
            "unsafe_views": unsafe_views,
            "amp": bool(torch._C._is_any_autocast_enabled())}


@dataclass
class Entry:
    """One cached result: the forward (or inference) graph, the backward
    graph of a training graph, and summarize_metadata's values."""

    fw: Dict[str, Any]
    bw: Optional[Dict[str, Any]]
    meta: Dict[str, Any]

    def dumps(self) -> bytes:
        return pickle.dumps({"format": FORMAT, "fw": self.fw, "bw": self.bw,
                             "meta": self.meta}, protocol=4)

    @staticmethod
    def loads(data: bytes) -> "Entry":
        d = _PlainUnpickler(io.BytesIO(data)).load()
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise NotCacheable("an entry of another format")
        return Entry(d["fw"], d["bw"], d["meta"])


class _PlainUnpickler(pickle.Unpickler):
    """Plain values only: an entry names no class or function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name}: not a plain value")


def entry_from(fw: Dict[str, Any], bw: Optional[Dict[str, Any]],
               meta: Dict[str, Any], num_inputs: int) -> Entry:
    """An entry, checked against its graphs: the forward takes Dynamo's
    inputs; its outputs are the user's outputs then the values saved for
    the backward; the backward's inputs are those saved values then one
    tangent per output that needs a gradient, its outputs one gradient per
    input."""
    if sum(n[1] == "placeholder" for n in fw["nodes"]) != num_inputs:
        raise NotCacheable("the forward's inputs are not Dynamo's")
    if bw is not None and len(_outputs(bw)) != num_inputs:
        raise NotCacheable("the backward's outputs are not one per input")
    fw_outs = len(_outputs(fw))
    if bw is None:
        if fw_outs != meta["outputs"]:
            raise NotCacheable("inference graph outputs are not the user's")
        return Entry(fw, None, meta)
    saved = fw_outs - meta["outputs"]
    places = [n for n in bw["nodes"] if n[1] == "placeholder"]
    tangents = [n for n in places if n[0].startswith("tangents")]
    if saved < 0 or len(places) != saved + len(tangents) or \
            len(tangents) != len(meta["tangents"]) or \
            any(not n[0].startswith("tangents") for n in places[saved:]):
        raise NotCacheable("the backward's inputs are not saved values then "
                           "tangents")
    if any(not (isinstance(o, tuple) and o[0] == "n") for o in _outputs(fw)):
        raise NotCacheable("a forward output that is not a tensor")
    meta = dict(meta, saved=saved,
                tangent_strides=[tuple(n[5][2]) if isinstance(n[5], tuple)
                                 and n[5][0] == "T" else None
                                 for n in tangents])
    return Entry(fw, bw, meta)


def _outputs(g: Dict[str, Any]) -> List[Any]:
    """The encoded values a saved graph's output node returns."""
    for n in g["nodes"]:
        if n[1] == "output":
            return n[3][1][0][1]  # args ("t", [("l" or "t", [values])])
    raise NotCacheable("a graph without output")


class Capture:
    """What one AOTAutograd compile of a Dynamo graph hands the backend's
    compilers, stored as an entry once complete. A call of the partitioner
    marks a training graph; the first compiler call is then the forward
    (else the inference graph), the second the backward (AOTAutograd
    compiles a static graph's backward lazily, at its first backward
    call). Anything NotCacheable ends the capture quietly (`why`).

    Once complete, `runtime` is the entry's make_runtime over the graphs
    the compilers returned: what a later process's hit runs, without
    AOTAutograd's runtime wrappers (about 100 µs less host time per
    training step on an H200, bench/README.md, session 34). dispatch()
    makes the compiled function that switches to it."""

    def __init__(self, store: Store, key: str, num_inputs: int,
                 report: Callable[[str, str], None]) -> None:
        """report(outcome, detail) is called once the capture ends:
        ("stored", ""), ("store_failed", the directory) or ("uncacheable",
        why)."""
        self.store, self.key, self.num_inputs = store, key, num_inputs
        self.report = report
        self.training = False
        self.why: Optional[str] = None
        self._fw: Optional[Dict[str, Any]] = None
        self._meta: Optional[Dict[str, Any]] = None
        self._done = False
        self._entry: Optional[Entry] = None
        self._compiled: List[Callable[..., Any]] = []
        self.runtime: Optional[Callable[..., Any]] = None

    def partition_fn(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn, marking this capture as a training graph's."""
        def partition(*args: Any, **kwargs: Any) -> Any:
            self.training = True
            return fn(*args, **kwargs)
        return partition

    def compiler(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn (a compiler of AOTAutograd's graphs), saving each graph
        before fn's passes change it."""
        def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any
                          ) -> Any:
            self._take(gm)
            compiled = fn(gm, example_inputs)
            self._compiled.append(compiled)
            if self._entry is not None and self.runtime is None:
                graphs = 2 if self._entry.bw is not None else 1
                if len(self._compiled) == graphs:
                    self.runtime = make_runtime(
                        self._entry, self._compiled[0],
                        self._compiled[1] if graphs == 2 else None)
            return compiled
        return compile_graph

    def dispatch(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """AOTAutograd's compiled function `compiled` until this capture
        is complete, its `runtime` from then on (at once for an inference
        graph; after the first backward for a training graph). A call in
        flight when it switches finishes on the runtime it started on:
        each forward makes its own autograd node."""
        if self.runtime is not None:
            return self.runtime

        def call(*args: Any) -> Any:
            runtime = self.runtime
            if runtime is not None:
                return runtime(*args)
            return compiled(*args)
        return call

    def _take(self, gm: torch.fx.GraphModule) -> None:
        if self._done or self.why is not None:
            return
        try:
            if self._fw is None:
                context = torch._guards.TracingContext.try_get()
                meta = getattr(context, "fw_metadata", None)
                if meta is None:
                    raise NotCacheable("no AOTAutograd metadata")
                self._meta = summarize_metadata(meta, self.num_inputs)
                self._fw = save_graph(gm)
                if not self.training:
                    self._finish(None)
            else:
                self._finish(save_graph(gm))
        except Exception as e:  # noqa: BLE001 (the cache never fails a compile)
            self.why = (str(e) if isinstance(e, NotCacheable) else
                        f"{type(e).__name__}: {e}".splitlines()[0][:200])
            self.report("uncacheable", self.why)

    def _finish(self, bw: Optional[Dict[str, Any]]) -> None:
        assert self._fw is not None and self._meta is not None
        entry = entry_from(self._fw, bw, self._meta, self.num_inputs)
        self._done = True
        self._entry = entry
        if self.store.put(self.key, entry):
            self.report("stored", "")
        else:
            self.report("store_failed", self.store.directory)


# -- the runtime -----------------------------------------------------------

def make_runtime(entry: Entry, fw: Callable[[List[Any]], Any],
                 bw: Optional[Callable[[List[Any]], Any]]
                 ) -> Callable[..., Any]:
    """Dynamo's compiled function for an entry: fw (and bw) are the compiled
    graphs, boxed (called with a list). As AOTAutograd's runtime for the
    graphs this cache holds: the forward in an autograd.Function that saves
    what the backward reads; outputs that need no gradient marked so, views
    of intermediates made tensors of their own (aten._unsafe_view);
    tangents restrided to what the backward was traced with; inputs the
    graph writes get their version bumped; autocast off while the graphs
    run when it was on at compile time (it is in the graphs)."""
    meta = entry.meta
    n_out = meta["outputs"]
    versions = meta["versions"]
    no_amp = torch._C._DisableAutocast if meta["amp"] else None

    def bump(args: Sequence[Any]) -> None:
        if versions:
            torch.autograd.graph.increment_version([args[i] for i in versions])

    if bw is None:
        def inference(*args: Any) -> Any:
            with torch.no_grad():
                if no_amp is not None:
                    with no_amp():
                        outs = fw(list(args))
                else:
                    outs = fw(list(args))
            bump(args)
            return list(outs)[:n_out]
        return inference

    out_grad = meta["out_grad"]
    unsafe_views = meta["unsafe_views"]
    tangent_of = meta["tangents"]
    strides = meta["tangent_strides"]

    class KilnCachedFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:  # type: ignore[override]
            if no_amp is not None:
                with no_amp():
                    outs = list(fw(list(args)))
            else:
                outs = list(fw(list(args)))
            user = outs[:n_out]
            for i in unsafe_views:
                user[i] = torch.ops.aten._unsafe_view(user[i], user[i].shape)
            ctx.save_for_backward(*outs[n_out:])
            ctx.mark_non_differentiable(
                *[o for o, g in zip(user, out_grad) if not g])
            ctx._materialize_non_diff_grads = False
            return tuple(user)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
            # (Once differentiable: the backward graph's results carry no
            # autograd history, and a double backward must fail, as
            # AOTAutograd's does, not return nothing.)
            tangents = []
            for j, i in enumerate(tangent_of):
                g = grads[i]
                s = strides[j]
                if g is not None and s is not None and g.stride() != s:
                    g = torch.empty_strided(g.shape, s, dtype=g.dtype,
                                            device=g.device).copy_(g)
                tangents.append(g)
            args = [*ctx.saved_tensors, *tangents]
            if no_amp is not None:
                with no_amp():
                    return tuple(bw(args))
            return tuple(bw(args))

    def training(*args: Any) -> Any:
        outs = KilnCachedFunction.apply(*args)
        bump(args)
        return list(outs)

    return training


# -- the store -------------------------------------------------------------

class Store:
    """Entries as files <dir>/<key>.entry. get() and put() never raise for
    an I/O error: the cache is an optimisation."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key + ".entry")

    def get(self, key: str) -> Optional[Entry]:
        try:
            with open(self._path(key), "rb") as f:
                data = f.read()
        except OSError:
            return None
        try:
            entry = Entry.loads(data)
        except Exception:  # noqa: BLE001 (a corrupt entry is a miss)
            self.drop(key)
            return None
        try:
            os.utime(self._path(key))  # for the eviction's age
        except OSError:
            pass
        return entry

    def put(self, key: str, entry: Entry) -> bool:
        data = entry.dumps()
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(key))
        except OSError:
            return False
        self._evict()
        return True

    def drop(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except OSError:
            pass

    def _evict(self) -> None:
        try:
            files = [os.path.join(self.directory, n)
                     for n in os.listdir(self.directory)
                     if n.endswith(".entry")]
            stats = sorted(((os.stat(p), p) for p in files),
                           key=lambda s: s[0].st_mtime)
        except OSError:
            return
        total = sum(s.st_size for s, _ in stats)
        for s, p in stats:
            if total <= self.max_bytes:
                break
            try:
                os.unlink(p)
                total -= s.st_size
            except OSError:
                pass


def default_store() -> Optional[Store]:
    """The store the environment names (the module docstring), or None
    when KILN_AOT_CACHE=0."""
    if os.environ.get("KILN_AOT_CACHE", "1") == "0":
        return None
    directory = os.environ.get("KILN_AOT_CACHE_DIR")
    if not directory:
        base = os.environ.get("XDG_CACHE_HOME") or \
            os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "kiln", "aot")
    max_mb = int(os.environ.get("KILN_AOT_CACHE_MAX_MB", "512"))
    return Store(directory, max_mb << 20)
