"""FX -> Kiln: a Core ATen FX graph (what AOTAutograd produces, with
``meta["val"]`` fake tensors on every node) as a kiln.v1.Graph in the
protobuf JSON mapping, the form client/request_json.h reads.

    graph = to_kiln_graph(gm)           # gm: a partition, only supported ops
    exe = client.cpu_executable(graph.json)

Tensor placeholders become Graph.inputs with their dtype, sizes, strides and
storage offset; SymInt sizes become Graph.symbols: a size that is a plain
symbol keeps its name ("s0") and binds it (Kiln reads a symbol's value from
an input dim that is exactly it); a size that is a polynomial in bound
symbols (s0*s1, s0 - 1, 64*s0 + 64) is a SizeExpr; a compound input size
over symbols nothing binds gets a symbol of its own ("k0"). Floor division,
modulo, min/max cannot be said: such nodes run eagerly. A SymInt placeholder
used in a size list whose symbols no tensor binds becomes a size input
(KilnGraph.size_inputs). Contiguous inputs are sent without strides.
SymInt placeholders are not inputs (Kiln binds every symbol
from the tensors' sizes), except where an op takes one as a scalar operand
(mean's backward divides by a symbolic count): such a SymInt/SymFloat is a
0-dim input (KilnGraph.scalar_inputs) and a Scalar overload becomes its
Tensor twin. A Python number an op takes as a Tensor becomes
aten.scalar_tensor; aten.alias is its input's value. Outputs that are
placeholders are not sent: the caller returns those inputs as themselves.
An output that is a view (ALIAS_VIEW_OPS) of an input, or a view Kiln need
not write (an expand, a view of another output, a layout with gaps), is a
ViewOutput: the caller makes it with as_strided over the input or the Kiln
output it views (as Inductor's wrapper reinterprets a buffer), so it aliases
its base as eager's view does and Kiln writes nothing for it.

Everything here raises Unsupported (with the reason) for what Kiln's graph
format cannot say; kiln/partition.py uses the same checks to decide which
nodes Kiln runs.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.fx

from .fx_build import NodeBuilder, fake_mode_of

__all__ = ["ALIAS_VIEW_OPS", "AS_STRIDED_OPS", "COMPARISON_OPS",
           "IDENTITY_OPS", "KilnGraph", "SizeInput", "ViewOutput",
           "Unsupported", "as_strided_view", "check_node_args", "dtype_name",
           "graph_device", "is_contiguous", "op_name", "schema_args",
           "to_kiln_graph"]

_DTYPES = {
    torch.float32: "FLOAT32",
    torch.float16: "FLOAT16",
    torch.bfloat16: "BFLOAT16",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.bool: "BOOL",
}

# Keyword arguments that only say "a strided tensor": dropped when they
# have these values (Kiln's graphs are functional and on one device; a
# device= argument is neutral because every tensor of a graph, the created
# ones included, is checked to be on the graph's one device).
_NEUTRAL_KWARGS = {
    "layout": (None, torch.strided),
    "pin_memory": (None, False),
    "memory_format": (None, torch.preserve_format, torch.contiguous_format),
    "non_blocking": (False,),
}

# The devices whose tensors run in Kiln.
_DEVICE_TYPES = ("cpu", "cuda")


# Copies whose memory_format (channels_last, ...) only picks their result's
# strides: the values are the same in any layout, and Kiln lays out what
# it computes itself (a partition output in PyTorch's strides, below).
_LAYOUT_COPIES = frozenset({"aten.clone.default", "aten._to_copy.default"})


def _neutral_kwarg(key: str, value: Any,
                   node: Optional[torch.fx.Node] = None) -> bool:
    """Whether keyword argument key=value of `node` can be dropped. A
    copy's memory_format can, unless an as_strided reads the copy (its
    strides would then matter: SegFormer's channels-last clones do not)."""
    if key == "device":
        return value is None or torch.device(value).type in _DEVICE_TYPES
    if (key == "memory_format" and node is not None
            and op_name(node.target) in _LAYOUT_COPIES
            and isinstance(value, torch.memory_format)
            and not any(op_name(u.target) in AS_STRIDED_OPS
                        for u in node.users)):
        return True
    return key in _NEUTRAL_KWARGS and value in _NEUTRAL_KWARGS[key]


# Kiln's random ops (graph/ops/random.h): each takes Kiln's `seed` keyword
# (an int64 0-dim input drawn per call from torch's generator, one per
# partition) and `offset` (the op's stream: 0, 1, ... in the partition).
RANDOM_OPS = frozenset({
    "aten.native_dropout.default", "aten.rand.default", "aten.randn.default",
    "aten.rand_like.default", "aten.randn_like.default", "aten.bernoulli.p",
    "aten.bernoulli.default", "kiln.attention_dropout.default"})


# Ops that are their input's value in a functional graph: the same ref.
IDENTITY_OPS = frozenset({"aten.alias.default"})
_IDENTITY_OPS = IDENTITY_OPS

# Ops whose result always shares its input's storage (a view, never a
# copy): an output made of these over an input is a ViewOutput.
ALIAS_VIEW_OPS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.permute.default",
    "aten.expand.default", "aten.squeeze.dim", "aten.squeeze.dims",
    "aten.squeeze.default", "aten.unsqueeze.default", "aten.slice.Tensor",
    "aten.select.int", "aten.alias.default", "aten.t.default",
    "aten.transpose.int", "aten.as_strided.default",
})


class Unsupported(Exception):
    """Why a node or graph cannot go to Kiln (the message is the reason)."""


def op_name(target: Any) -> str:
    """The Core ATen overload name Kiln uses ("aten.add.Tensor")."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__name__", str(target))


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPES.get(dtype)
    if name is None:
        raise Unsupported(f"dtype {dtype} (Kiln has {', '.join(map(str, _DTYPES))})")
    return name


def _sym_expr(value: Any) -> Any:
    """The sympy expression of a SymInt (None for a plain int)."""
    if isinstance(value, torch.SymInt):
        return value.node.expr
    return None


def _non_polynomial(expr: Any) -> str:
    """What makes `expr` not a polynomial, for the reason."""
    import sympy  # noqa: PLC0415 (torch's dependency)
    kinds = sorted({type(f).__name__ for f in expr.atoms(sympy.Function)})
    if kinds:
        return ", ".join(kinds)
    return "not a polynomial with integer coefficients"


def _integral_floats(e: Any) -> Any:
    """e with each float constant that is an integer made one."""
    import sympy  # noqa: PLC0415
    floats = {f: sympy.Integer(int(f)) for f in e.atoms(sympy.Float)
              if float(f).is_integer()}
    return e.xreplace(floats) if floats else e


def _integer_polynomial(e: Any) -> bool:
    import sympy  # noqa: PLC0415
    e = sympy.expand(e)
    syms = sorted(e.free_symbols, key=str)
    if not syms:
        return bool(e.is_Integer)
    return (not e.atoms(sympy.Function) and e.is_polynomial(*syms) and
            all(c.is_Integer for c in sympy.Poly(e, *syms).coeffs()))


def exact_size(expr: Any) -> Any:
    """expr with the float arithmetic Dynamo writes for sizes computed in
    Python floats (`torch.arange(klen, -qlen, -1.0)`'s length is
    CeilToInt(FloatTrueDiv(ToFloat(-s0) - ToFloat(s0), -1.0))) done
    exactly, in rationals: ToFloat(x) is x, a float division a division,
    and a rounding to int (CeilToInt, FloorToInt, TruncToInt) or a FloorDiv
    by a constant is dropped where its argument is already an integer
    polynomial (2*s0), so the rounding has nothing to do. Others stay as
    they are (and stay refused). Min/Max are rebuilt, so sympy settles
    those the symbols' signs decide (Max(1, 2*s0) is 2*s0 for s0 > 0)."""
    import sympy  # noqa: PLC0415
    if not expr.args:
        return _integral_floats(expr)
    args = [exact_size(a) for a in expr.args]
    name = type(expr).__name__
    if name == "ToFloat":
        return args[0]
    if name in ("FloatTrueDiv", "IntTrueDiv"):
        return _integral_floats(sympy.expand(args[0] / args[1]))
    if name in ("CeilToInt", "FloorToInt", "TruncToInt") and \
            _integer_polynomial(args[0]):
        return sympy.expand(args[0])
    if name == "FloorDiv" and args[1].is_Integer and args[1] != 0 and \
            _integer_polynomial(args[0] / args[1]):
        return sympy.expand(args[0] / args[1])
    return _integral_floats(expr.func(*args))


def poly_terms(expr: Any) -> List[Tuple[int, List[Any]]]:
    """`expr` (a sympy expression of a SymInt) as polynomial terms
    (coeff, [symbol, ...]) (a symbol repeated for a power), after
    exact_size; raises Unsupported for floor division, modulo, min/max
    and the like."""
    import sympy  # noqa: PLC0415
    e = sympy.expand(expr)
    if e.atoms(sympy.Function):
        e = sympy.expand(exact_size(e))
    syms = sorted(e.free_symbols, key=str)
    if not syms:
        if not e.is_Integer:
            raise Unsupported(f"size {expr} is not an integer")
        return [(int(e), [])] if int(e) != 0 else []
    if e.atoms(sympy.Function) or not e.is_polynomial(*syms):
        raise Unsupported(f"size {expr} is not a polynomial in the sizes "
                          f"({_non_polynomial(expr)})")
    terms = []
    for monom, coeff in sympy.Poly(e, *syms).terms():
        if not coeff.is_Integer:
            raise Unsupported(f"size {expr} has a non-integer coefficient")
        factors = [s for s, k in zip(syms, monom) for _ in range(int(k))]
        terms.append((int(coeff), factors))
    return terms


class _Symbols:
    """The symbols of one graph. Plain symbols keep their names ("s0");
    a size that is a polynomial in symbols the inputs bind (an input dim
    that is exactly the symbol) becomes a SizeExpr; a compound input size
    over symbols nothing binds gets a symbol of its own ("k0", bound from
    that dim)."""

    def __init__(self) -> None:
        self.names: Dict[Any, str] = {}  # sympy expr -> symbol name
        self.bound: set = set()  # sympy symbols bound by an input dim
        self._fresh = 0
        self.shape_env: Any = None  # Dynamo's, from the first SymInt seen

    def see(self, size: Any) -> None:
        """Notes the ShapeEnv of a SymInt (for the symbols' bounds)."""
        if self.shape_env is None and isinstance(size, torch.SymInt):
            self.shape_env = size.node.shape_env

    def bind(self, expr: Any) -> str:
        """Declares `expr` as a symbol bound by an input dim; its name."""
        name = self.names.get(expr)
        if name is None:
            if expr.is_Symbol:
                name = str(expr)
            else:
                name = f"k{self._fresh}"
                self._fresh += 1
            self.names[expr] = name
        if expr.is_Symbol:
            self.bound.add(expr)
        return name

    def _poly(self, expr: Any) -> Optional[Dict[str, Any]]:
        """expr as {"expr": SizeExpr} over bound symbols, None when it uses
        a symbol nothing binds. Raises Unsupported for non-polynomials."""
        terms = poly_terms(expr)
        if any(f not in self.bound for _, fs in terms for f in fs):
            return None
        return {"expr": {"terms": [
            {"coeff": c, "symbols": [self.names[f] for f in fs]}
            for c, fs in terms]}}

    def dim(self, size: Any) -> Dict[str, Any]:
        """An input's size (plain symbols were bound beforehand)."""
        self.see(size)
        expr = _sym_expr(size)
        if expr is None:
            return {"value": int(size)}
        if expr.is_Integer:
            return {"value": int(expr)}
        if expr in self.names:
            return {"symbol": self.names[expr]}
        if expr.is_Symbol:
            return {"symbol": self.bind(expr)}
        try:
            poly = self._poly(expr)
        except Unsupported:  # FloorDiv(s0, 2): a symbol of its own
            poly = None
        if poly is not None:
            return poly
        return {"symbol": self.bind(expr)}

    def arg_dim(self, size: Any) -> Dict[str, Any]:
        """A size in an op's argument: a constant, a symbol or a
        polynomial over the symbols the inputs bind."""
        self.see(size)
        expr = _sym_expr(size)
        if expr is None or expr.is_Integer:
            return {"value": int(expr if expr is not None else size)}
        name = self.names.get(expr)
        if name is not None:
            return {"symbol": name}
        poly = self._poly(expr)
        if poly is None:
            unbound = sorted(str(f) for _, fs in poly_terms(expr) for f in fs
                             if f not in self.bound)
            raise Unsupported(
                f"size {expr} in an argument uses {', '.join(unbound)}, "
                "which no input of the partition has as a size")
        return poly

    def stride(self, stride: Any) -> Dict[str, Any]:
        expr = _sym_expr(stride)
        if expr is None or expr.is_Integer:
            return {"value": int(expr if expr is not None else stride)}
        if expr in self.names:
            return {"value": 1, "symbols": [self.names[expr]]}
        value, symbols = 1, []
        for factor in expr.as_ordered_factors():
            if factor.is_Integer:
                value *= int(factor)
                continue
            base, exp = factor.as_base_exp()
            if base not in self.names or not exp.is_Integer or exp < 1:
                break
            symbols += [self.names[base]] * int(exp)
        else:
            return {"value": value, "symbols": symbols}
        poly = self._poly(expr)
        if poly is None:
            raise Unsupported(f"stride {expr} uses a symbol no input size binds")
        return poly

    def declared(self) -> List[Dict[str, Any]]:
        """The kiln.v1.Symbols, each plain symbol with the upper bound
        Dynamo's guards keep it under (max_value), where it has one:
        Kiln's guards check it, and it proves slices to the symbol stay
        inside their dims."""
        out = []
        for expr, name in self.names.items():
            symbol: Dict[str, Any] = {"name": name}
            upper = self._upper(expr)
            if upper is not None:
                symbol["max_value"] = upper
            out.append(symbol)
        return out

    def _upper(self, expr: Any) -> Optional[int]:
        ranges = getattr(self.shape_env, "var_to_range", None)
        if not ranges or not expr.is_Symbol or expr not in ranges:
            return None
        upper = ranges[expr].upper
        if not getattr(upper, "is_Integer", False):
            return None  # unbounded (int_oo)
        upper = int(upper)
        return upper if 2 <= upper <= 1 << 40 else None


def _val(node: torch.fx.Node) -> Any:
    if "val" not in node.meta:
        raise Unsupported(f"{node.name} has no meta['val'] (not from AOTAutograd)")
    return node.meta["val"]


def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise Unsupported(f"{what} is a {type(t).__name__}, not a tensor")
    dtype_name(t.dtype)
    if t.device.type not in _DEVICE_TYPES:
        raise Unsupported(f"{what} is on {t.device} (Kiln runs CPU and CUDA "
                          "tensors)")


def _float(v: float) -> Any:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _argument(value: Any, symbols: Optional[_Symbols],
              refs: Dict[torch.fx.Node, str]) -> Dict[str, Any]:
    """One FX argument as a kiln.v1.Argument (without its name)."""
    if isinstance(value, (_Const, _SymInput)):
        return {"ref": refs[value]}
    if isinstance(value, torch.fx.Node):
        v = value.meta.get("val")
        if isinstance(v, torch.Tensor):
            if value not in refs:
                raise Unsupported(f"{value.name} is not a value of this graph")
            return {"ref": refs[value]}
        if isinstance(v, torch.SymInt):
            raise Unsupported("a SymInt scalar argument")
        raise Unsupported(f"argument {value.name} is a {type(v).__name__}")
    if value is None:
        return {"none": {}}
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, torch.SymInt):
        raise Unsupported("a SymInt scalar argument")
    if isinstance(value, int):
        return {"i": value}
    if isinstance(value, float):
        return {"f": _float(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, str):
        return {"str": value}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, torch.fx.Node) and
                         isinstance(v.meta.get("val"), torch.Tensor)
                         for v in value):
            return {"refs": {"values": [_argument(v, symbols, refs)["ref"]
                                        for v in value]}}
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return {"ints": {"values": list(value)}}
        if value and all(isinstance(v, bool) for v in value):
            # bool[] (output_mask): Kiln's schemas take it as an int list
            # of 0/1 (graph/ops/norm.cc).
            return {"ints": {"values": [int(v) for v in value]}}
        dims = []
        for v in value:
            if isinstance(v, torch.fx.Node):
                v = v.meta.get("val")
            if not isinstance(v, (int, torch.SymInt)) or isinstance(v, bool):
                raise Unsupported(f"a list holding a {type(v).__name__}")
            if symbols is None:  # only checking
                if _sym_expr(v) is not None:
                    poly_terms(_sym_expr(v))  # raises for non-polynomials
                dims.append({})
            else:
                dims.append(symbols.arg_dim(v))
        return {"dims": {"values": dims}}
    raise Unsupported(f"an argument of type {type(value).__name__}")


def _wants_tensor(schema_arg: Any) -> bool:
    return isinstance(schema_arg.type, torch._C.TensorType)


def _is_number(v: Any) -> bool:
    return isinstance(v, (bool, int, float)) and not isinstance(v, torch.SymInt)


# Overloads taking a Scalar `other` and their Tensor twins: a symbolic
# scalar (SymInt/SymFloat, a graph input at run time) goes to the twin as a
# 0-dim tensor.
_SCALAR_TO_TENSOR = {
    "aten.add.Scalar": "aten.add.Tensor", "aten.sub.Scalar": "aten.sub.Tensor",
    "aten.mul.Scalar": "aten.mul.Tensor", "aten.div.Scalar": "aten.div.Tensor",
    "aten.pow.Tensor_Scalar": "aten.pow.Tensor_Tensor",
}


def _is_sym_scalar(v: Any) -> bool:
    return isinstance(v, torch.fx.Node) and \
        isinstance(v.meta.get("val"), (torch.SymInt, torch.SymFloat))


def _sym_scalar_ok(node: torch.fx.Node, position: Any) -> bool:
    """Whether a symbolic scalar may be argument `position` (int or kwarg
    name) of `node`: where the op takes a Tensor, or as `other` of an
    overload with a Tensor twin."""
    schema = node.target._schema.arguments
    name = op_name(node.target)
    for i, sa in enumerate(schema):
        if position in (i, sa.name):
            if _wants_tensor(sa):
                return True
            if _SYMINT_ARGS.get(name) == i:  # positional only (the translator's)
                return i < len(node.args) and isinstance(
                    node.args[i].meta.get("val"), torch.SymInt)
            return name in _SCALAR_TO_TENSOR and i == 1
    return False


class _SymInput:
    """A symbolic scalar placeholder passed to Kiln as a 0-dim tensor."""

    def __init__(self, name: str) -> None:
        self.name = name


def _wrapped_dtype(node: torch.fx.Node, value_type: type) -> torch.dtype:
    """The dtype PyTorch gives a Python number of `value_type` next to the
    node's tensor operand: the operand's, else the default for its kind."""
    other = next((a.meta["val"] for a in node.args
                  if isinstance(a, torch.fx.Node) and
                  isinstance(a.meta.get("val"), torch.Tensor)), None)
    if value_type is bool:
        return other.dtype if other is not None else torch.bool
    if value_type is int:
        return other.dtype if other is not None and other.dtype != torch.bool \
            else torch.int64
    return other.dtype if other is not None and other.is_floating_point() \
        else torch.float32


class _Const:
    """A Python number an op takes as a Tensor, made a graph value."""

    def __init__(self, name: str) -> None:
        self.name = name


def _scalar_tensor(node: torch.fx.Node, value: Any, nodes: List[Dict[str, Any]],
                   refs: Dict[Any, str]) -> "_Const":
    """Emits aten.scalar_tensor for a Python number passed where the op takes
    a Tensor (PyTorch wraps it), with the dtype PyTorch's promotion gives
    the wrapped number: the tensor operand's, or the default for its kind."""
    dtype = _wrapped_dtype(node, type(value))
    name = f"{node.name}_c{len(nodes)}"
    const = _Const(name)
    refs[const] = name
    nodes.append({"op": "aten.scalar_tensor.default",
                  "args": [{"f": _float(float(value))},
                           {"name": "dtype", "dtype": dtype_name(dtype)}],
                  "outputs": [name]})
    return const


_VIEW_SIZE_OPS = frozenset({"aten.view.default", "aten._unsafe_view.default",
                            "aten.reshape.default"})


# index.Tensor and index_put take Tensor?[] indices, where None leaves a
# dim whole; Kiln's take index tensors for the leading dims only. The
# backend permutes the indexed dims to the front (IndexLayout).
_INDEX_OPS = frozenset({"aten.index.Tensor", "aten.index_put.default"})


# Per norm op: (the weight's argument index, the statistics' output indices)
# in the forward ops, (weight index, statistics argument indices) in the
# backward ops that read them.
_NORM_STATS_OUT: Dict[str, Tuple[int, Tuple[int, ...]]] = {
    "aten.native_layer_norm.default": (2, (1, 2)),
    "aten._native_batch_norm_legit_functional.default": (1, (1, 2)),
    "aten._native_batch_norm_legit_no_training.default": (1, (1, 2)),
    "aten._native_batch_norm_legit.no_stats": (1, (1, 2)),
}
_NORM_STATS_IN: Dict[str, Tuple[int, Tuple[int, ...]]] = {
    "aten.native_layer_norm_backward.default": (5, (3, 4)),
    "aten.native_batch_norm_backward.default": (2, (5, 6)),
}


# Norms whose statistics outputs (these indices) Kiln computes and returns
# in float32, as PyTorch's CUDA kernels do. PyTorch's CPU kernels return
# them in a half input's dtype (unless mixed: align_norm_stats_with_eager):
# _cast_stats rounds them to it.
FLOAT32_STATS: Dict[str, Tuple[int, ...]] = {
    name: stats for name, (_, stats) in _NORM_STATS_OUT.items()}


def _mixed_cpu_norm(node: torch.fx.Node, weight: int) -> bool:
    """Whether node (a norm or its backward, input at argument 0 or 1) is
    PyTorch's mixed type on the CPU: a half input, a float32 weight."""
    args = node.args
    x = args[1] if op_name(node.target) in _NORM_STATS_IN else args[0]
    w = args[weight] if len(args) > weight else node.kwargs.get("weight")
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    return (isinstance(xv, torch.Tensor) and isinstance(wv, torch.Tensor) and
            xv.device.type == "cpu" and wv.dtype == torch.float32 and
            xv.dtype in (torch.float16, torch.bfloat16))


def _as_float32(node: Any) -> None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dtype != torch.float32:
        node.meta["val"] = val.to(torch.float32)


def align_norm_stats_with_eager(gm: torch.fx.GraphModule) -> None:
    """Sets the statistics of mixed-type norms on the CPU (a half input,
    float32 weight: what torch.autocast("cpu") leaves) to float32 in gm's
    meta values. PyTorch's CPU kernels return and take them in float32;
    its fake kernels, which the graph was traced with, say the input's
    dtype. Kiln follows the kernels: rounding them to bfloat16 across the
    forward/backward boundary cost a badly conditioned batch norm (LeViT's
    over 8 values) 40x eager's gradient error. The forward and backward
    graphs are aligned alike, so whatever runs each side agrees."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = op_name(node.target)
        if name in _NORM_STATS_OUT:
            weight, stats = _NORM_STATS_OUT[name]
            if not _mixed_cpu_norm(node, weight):
                continue
            val = list(node.meta["val"])
            for i in stats:
                val[i] = val[i].to(torch.float32)
            node.meta["val"] = type(node.meta["val"])(val)
            for user in node.users:
                if user.target is operator.getitem and user.args[1] in stats:
                    _as_float32(user)
        elif name in _NORM_STATS_IN:
            weight, stats = _NORM_STATS_IN[name]
            if _mixed_cpu_norm(node, weight):
                for i in stats:
                    _as_float32(node.args[i])


_CONVERT = "prims.convert_element_type.default"


def _convert_to(node: torch.fx.Node) -> Optional[torch.dtype]:
    """The dtype a convert_element_type node converts to, else None."""
    if node.op != "call_function" or op_name(node.target) != _CONVERT:
        return None
    dtype = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    return dtype if isinstance(dtype, torch.dtype) else None


# The comparison ops: what a backward compares must be the forward's own
# bits, never a recomputed copy (dynamo.recompute_partition, kiln/remat.py).
COMPARISON_OPS = frozenset(
    f"aten.{op}.{overload}" for op in ("eq", "ne", "lt", "le", "gt", "ge")
    for overload in ("Tensor", "Scalar"))


def write_inputs(dsts: Tuple[torch.Tensor, ...],
                 srcs: Tuple[torch.Tensor, ...]) -> None:
    """dsts[i].copy_(srcs[i]) for each i, in one call: a graph's input
    mutations of one device and dtype (batch_input_writes). A pair whose
    source is its destination (a Kiln partition wrote the input itself,
    input_write_candidates) is skipped."""
    pairs = [(d, s) for d, s in zip(dsts, srcs) if d is not s]
    if not pairs:
        return
    if _FOREACH_COPY is None:
        for d, s in pairs:
            d.copy_(s)
        return
    _FOREACH_COPY([d for d, _ in pairs], [s for _, s in pairs])


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def batch_input_writes(gm: torch.fx.GraphModule) -> int:
    """A graph AOTAutograd made with keep_inference_input_mutations writes
    its mutated inputs at its end: copy_(input, new value), one eager
    dispatch and one kernel each (batch norm's running statistics and
    count, three per layer; a compiled optimizer step's parameters and
    states). Here the copies into graph inputs that nothing reads after them
    become write_inputs nodes before the output, one per device and dtype
    (grouped here, from the meta values): one torch._foreach_copy_ each, a
    multi-tensor kernel (a list that mixes dtypes, batch norm's float
    running statistics with its int64 count, would copy tensor by tensor).
    A group of one keeps its copy_ (one kernel either way), marked as the
    write_inputs nodes are (meta "kiln_input_writes": not an op Kiln
    lacks, so not reported as a fallback). Returns how many copies it
    took; the graph is recompiled when any."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    copies = [n for n in graph.nodes
              if n.op == "call_function" and
              n.target is torch.ops.aten.copy_.default and
              len(n.args) == 2 and not n.kwargs and not n.users and
              isinstance(n.args[0], torch.fx.Node) and
              n.args[0].op == "placeholder"]
    if not copies:
        return 0
    first = min(order[c] for c in copies)
    dsts = [c.args[0] for c in copies]
    if len(set(dsts)) != len(dsts):
        return 0  # one input written twice: keep their order
    for c in copies:
        # Nothing after the first copy reads an input it writes.
        if any(order[u] > first and u not in copies for u in c.args[0].users):
            return 0

    def kind(n: torch.fx.Node) -> Any:
        val = n.meta.get("val")
        return (val.device, val.dtype) if isinstance(val, torch.Tensor) else None

    groups: Dict[Any, List[torch.fx.Node]] = {}
    for c in copies:
        groups.setdefault((kind(c.args[0]), kind(c.args[1])), []).append(c)
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    taken = 0
    for group in groups.values():
        if len(group) == 1:
            group[0].meta["kiln_input_writes"] = 1
            continue
        taken += len(group)
        with graph.inserting_before(out):
            node = graph.call_function(
                write_inputs, (tuple(c.args[0] for c in group),
                               tuple(c.args[1] for c in group)))
        node.meta["val"] = None
        node.meta["kiln_input_writes"] = len(group)
        for c in group:
            graph.erase_node(c)
    if taken:
        gm.recompile()
    return taken


def give_constants_values(gm: torch.fx.GraphModule) -> int:
    """Gives each get_attr node of a tensor constant (a `torch.tensor([...])`
    literal AOTAutograd lifted into the module) without a fake value one,
    made in the graph's fake mode from the constant: torch 2.6 leaves
    them without, and the translator refused their readers ("argument
    _tensor_constant0 is a NoneType"). Returns how many it gave."""
    mode = fake_mode_of(gm.graph)
    given = 0
    for node in gm.graph.nodes:
        if node.op != "get_attr" or "val" in node.meta or mode is None:
            continue
        value: Any = gm
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor):
            node.meta["val"] = mode.from_tensor(value, static_shapes=True)
            given += 1
    return given


def share_float64_scalar_converts(gm: torch.fx.GraphModule) -> None:
    """A Python float that Dynamo does not specialise (an eps, a scale under
    dynamic=True) reaches the graph as a 0-dim float64 tensor input, and
    AOTAutograd converts it where it is used: convert_element_type(x,
    float64), a no-op, then a convert to float32. Kiln has no float64, so
    each of those ran eagerly (13 nodes in HF Llama's training step). Here a
    float64 0-dim placeholder's no-op converts are dropped and its
    narrowing converts to one dtype become one node right after the
    placeholder: one eager convert per scalar and dtype, read by the
    partitions as their input."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None  # insert after it
    for p in placeholders:
        val = p.meta.get("val")
        if not (isinstance(val, torch.Tensor) and val.dtype == torch.float64
                and val.dim() == 0):
            continue
        changed = True
        while changed:  # no-op converts, chains of them too: read p
            changed = False
            for user in list(p.users):
                if _convert_to(user) is torch.float64 and user.args[0] is p:
                    user.replace_all_uses_with(p)
                    graph.erase_node(user)
                    changed = True
        shared: Dict[torch.dtype, torch.fx.Node] = {}
        for user in list(p.users):
            dtype = _convert_to(user)
            if dtype is None or user.args[0] is not p:
                continue
            if dtype in shared:
                user.replace_all_uses_with(shared[dtype])
                graph.erase_node(user)
                continue
            anchor.append(user)  # it reads p alone
            shared[dtype] = anchor = user
    graph.lint()
    gm.recompile()


def arange_from_symbolic_starts(gm: torch.fx.GraphModule) -> int:
    """Rewrites each torch.arange whose start is a SymInt (XLNet's
    arange(klen, -qlen, -1.0), position ids after a cache's length) with a
    step of 1 or -1 as start + step * arange(length): Kiln's arange takes
    a symbolic end only, while a symbolic scalar added to a tensor is a
    Kiln input (a 0-dim tensor). The length, (end - start) * step, is
    SymInt arithmetic that runs in Python, outside the partitions. Returns
    how many it rewrote."""
    names = ("aten.arange.start", "aten.arange.start_step")
    fake_mode = None
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or op_name(node.target) not in names:
            continue
        args = schema_args(node)
        start, end = args[0], args[1]
        step = args[2] if op_name(node.target) == names[1] else 1
        val = node.meta.get("val")
        if not (isinstance(start, torch.fx.Node) and
                isinstance(start.meta.get("val"), torch.SymInt) and
                isinstance(val, torch.Tensor) and
                not isinstance(step, bool) and step in (1, -1) and
                (isinstance(end, int) or (isinstance(end, torch.fx.Node) and
                 isinstance(end.meta.get("val"), torch.SymInt)))):
            continue
        fake_mode = fake_mode or fake_mode_of(gm.graph)
        if fake_mode is None:
            return done
        b = NodeBuilder(gm.graph, node, fake_mode)
        length = b(operator.sub, end, start) if step > 0 else \
            b(operator.sub, start, end)
        t = b(torch.ops.aten.arange.default, length, dtype=val.dtype,
              device=val.device)
        if step < 0:
            t = b(torch.ops.aten.mul.Tensor, t, -1)
        t = b(torch.ops.aten.add.Tensor, t, start)
        if t.meta["val"].dtype != val.dtype:
            t = b(torch.ops.prims.convert_element_type.default, t, val.dtype)
        node.replace_all_uses_with(t)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _cast_stats(val: Any, stats: Tuple[int, ...], names: List[str],
                nodes: List[Dict[str, Any]]) -> List[str]:
    """`names` (a norm's outputs) with each statistics output whose
    PyTorch dtype is not float32 replaced by a cast of it to that dtype."""
    names = list(names)
    for i in stats:
        dtype = val[i].dtype
        if dtype == torch.float32:
            continue
        cast = f"{names[i]}_{dtype_name(dtype).lower()}"
        nodes.append({"op": "prims.convert_element_type.default",
                      "args": [{"ref": names[i]},
                               {"dtype": dtype_name(dtype)}],
                      "outputs": [cast]})
        names[i] = cast
    return names


# Slices: (dim, start, end, step) argument positions.
SLICE_OPS = {
    "aten.slice.Tensor": (1, 2, 3, 4),
    "aten.slice_scatter.default": (2, 3, 4, 5),
}

# Ops with an int argument (this position) that may be a SymInt, which
# Kiln takes as a size (a one-element size list): arange's end (a dynamic
# sequence length: torch.arange(seq_len)) and slice's end (a buffer cut to
# it: position_ids[:, :seq_len], inside the dim by the symbol's bound).
_SYMINT_ARGS = {"aten.arange.default": 0, "aten.arange.start": 1,
                "aten.arange.start_step": 1, "aten.slice.Tensor": 3}


def slice_to_the_end(node: torch.fx.Node, args: Sequence[Any]) -> Tuple[Any, ...]:
    """A slice's args (schema order or node.args) with a symbolic end that
    is the sliced dim's size given as None: x[:, :n] where n is x.shape[1]
    (models slice by lengths they computed: a mask to the keys' length)."""
    dim_i, _, end_i, _ = SLICE_OPS[op_name(node.target)]
    if len(args) <= end_i or not isinstance(args[end_i], torch.fx.Node):
        return tuple(args)
    end = _sym_expr(args[end_i].meta.get("val"))
    self_val = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) \
        else None
    dim = args[dim_i] if len(args) > dim_i and args[dim_i] is not None else 0
    if end is None or not isinstance(self_val, torch.Tensor) or \
            not isinstance(dim, int) or not -self_val.dim() <= dim < self_val.dim():
        return tuple(args)
    if _sym_expr(self_val.shape[dim]) != end:
        return tuple(args)
    return (*args[:end_i], None, *args[end_i + 1:])


def _node_args(node: torch.fx.Node) -> Tuple[Any, ...]:
    """node.args, with the one size of a view/reshape that is neither a
    constant nor a plain symbol (s0*16) given as -1 (Kiln infers it; unless
    a -1 is there already), an
    index list's Nones dropped (IndexLayout says where they were) and a
    slice's symbolic end that is its dim's size given as None."""
    args = node.args
    if op_name(node.target) in SLICE_OPS:
        args = slice_to_the_end(node, args)
    if op_name(node.target) in _INDEX_OPS and len(args) >= 2 and \
            isinstance(args[1], (list, tuple)) and None in args[1]:
        if all(a is None for a in args[1]):
            raise Unsupported("an index list of Nones only")
        args = (args[0], [a for a in args[1] if a is not None], *args[2:])
    if op_name(node.target) in _VIEW_SIZE_OPS and len(args) >= 2 and \
            isinstance(args[1], (list, tuple)):
        sizes = list(args[1])
        compound = []
        for i, v in enumerate(sizes):
            val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
            expr = _sym_expr(val)
            if expr is not None and not expr.is_Integer and not expr.is_Symbol:
                compound.append(i)
        # (Not where the sizes already infer one: view(b, -1, h * d) with a
        # compound b keeps b, a polynomial argument.)
        inferred = any(isinstance(v, int) and v == -1 for v in sizes)
        if len(compound) == 1 and not inferred:
            sizes[compound[0]] = -1
            args = (args[0], sizes, *args[2:])
    return args


def schema_args(node: torch.fx.Node) -> List[object]:
    """node's arguments in schema order, defaults filled in."""
    out = []
    for i, sa in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out.append(node.args[i])
        elif sa.name in node.kwargs:
            out.append(node.kwargs[sa.name])
        else:
            out.append(sa.default_value if sa.has_default_value() else None)
    return out


def graph_device(gm: torch.fx.GraphModule) -> "torch.device | None":
    """The device of gm's tensor inputs: a CUDA one if any is on CUDA, else
    the CPU; None without tensor inputs."""
    devices = [n.meta["val"].device for n in gm.graph.nodes
               if n.op == "placeholder" and
               isinstance(n.meta.get("val"), torch.Tensor)]
    cuda = [d for d in devices if d.type == "cuda"]
    return cuda[0] if cuda else (devices[0] if devices else None)


# as_strided and as_strided_scatter address their input's memory: the
# position of their `size` argument. Kiln's ops address a value's
# row-major elements (graph/ops/views.h, StridedView).
AS_STRIDED_OPS = {"aten.as_strided.default": 1,
                  "aten.as_strided_scatter.default": 2}


def as_strided_view(node: torch.fx.Node) -> Tuple[Optional[List[int]],
                                                  List[int], List[int], int]:
    """For an as_strided(_scatter) node: the permutation that puts its
    input's dims in memory order (None when they are), and the view's
    sizes, strides and storage offset counted from the input's first
    element. Raises Unsupported when Kiln cannot say it: an input whose
    memory has gaps or overlaps, or symbolic sizes, strides or offset."""
    name = op_name(node.target)
    first = AS_STRIDED_OPS[name]
    args = schema_args(node)
    self_val = _val(node.args[0])
    if not isinstance(self_val, torch.Tensor):
        raise Unsupported(f"{name} of a non-tensor")
    sizes, strides, offset = args[first], args[first + 1], args[first + 2]
    values = list(sizes) + list(strides) + [offset or 0,
                                            self_val.storage_offset()]
    values += list(self_val.shape) + list(self_val.stride())
    if not all(isinstance(v, int) for v in values):
        raise Unsupported(f"{name} with symbolic sizes, strides or offset "
                          "(Kiln takes static ones)")
    order = None
    if not is_contiguous(self_val):
        order = permuted_layout(self_val)
        if order is None:
            raise Unsupported(f"{name} of a tensor whose memory has gaps or "
                              "overlaps")
    start = (offset or 0) - self_val.storage_offset()
    if start < 0:
        raise Unsupported(f"{name} reaches before its input's first element")
    return order, [int(v) for v in sizes], [int(v) for v in strides], start


def _is_cpu_scalar(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and \
        t.dim() == 0


def _cuda_op_with_cpu_scalars(node: torch.fx.Node, val: Any) -> bool:
    """Whether node computes on CUDA with its only CPU inputs 0-dim: PyTorch
    takes those as scalars, and the partition moves them to the device
    (KilnGraph.moved_inputs)."""
    results = val if isinstance(val, (list, tuple)) else [val]
    inputs = [a.meta.get("val") for a in node.all_input_nodes]
    inputs = [t for t in inputs if isinstance(t, torch.Tensor)]
    return all(t.device.type == "cuda" or _is_cpu_scalar(t) for t in inputs) \
        and all(t.device.type == "cuda" for t in results
                if isinstance(t, torch.Tensor))


def is_contiguous(t: torch.Tensor) -> bool:
    """Whether t's strides are the row-major ones of its sizes, decided on
    the expressions (no guard is added): Max(1, e) counts as e."""
    import sympy  # noqa: PLC0415 (torch's dependency)

    def expr(v: Any) -> Any:
        e = _sym_expr(v)
        e = sympy.Integer(int(v)) if e is None else e
        # torch writes Max with a class of its own (torch.utils._sympy).
        return e.replace(
            lambda x: type(x).__name__ == "Max" and len(x.args) == 2 and
            any(a == 1 for a in x.args),
            lambda x: next(a for a in x.args if a != 1))

    expected = sympy.Integer(1)
    for size, stride in reversed(list(zip(t.shape, t.stride()))):
        size_e = expr(size)
        if size_e != 1 and sympy.expand(expr(stride) - expected) != 0:
            return False
        expected = expected * size_e
    return True


def check_node_args(node: torch.fx.Node) -> None:
    """Raises Unsupported when a call_function node's arguments or results
    cannot be said in Kiln's graph format (refs are not checked)."""
    refs = _AnyRefs()
    for i, a in enumerate(_node_args(node)):
        if _is_sym_scalar(a) and _sym_scalar_ok(node, i):
            continue
        _argument(a, None, refs)
    for k, v in node.kwargs.items():
        if _neutral_kwarg(k, v, node):
            continue
        if k in _NEUTRAL_KWARGS or k == "device":
            raise Unsupported(f"{k}={v}")
        if _is_sym_scalar(v) and _sym_scalar_ok(node, k):
            continue
        _argument(v, None, refs)
    val = _val(node)
    devices = set()
    for i, t in enumerate(val if isinstance(val, (list, tuple)) else [val]):
        if t is not None:
            _check_tensor(t, f"result {i}")
            devices.add(t.device)
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            _check_tensor(v, f"input {a.name}")
            devices.add(v.device)
    if len(devices) > 1 and not _cuda_op_with_cpu_scalars(node, val):
        raise Unsupported("tensors on several devices ("
                          f"{', '.join(sorted(map(str, devices)))})")


class _AnyRefs(dict):
    """A refs map that knows every node (for checking a single node)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: Any) -> str:
        return key.name


@dataclass
class SizeInput:
    """A Kiln input that binds symbol `expr`. dim None: its FX argument
    (tensor_inputs) is a SymInt of that value; else a tensor whose size
    along `dim` is coeff * value + offset."""

    expr: Any
    dim: Optional[int] = None
    coeff: int = 1
    offset: int = 0

    def value(self, arg: Any) -> int:
        if self.dim is None:
            return int(arg)
        return (int(arg.shape[self.dim]) - self.offset) // self.coeff


@dataclass
class KilnGraph:
    """A kiln.v1.Graph for an FX graph, and how to call it.

    graph: the kiln.v1.Graph as a dict (protobuf JSON mapping).
    tensor_inputs: for each Kiln input, the index of the FX placeholder.
    outputs: for each FX output, ("kiln", j) for Kiln output j, or
        ("input", i) for placeholder i returned as itself.
    output_meta: each Kiln output's fake tensor (sizes, strides, dtype).
    input_meta: each Kiln input's fake tensor.
    scalar_inputs: Kiln inputs that are symbolic scalars (SymInt/SymFloat
        placeholders), passed as 0-dim tensors of this dtype.
    size_inputs: Kiln inputs that bind a symbol no tensor input's dim is:
        passed as a bool tensor of shape (value,) with stride 0
        (size_input_tensor); see SizeInput; their input_meta is None.
    dynamic: whether any size is symbolic.
    device: the one device of every tensor of the graph (CPU or a CUDA
        device): the executable is compiled for it.
    output_perms: per Kiln output, None, or the dims to permute it by
        (Tensor.permute) to get the layout PyTorch expects: Kiln writes that
        output contiguously in the expected layout's order (a permute node
        before it in the graph), so the caller's permute is a view, not a
        copy (permuted_layout()).
    node_origin: per node of `graph`, the name of the FX node it comes
        from (None for none): kilnd's errors name nodes by index.
    seeded: whether the graph has random ops; then its last tensor_inputs
        entry is one past the placeholders: the caller appends a fresh seed
        (an int64 0-dim tensor, draw_seed()) to the FX arguments.
    moved_inputs: Kiln inputs that are 0-dim CPU tensors of a CUDA graph
        (a tensor literal PyTorch mixes with CUDA tensors as a scalar): the
        caller moves them to `device` before the call.
    view_outputs: the outputs ("view", v) of `outputs` refers to.
    """

    graph: Dict[str, Any]
    tensor_inputs: List[int]
    outputs: List[Tuple[str, int]]
    output_meta: List[torch.Tensor]
    input_meta: List[torch.Tensor]
    scalar_inputs: Dict[int, torch.dtype]
    size_inputs: Dict[int, "SizeInput"]
    dynamic: bool
    symbol_of: Dict[Any, str] = field(default_factory=dict)
    device: torch.device = torch.device("cpu")
    seeded: bool = False
    output_perms: List[Optional[List[int]]] = field(default_factory=list)
    node_origin: List[Optional[str]] = field(default_factory=list)
    moved_inputs: List[int] = field(default_factory=list)
    view_outputs: List["ViewOutput"] = field(default_factory=list)

    @property
    def json(self) -> str:
        return json.dumps(self.graph, separators=(",", ":"))

    def request_input_writes(self, writes: Dict[int, int]) -> None:
        """Asks kilnd to store Kiln output j into Kiln input k's memory, for
        each j: k of `writes` (kiln.v1.Graph.input_writes)."""
        if writes:
            self.graph["inputWrites"] = [{"output": j, "input": k}
                                         for j, k in sorted(writes.items())]

    def take_input_writes(self, written: Dict[int, int]) -> None:
        """The executable stored Kiln output j into Kiln input k, for each
        j: k of `written`: those are no longer Kiln outputs (the others keep
        their order); each FX output that was one is the argument itself,
        which the run wrote."""
        if not written:
            return
        kept = [j for j in range(len(self.output_meta)) if j not in written]
        index = {j: n for n, j in enumerate(kept)}

        def remap(ref: Tuple[str, int]) -> Tuple[str, int]:
            kind, j = ref
            if kind != "kiln":
                return ref
            if j in written:
                return ("input", self.tensor_inputs[written[j]])
            return ("kiln", index[j])

        self.outputs = [remap(o) if o[0] != "view" else o
                        for o in self.outputs]
        for v in self.view_outputs:
            v.base = remap(v.base)
        self.output_meta = [self.output_meta[j] for j in kept]
        if self.output_perms:
            self.output_perms = [self.output_perms[j] for j in kept]


def input_write_candidates(module: torch.fx.GraphModule, call: torch.fx.Node,
                           graph: "KilnGraph") -> Dict[int, int]:
    """{Kiln output j: Kiln input k} of partition `call` (a call_module
    node of `module`) whose FX output is the new value of graph input p
    that the partition also reads as Kiln input k: the graph ends with
    copy_(p, output) (or a write_inputs of it, batch_input_writes), and
    after the call nothing but that write reads p, and no view of p made
    before the call outlives it. Kiln may then write the output into p's
    memory (KilnGraph.request_input_writes); the write that follows is a
    copy of p onto itself, which does nothing."""
    order = {n: i for i, n in enumerate(module.graph.nodes)}
    # FX output position -> the value node the parent reads it as.
    outputs: Dict[int, torch.fx.Node] = {}
    for user in call.users:
        if user.op == "call_function" and user.target is operator.getitem:
            outputs[user.args[1]] = user
    if not outputs and len(graph.outputs) == 1:
        outputs[0] = call
    writes: Dict[int, int] = {}
    for pos, value in outputs.items():
        kind, j = graph.outputs[pos]
        if kind != "kiln" or (graph.output_perms and graph.output_perms[j]):
            continue
        for use in value.users:
            dst = _written_input(use, value)
            if dst is None or dst not in call.args or \
                    call.args.index(dst) not in graph.tensor_inputs:
                continue
            k = graph.tensor_inputs.index(call.args.index(dst))
            meta, val = graph.output_meta[j], dst.meta.get("val")
            # Compared as expressions: no guard on a symbolic size.
            if not isinstance(val, torch.Tensor) or \
                    val.dtype != meta.dtype or \
                    list(map(str, val.shape)) != list(map(str, meta.shape)) \
                    or not is_contiguous(val) or \
                    str(val.storage_offset()) != "0" or \
                    not is_contiguous(meta) or k in writes.values():
                continue
            if _read_after(dst, call, use, order):
                continue
            writes[j] = k
    return writes


def _written_input(use: torch.fx.Node,
                   value: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The graph input `use` writes `value` into (copy_(p, value) or a
    write_inputs with that pair), else None."""
    if use.op != "call_function":
        return None
    if use.target is torch.ops.aten.copy_.default and use.args[1] is value \
            and use.args[0].op == "placeholder":
        return use.args[0]
    if use.target is write_inputs:
        for d, src in zip(*use.args):
            if src is value and d.op == "placeholder":
                return d
    return None


def _read_after(p: torch.fx.Node, call: torch.fx.Node, write: torch.fx.Node,
                order: Dict[torch.fx.Node, int]) -> bool:
    """Whether p is read after `call` by anything but `write`, or a node
    before it made a view of p (the run would change what it shows)."""
    base = p.meta.get("val")
    for user in p.users:
        if user is call or user is write:
            continue
        if order[user] > order[call]:
            return True
        val = user.meta.get("val")
        for v in (val if isinstance(val, (list, tuple)) else [val]):
            if isinstance(v, torch.Tensor) and isinstance(base, torch.Tensor) \
                    and _same_storage(v, base):
                return True
    return False


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except Exception:  # noqa: BLE001 (no storage to compare: assume shared)
        return True


@dataclass
class ViewOutput:
    """An output that aliases `base`: base.as_strided(sizes, strides,
    base.storage_offset() + offset), what eager's chain of views gives.
    base: ("input", i), FX argument i, or ("kiln", j), Kiln output j in the
    layout PyTorch expects. sizes, strides, offset: ints, or sympy
    expressions over symbols some Kiln input's dim is (evaluated per call).
    Valid because Kiln's guards fix an input's strides and Kiln writes its
    outputs in the expected ones."""

    base: Tuple[str, int]
    sizes: Tuple[Any, ...]
    strides: Tuple[Any, ...]
    offset: Any

    @property
    def static(self) -> bool:
        return all(isinstance(v, int)
                   for v in self.sizes + self.strides + (self.offset,))


def _is_alias_view(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" \
        and op_name(node.target) in ALIAS_VIEW_OPS and bool(node.args) \
        and isinstance(node.args[0], torch.fx.Node)


def _meta_value(v: Any) -> Any:
    """A size, stride or offset of a fake tensor: an int, or its sympy
    expression."""
    e = _sym_expr(v)
    if e is None:
        return int(v)
    return int(e) if e.is_Integer else e


def _alias_outputs(gm: torch.fx.GraphModule, results: Sequence[Any],
                   bound: set) -> Dict[torch.fx.Node, torch.fx.Node]:
    """The outputs (chains of ALIAS_VIEW_OPS) that are ViewOutputs, each
    with the node it views: every view of a placeholder; a view nothing
    else uses when writing it would be waste (an expand, a view of a value
    the graph returns anyway, a layout that is neither contiguous nor a
    permuted dense one). Only where the view's sizes, strides and offset
    are known from Kiln's inputs (`bound`: the symbols an input dim is)."""
    returned = {r for r in results if isinstance(r, torch.fx.Node)}
    aliases: Dict[torch.fx.Node, torch.fx.Node] = {}
    for r in returned:
        if not _is_alias_view(r):
            continue
        chain = [r]
        source = r.args[0]
        while _is_alias_view(source):
            chain.append(source)
            source = source.args[0]
        val, base = r.meta.get("val"), source.meta.get("val")
        if not isinstance(val, torch.Tensor) or \
                not isinstance(base, torch.Tensor):
            continue
        trailing = all(u.op == "output" for u in r.users)
        if not (source.op == "placeholder" or (trailing and (
                any(op_name(c.target) == "aten.expand.default" for c in chain)
                or source in returned or any(c in returned for c in chain[1:])
                or not _dense(val)))):
            continue
        exprs = [_sym_expr(v) for v in
                 list(val.shape) + list(val.stride()) +
                 [val.storage_offset(), base.storage_offset()]]
        if any(e is not None and not e.free_symbols <= bound for e in exprs):
            continue
        aliases[r] = source
    return aliases


def _dense(t: torch.Tensor) -> bool:
    """Whether Kiln writes t in the layout PyTorch expects without a copy:
    contiguous, or a permuted dense layout."""
    try:
        return is_contiguous(t) or permuted_layout(t) is not None
    except Exception:  # noqa: BLE001 (an expression sympy cannot compare)
        return False


def _skipped_views(gm: torch.fx.GraphModule,
                   aliases: Dict[torch.fx.Node, torch.fx.Node]) -> set:
    """The view nodes only ViewOutputs use (nothing in Kiln reads them)."""
    chains = set()
    for r in aliases:
        n = r
        while n is not aliases[r]:
            chains.add(n)
            n = n.args[0]
    skipped: set = set()
    for node in reversed(list(gm.graph.nodes)):
        if node in chains and all(
                u in skipped or (u.op == "output" and node in aliases)
                for u in node.users):
            skipped.add(node)
    return skipped


def to_kiln_graph(gm: torch.fx.GraphModule) -> KilnGraph:
    """Translates `gm` (placeholders, call_function nodes of Kiln's ops and
    getitem, one output) into a KilnGraph. Raises Unsupported."""
    symbols = _Symbols()
    refs: Dict[torch.fx.Node, str] = {}
    inputs: List[Dict[str, Any]] = []
    tensor_inputs: List[int] = []
    input_meta: List[torch.Tensor] = []
    sym_inputs: Dict[torch.fx.Node, _SymInput] = {}
    scalar_inputs: Dict[int, torch.dtype] = {}
    nodes: List[Dict[str, Any]] = []
    placeholders: Dict[torch.fx.Node, int] = {}
    multi: Dict[torch.fx.Node, List[str]] = {}  # node -> its output names
    dynamic = False
    num_placeholders = 0
    devices: Dict[torch.device, str] = {}  # device -> a node on it

    def on_device(t: torch.Tensor, node: torch.fx.Node) -> None:
        devices.setdefault(t.device, node.name)
        if len(devices) > 1:
            raise Unsupported("tensors on several devices: " + ", ".join(
                f"{n} on {d}" for d, n in devices.items()))
    seed_args: List[Dict[str, Any]] = []  # the random ops' seed arguments
    random_streams = 0
    size_inputs: Dict[int, Any] = {}

    placeholders_index = {n: i for i, n in enumerate(
        n for n in gm.graph.nodes if n.op == "placeholder")}
    # 0-dim CPU inputs of a graph with CUDA inputs: moved there per call.
    cuda_graph = getattr(graph_device(gm), "type", None) == "cuda"
    moved_inputs: List[int] = []
    # Symbols first: every input dim that is exactly a symbol binds it.
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            for size in val.shape:
                expr = _sym_expr(size)
                if expr is not None and expr.is_Symbol:
                    symbols.bind(expr)
    def add_size_input(node: torch.fx.Node, expr: Any, spec: "SizeInput") -> None:
        """A Kiln input of shape (value of expr,), stride 0, that binds
        expr's symbol; `spec` says how the caller gets the value from the
        FX argument of `node`."""
        inputs.append({"name": f"in{len(inputs)}", "meta": {
            "dtype": "BOOL", "sizes": [{"symbol": symbols.bind(expr)}],
            "strides": [{"value": 0}]}})
        tensor_inputs.append(placeholders_index[node])
        input_meta.append(None)
        size_inputs[len(inputs) - 1] = spec

    # A SymInt placeholder used in a size list whose symbols no tensor input
    # binds is passed as a "size input": a tensor of shape (value,) with
    # stride 0 (built per call, no data), which binds it in Kiln.
    size_args = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        for a in list(node.args) + list(node.kwargs.values()):
            if isinstance(a, (list, tuple)):
                size_args.update(v for v in a if isinstance(v, torch.fx.Node))
        end = _SYMINT_ARGS.get(op_name(node.target))
        if end is not None and len(node.args) > end and \
                isinstance(node.args[end], torch.fx.Node):
            size_args.add(node.args[end])
    for node in gm.graph.nodes:
        if node.op != "placeholder" or node not in size_args:
            continue
        expr = _sym_expr(node.meta.get("val"))
        if expr is None or expr.is_Integer or expr in symbols.names:
            continue
        if not expr.is_Symbol and all(f in symbols.bound
                                      for f in expr.free_symbols):
            continue
        add_size_input(node, expr, SizeInput(expr))
    # A symbol s still unbound that a tensor input's dim gives as a*s + c
    # (a view x[:, 1:-1] has size s - 2 and strides over s): a size input
    # too, of value (that dim's size - c) / a, computed per call. Kiln checks
    # the dim against a*s + c like any compound size.
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            expr = _sym_expr(size)
            if expr is None or expr.is_Integer or expr.is_Symbol or \
                    len(expr.free_symbols) != 1:
                continue
            sym = next(iter(expr.free_symbols))
            if sym in symbols.bound:
                continue
            try:
                terms = poly_terms(expr)
            except Unsupported:
                continue
            a = sum(c for c, fs in terms if fs == [sym])
            c = sum(c for c, fs in terms if not fs)
            if a < 1 or any(fs and fs != [sym] for _, fs in terms):
                continue
            add_size_input(node, sym, SizeInput(sym, d, a, c))
    dynamic |= bool(size_inputs)

    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = output_node.args[0]
    if not isinstance(results, (list, tuple)):
        results = [results]
    aliases = _alias_outputs(gm, results, symbols.bound)
    skipped = _skipped_views(gm, aliases)

    # Per Kiln node, the FX node it comes from (errors name Kiln nodes).
    origin: List[Optional[str]] = []
    current: Optional[str] = None
    for node in gm.graph.nodes:
        origin.extend([current] * (len(nodes) - len(origin)))
        current = node.name
        if node in skipped:
            continue
        if node.op == "placeholder":
            placeholders[node] = num_placeholders
            num_placeholders += 1
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                continue  # SymInts and other scalars: bound from the sizes
            _check_tensor(val, f"input {node.name}")
            if cuda_graph and _is_cpu_scalar(val):
                moved_inputs.append(len(inputs))
            else:
                on_device(val, node)
            sizes = [symbols.dim(s) for s in val.shape]
            dynamic |= any("symbol" in d for d in sizes)
            # Empty strides say "contiguous" (also for strides torch writes
            # with Max(1, ...), which Kiln's Stride cannot say).
            strides = [] if is_contiguous(val) else \
                [symbols.stride(s) for s in val.stride()]
            offset = val.storage_offset()
            if _sym_expr(offset) is not None and not _sym_expr(offset).is_Integer:
                # A view at a symbolic offset (a slice of a dynamic dim):
                # the runtime passes the data pointer with the offset
                # applied, so only the alignment class is unknown.
                offset, aligned = 0, False
            else:
                offset = int(offset)
                # PyTorch's allocations are 64-byte (CPU) or 512-byte
                # (CUDA) aligned; a storage offset keeps 16 bytes only at
                # multiples of 16 bytes.
                aligned = (offset * val.element_size()) % 16 == 0
            meta: Dict[str, Any] = {
                "dtype": dtype_name(val.dtype), "sizes": sizes,
                "strides": strides, "alignment": 16 if aligned else 0,
            }
            if offset:
                meta["storage_offset"] = offset
            name = f"in{len(inputs)}"
            refs[node] = name
            inputs.append({"name": name, "meta": meta})
            input_meta.append(val)
            tensor_inputs.append(placeholders[node])
        elif node.op == "call_function":
            if op_name(node.target) in _IDENTITY_OPS:
                source = node.args[0]
                if source in placeholders:
                    placeholders[node] = placeholders[source]
                    if source in refs:
                        refs[node] = refs[source]
                    continue
                if source not in refs:
                    raise Unsupported(f"{node.name}: alias of a non-tensor")
                refs[node] = refs[source]
                continue
            if node.target is operator.getitem:
                source, index = node.args
                if source not in multi:
                    raise Unsupported("getitem of a value that is not a "
                                      "multi-output op of this graph")
                refs[node] = multi[source][index]
                continue
            if not isinstance(node.target, torch._ops.OpOverload):
                raise Unsupported(f"{op_name(node.target)} is not an ATen op")
            check_node_args(node)
            schema = node.target._schema.arguments
            name = op_name(node.target)
            if name in AS_STRIDED_OPS:
                on_device(_val(node), node)
                _add_as_strided(node, nodes, _argument(node.args[0], symbols, refs),
                                _argument(node.args[1], symbols, refs)
                                if AS_STRIDED_OPS[name] == 2 else None)
                refs[node] = node.name
                continue

            def sym_input(a: torch.fx.Node) -> _SymInput:
                """The Kiln input for a symbolic scalar placeholder."""
                if a not in placeholders:
                    raise Unsupported(f"symbolic scalar {a.name} is computed "
                                      "inside the partition")
                if a not in sym_inputs:
                    dtype = _wrapped_dtype(node, float if isinstance(
                        a.meta["val"], torch.SymFloat) else int)
                    sym_inputs[a] = _SymInput(f"in{len(inputs)}")
                    refs[sym_inputs[a]] = sym_inputs[a].name
                    inputs.append({"name": sym_inputs[a].name, "meta": {
                        "dtype": dtype_name(dtype), "sizes": []}})
                    tensor_inputs.append(placeholders[a])
                    input_meta.append(torch.empty((), dtype=dtype))
                    scalar_inputs[len(inputs) - 1] = dtype
                return sym_inputs[a]

            args = []
            for i, a in enumerate(_node_args(node)):
                if _SYMINT_ARGS.get(name) == i and _is_sym_scalar(a):
                    args.append({"dims": {"values": [
                        symbols.arg_dim(a.meta["val"])]}})
                    continue
                if i < len(schema) and _wants_tensor(schema[i]) and \
                        _is_number(a):
                    a = _scalar_tensor(node, a, nodes, refs)
                elif _is_sym_scalar(a):
                    if not _wants_tensor(schema[i]):
                        name = _SCALAR_TO_TENSOR[name]
                    a = sym_input(a)
                args.append(_argument(a, symbols, refs))
            for k, v in node.kwargs.items():
                if _neutral_kwarg(k, v, node):
                    continue
                if _is_number(v) and any(_wants_tensor(sa) for sa in schema
                                         if sa.name == k):
                    v = _scalar_tensor(node, v, nodes, refs)
                elif _is_sym_scalar(v):
                    v = sym_input(v)
                arg = _argument(v, symbols, refs)
                arg["name"] = k
                args.append(arg)
            if name in RANDOM_OPS:
                # The seed input is declared after the loop (seed_args).
                seed_args.append({"ref": None, "name": "seed"})
                args.append(seed_args[-1])
                args.append({"i": random_streams, "name": "offset"})
                random_streams += 1
            val = _val(node)
            for t in val if isinstance(val, (list, tuple)) else [val]:
                if isinstance(t, torch.Tensor):
                    on_device(t, node)
            layout = index_layout(node) if name in _INDEX_OPS else None
            if layout is not None:
                _add_index_with_nones(
                    node, layout, nodes, args,
                    lambda sizes: _argument(sizes, symbols, refs))
                refs[node] = node.name
                continue
            if isinstance(val, (list, tuple)):
                names = [f"{node.name}_{i}" for i in range(len(val))]
                multi[node] = names
            else:
                names = [node.name]
                refs[node] = node.name
            nodes.append({"op": name, "args": args, "outputs": names})
            if name in FLOAT32_STATS:
                multi[node] = _cast_stats(val, FLOAT32_STATS[name], names,
                                          nodes)
        elif node.op == "output":
            pass
        else:
            raise Unsupported(f"a {node.op} node ({node.target})")

    outputs: List[Tuple[str, int]] = []
    kiln_outputs: List[str] = []
    output_meta: List[torch.Tensor] = []
    view_outputs: List[ViewOutput] = []

    def kiln_output(r: torch.fx.Node) -> Tuple[str, int]:
        if r in placeholders:
            return ("input", placeholders[r])
        name = refs.get(r)
        if name is None:
            raise Unsupported(f"output {r.name} is not a tensor of this graph")
        if name not in kiln_outputs:
            kiln_outputs.append(name)
            output_meta.append(_val(r))
        return ("kiln", kiln_outputs.index(name))

    for r in results:
        if not isinstance(r, torch.fx.Node):
            raise Unsupported(f"an output that is a {type(r).__name__}")
        source = aliases.get(r)
        if source is None:
            outputs.append(kiln_output(r))
            continue
        val, base = _val(r), _val(source)
        view_outputs.append(ViewOutput(
            base=kiln_output(source),
            sizes=tuple(_meta_value(v) for v in val.shape),
            strides=tuple(_meta_value(v) for v in val.stride()),
            offset=_meta_value(val.storage_offset() - base.storage_offset())))
        outputs.append(("view", len(view_outputs) - 1))
    if seed_args:
        # The last Kiln input, FX argument num_placeholders (the caller
        # appends it to each call): after every placeholder, wherever the
        # graph declares them (torch.fx's fuse_as_graphmodule declares a
        # partition's inputs where first used, after a random op, in torch
        # 2.11; 2.15 declares them first).
        seed_ref = f"in{len(inputs)}"
        inputs.append({"name": seed_ref, "meta": {
            "dtype": dtype_name(torch.int64), "sizes": [], "device": "CPU"}})
        tensor_inputs.append(num_placeholders)
        input_meta.append(torch.empty((), dtype=torch.int64))
        for arg in seed_args:
            arg["ref"] = seed_ref
    origin.extend([current] * (len(nodes) - len(origin)))
    output_perms = _permute_outputs(nodes, kiln_outputs, output_meta)
    value_origin = {out: origin[k] for k, n in enumerate(nodes[:len(origin)])
                    for out in n["outputs"]}
    for n in nodes[len(origin):]:  # the permutes of outputs
        origin.append(value_origin.get(n["args"][0].get("ref")))
    device = next(iter(devices), torch.device("cpu"))
    for i in inputs:  # scalar inputs too: they are passed on the device
        i["meta"]["device"] = "CUDA" if device.type == "cuda" else "CPU"
    graph = {"inputs": inputs, "symbols": symbols.declared(), "nodes": nodes,
             "outputs": kiln_outputs}
    return KilnGraph(graph=graph, tensor_inputs=tensor_inputs, outputs=outputs,
                     output_meta=output_meta, input_meta=input_meta,
                     scalar_inputs=scalar_inputs, size_inputs=size_inputs,
                     dynamic=dynamic,
                     symbol_of=dict(symbols.names), device=device,
                     seeded=bool(seed_args), output_perms=output_perms,
                     node_origin=origin, moved_inputs=moved_inputs,
                     view_outputs=view_outputs)


def size_hint(size: Any, unknown: int = 0) -> int:
    """A size's value in the example inputs: an int, a SymInt's hint, or
    `unknown` for a SymInt without one."""
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        return int(hint) if hint is not None else unknown
    return int(size)


@dataclass
class IndexLayout:
    """How an index/index_put with Nones in its indices reaches Kiln:
    self permuted by `perm` (the indexed dims first, in order), indexed on
    its leading dims; index's result then permuted by `result_perm` (None:
    as it is), which moves the indices' broadcast dims back to where the
    first indexed dim was when the indexed dims are adjacent (PyTorch's
    rule; apart, they stay in front)."""

    perm: List[int]
    result_perm: Optional[List[int]]


def index_layout(node: torch.fx.Node) -> Optional[IndexLayout]:
    """The IndexLayout of an index.Tensor/index_put node whose indices hold
    a None before an index tensor, else None (Kiln takes it as it is)."""
    indices = node.args[1]
    if not isinstance(indices, (list, tuple)):
        return None
    indexed = [d for d, t in enumerate(indices) if t is not None]
    if indexed == list(range(len(indexed))):
        return None  # only trailing Nones: the leading dims are indexed
    rank = _val(node.args[0]).dim()
    rest = [d for d in range(rank) if d not in indexed]
    nb = max(_val(indices[d]).dim() for d in indexed)
    result_perm = None
    if indexed == list(range(indexed[0], indexed[0] + len(indexed))):
        p = indexed[0]
        result_perm = ([nb + i for i in range(p)] + list(range(nb)) +
                       [nb + i for i in range(p, len(rest))])
    return IndexLayout(perm=indexed + rest, result_perm=result_perm)


def _add_permute(nodes: List[Dict[str, Any]], arg: Dict[str, Any],
                 order: Sequence[int], out: str) -> Dict[str, Any]:
    """Appends a Kiln permute of `arg` by `order` named `out`; its ref."""
    nodes.append({"op": "aten.permute.default",
                  "args": [arg, {"ints": {"values": list(order)}}],
                  "outputs": [out]})
    return {"ref": out}


def _inverse(perm: Sequence[int]) -> List[int]:
    inverse = [0] * len(perm)
    for k, d in enumerate(perm):
        inverse[d] = k
    return inverse


def _add_index_with_nones(node: torch.fx.Node, layout: IndexLayout,
                          nodes: List[Dict[str, Any]],
                          args: List[Dict[str, Any]],
                          size_arg: Callable[[List[Any]], Dict[str, Any]]
                          ) -> None:
    """Appends the Kiln nodes of an index/index_put FX node (output
    node.name) whose indices hold Nones, from its converted arguments
    (`args`, the Nones dropped): self permuted by layout.perm; index's
    result, or index_put's values, permuted between PyTorch's order and
    Kiln's; index_put's result permuted back."""
    name = op_name(node.target)
    args = [_add_permute(nodes, args[0], layout.perm,
                         f"{node.name}__indexed_first")] + args[1:]
    kiln_order = f"{node.name}__kiln_order"
    if name == "aten.index.Tensor":
        if layout.result_perm is None:
            nodes.append({"op": name, "args": args, "outputs": [node.name]})
        else:
            nodes.append({"op": name, "args": args, "outputs": [kiln_order]})
            _add_permute(nodes, {"ref": kiln_order}, layout.result_perm,
                         node.name)
        return
    values = args[2]
    if layout.result_perm is not None:
        # values broadcast to index's result in PyTorch's order: expanded to
        # it, then permuted into Kiln's (broadcast dims first).
        sizes = _val(node.args[0]).shape
        indexed = [t for t in node.args[1] if t is not None]
        batch = torch.broadcast_shapes(*(_val(t).shape for t in indexed))
        rest = [sizes[d] for d in layout.perm[len(indexed):]]
        p = layout.result_perm.index(0)
        full = list(rest[:p]) + list(batch) + list(rest[p:])
        expanded = f"{node.name}__values_expanded"
        nodes.append({"op": "aten.expand.default",
                      "args": [values, size_arg(full)],
                      "outputs": [expanded]})
        values = _add_permute(nodes, {"ref": expanded},
                              _inverse(layout.result_perm),
                              f"{node.name}__values_kiln_order")
    nodes.append({"op": name, "args": [args[0], args[1], values] + args[3:],
                  "outputs": [kiln_order]})
    _add_permute(nodes, {"ref": kiln_order}, _inverse(layout.perm), node.name)


def _add_as_strided(node: torch.fx.Node, nodes: List[Dict[str, Any]],
                    self_arg: Dict[str, Any],
                    src_arg: Optional[Dict[str, Any]]) -> None:
    """Appends the Kiln nodes of an as_strided(_scatter) FX node, output
    node.name: its input is first permuted into memory order when its dims
    are in another (as_strided_view), and a scatter's result permuted back."""
    name = op_name(node.target)
    order, sizes, strides, start = as_strided_view(node)
    if order is not None:
        self_arg = _add_permute(nodes, self_arg, order,
                                f"{node.name}__memory_order")
    args = [self_arg] + ([src_arg] if src_arg is not None else [])
    args += [{"ints": {"values": sizes}}, {"ints": {"values": strides}},
             {"i": start}]
    out = node.name
    if src_arg is not None and order is not None:
        out = f"{node.name}__in_memory_order"
    nodes.append({"op": name, "args": args, "outputs": [out]})
    if out != node.name:
        _add_permute(nodes, {"ref": out}, _inverse(order), node.name)


def permuted_layout(t: torch.Tensor) -> Optional[List[int]]:
    """For a tensor PyTorch expects non-contiguous: the dims p such that
    t.permute(p) is contiguous (a dense layout in another dim order, as a
    transpose or a channels-last tensor has), or None when there is none
    (gaps, overlaps, or strides that cannot be proved, e.g. symbolic ones
    whose order depends on the sizes). Decided on the expressions: the
    example sizes only order the candidates."""
    if t.dim() < 2:
        return None
    order = sorted(range(t.dim()), key=lambda d: (-size_hint(t.stride()[d]), d))
    if order == list(range(t.dim())):
        return None
    try:
        if not is_contiguous(t.permute(order)):
            return None
    except Exception:  # noqa: BLE001 (an expression sympy cannot compare)
        return None
    return order


def _permute_outputs(nodes: List[Dict[str, Any]], kiln_outputs: List[str],
                     output_meta: List[torch.Tensor]) -> List[Optional[List[int]]]:
    """Rewrites each Kiln output whose expected layout is a permuted dense
    one as a permute node (so Kiln writes the expected layout contiguously)
    and returns, per output, the inverse permutation the caller applies (a
    view), or None. output_meta then holds the permuted (contiguous) metas."""
    perms: List[Optional[List[int]]] = []
    for j, meta in enumerate(output_meta):
        order = None if is_contiguous(meta) else permuted_layout(meta)
        if order is None:
            perms.append(None)
            continue
        name = f"{kiln_outputs[j]}__layout"
        _add_permute(nodes, {"ref": kiln_outputs[j]}, order, name)
        kiln_outputs[j] = name
        output_meta[j] = meta.permute(order)
        perms.append(_inverse(order))
    return perms


def size_input_tensor(value: int, device: torch.device) -> torch.Tensor:
    """What a size input (KilnGraph.size_inputs) is passed as: shape
    (value,), stride 0, one byte of storage."""
    return torch.zeros((), dtype=torch.bool, device=device).expand(int(value))


def draw_seed(device: torch.device = torch.device("cpu")) -> torch.Tensor:
    """A seed for one call of a partition with random ops, drawn from
    torch's default generator of `device` as Inductor's inductor_seeds does
    (torch.randint(2**63 - 1)): torch.manual_seed(s) makes runs
    reproducible and each call draws new numbers. On the device, as the
    partition's other inputs."""
    return torch.randint(2**63 - 1, (), dtype=torch.int64, device=device)


def contiguous_strides(sizes: Sequence[int]) -> Tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))
