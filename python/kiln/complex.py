"""Complex tensors as pairs of reals, so Kiln compiles them.

Kiln's graphs hold real dtypes only. Real training code still meets
complex numbers, mostly in rotary position embeddings written as Meta's
Llama reference writes them (``view_as_complex``, a complex multiply by
``freqs_cis`` made with ``torch.polar``, ``view_as_real``): torchtitan,
Llama 4 in transformers, and many research codebases. Left alone, every
complex op runs eagerly and splits each attention layer's partition into
pieces.

lower_complex() rewrites an AOTAutograd graph (forward or backward) so
that each complex value it can follow is held as its real pair: a tensor
of the real dtype (complex64 -> float32) with one more trailing dim of
size 2, (real, imaginary) -- exactly ``torch.view_as_real``'s layout, so
``view_as_complex``/``view_as_real`` become the identity and a view of a
complex tensor is the same view of the pair with the last dim kept.
Arithmetic becomes real arithmetic on the two parts (a complex multiply:
``ar*br - ai*bi``, ``ar*bi + ai*br``), which Kiln fuses like any other.

Where a complex value meets an op this module has no rule for (an FFT, a
complex matrix product), that op keeps its complex operands: the pair is
viewed back with ``view_as_complex`` (zero-copy: a pair keeps the last dim
contiguous and every other stride even, else it is copied first) and its
complex result is viewed as a pair for whatever follows. Complex graph
inputs and outputs (AOTAutograd saves ``freqs_cis`` for the backward as a
complex tensor) are crossed the same way, so the graph's signature never
changes. Those boundary views run eagerly and carry
``meta["kiln_complex_view"]``; the fallback report does not count them.

Numerics: a complex multiply rounds each product and the sum once each, as
PyTorch's scalar complex multiply does (its vectorized CPU kernel and
CUDA's may contract to FMAs: results agree to float rounding).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
import torch.fx

from .fx_build import NodeBuilder, fake_mode_of
from .fx_graph import op_name

__all__ = ["BOUNDARY", "lower_complex"]

aten = torch.ops.aten

# complex dtype -> the dtype of its parts
_PART_DTYPE = {
    torch.complex32: torch.float16,
    torch.complex64: torch.float32,
    torch.complex128: torch.float64,
}

# The meta key of the boundary views (see the module docstring).
BOUNDARY = "kiln_complex_view"


class _NoRule(Exception):
    """This node stays complex (its reason, for debugging)."""


def _val(a: Any) -> Any:
    return a.meta.get("val") if isinstance(a, torch.fx.Node) else None


def _is_complex(a: Any) -> bool:
    v = _val(a)
    return isinstance(v, torch.Tensor) and v.dtype in _PART_DTYPE


def _same_sizes(a: Any, b: Any) -> bool:
    """Whether two shapes are the same, symbolic sizes by expression
    (without adding a guard)."""
    def key(s: Any) -> Any:
        return str(s.node.expr) if isinstance(s, torch.SymInt) else s
    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b))


class _Lowering:
    """One node's rule context: the builder (inserting before the node),
    the pair of each complex operand, and the node itself."""

    def __init__(self, b: NodeBuilder, node: torch.fx.Node,
                 pair_of: Callable[[torch.fx.Node], torch.fx.Node]) -> None:
        self.b, self.node, self._pair_of = b, node, pair_of

    def pair(self, a: Any) -> torch.fx.Node:
        if not _is_complex(a):
            raise _NoRule("expected a complex tensor operand")
        return self._pair_of(a)

    def rank(self, a: Any) -> int:
        """The complex rank of operand a (its pair has one more dim)."""
        return _val(a).dim()

    def dim(self, d: Any, rank: int) -> int:
        """d normalized against a complex tensor of `rank` dims (Python
        indexing), so it names the same dim of the pair."""
        if not isinstance(d, int):
            raise _NoRule(f"dim {d!r}")
        n = max(rank, 1)
        if not -n <= d < n:
            raise _NoRule(f"dim {d} of rank {rank}")
        return d + n if d < 0 else d

    def parts(self, p: torch.fx.Node) -> List[torch.fx.Node]:
        b = self.b
        return [b(aten.select.int, p, -1, 0), b(aten.select.int, p, -1, 1)]

    def static_shape(self) -> List[int]:
        """The node's sizes, when none is symbolic (a symbolic size is
        not an argument a new node can take: _NoRule)."""
        shape = list(_val(self.node).shape)
        if not all(isinstance(s, int) for s in shape):
            raise _NoRule("symbolic sizes")
        return shape

    def from_parts(self, re: torch.fx.Node, im: torch.fx.Node) -> torch.fx.Node:
        """The pair of re + i*im, at the node's (broadcast) shape."""
        b = self.b
        shape = _val(self.node).shape
        dtype = _PART_DTYPE[_val(self.node).dtype]
        out = []
        for t in (re, im):
            if _val(t).dtype != dtype:
                t = b(aten._to_copy.default, t, dtype=dtype)
            if not _same_sizes(_val(t).shape, shape):
                t = b(aten.expand.default, t, self.static_shape())
            out.append(b(aten.unsqueeze.default, t, -1))
        return b(aten.cat.default, out, -1)

    def real_operand(self, a: Any) -> Any:
        """A real operand broadcast against a pair: a tensor gets a
        trailing dim of 1; a real Python number stays."""
        if isinstance(a, torch.fx.Node):
            v = _val(a)
            if not isinstance(v, torch.Tensor) or v.dtype.is_complex:
                raise _NoRule("operand")
            return self.b(aten.unsqueeze.default, a, -1)
        if isinstance(a, (bool, int, float)):
            return a
        raise _NoRule(f"operand {a!r}")


# -- rules: each returns the pair of the node's complex result, or (for a
# real result) the real node that replaces it ------------------------------

def _view_as_complex(c: _Lowering, x: Any) -> Any:
    if _is_complex(x):
        raise _NoRule("view_as_complex of a complex tensor")
    return x


def _view_as_real(c: _Lowering, z: Any) -> Any:
    return c.pair(z)


def _identity(c: _Lowering, z: Any, *rest: Any, **kwargs: Any) -> Any:
    return c.pair(z)


def _reshape(c: _Lowering, z: Any, shape: Any) -> Any:
    return c.b(c.node.target, c.pair(z), list(shape) + [2])


def _expand(c: _Lowering, z: Any, shape: Any, implicit: bool = False) -> Any:
    return c.b(aten.expand.default, c.pair(z), list(shape) + [2])


def _slice(c: _Lowering, z: Any, dim: int = 0, start: Any = None,
           end: Any = None, step: int = 1) -> Any:
    return c.b(aten.slice.Tensor, c.pair(z), c.dim(dim, c.rank(z)), start,
               end, step)


def _select(c: _Lowering, z: Any, dim: int, index: Any) -> Any:
    return c.b(aten.select.int, c.pair(z), c.dim(dim, c.rank(z)), index)


def _unsqueeze(c: _Lowering, z: Any, dim: int) -> Any:
    return c.b(aten.unsqueeze.default, c.pair(z),
               c.dim(dim, c.rank(z) + 1))


def _squeeze(c: _Lowering, z: Any, dims: Any = None) -> Any:
    if dims is None:
        shape = _val(z).shape
        if not all(isinstance(s, int) for s in shape):
            raise _NoRule("squeeze of symbolic sizes")
        dims = [d for d, s in enumerate(shape) if s == 1]
    elif isinstance(dims, int):
        dims = [dims]
    dims = [c.dim(d, c.rank(z)) for d in dims]
    return c.b(aten.squeeze.dims, c.pair(z), dims)


def _permute(c: _Lowering, z: Any, dims: Any) -> Any:
    r = c.rank(z)
    return c.b(aten.permute.default, c.pair(z),
               [c.dim(d, r) for d in dims] + [r])


def _transpose(c: _Lowering, z: Any, d0: int, d1: int) -> Any:
    r = c.rank(z)
    return c.b(aten.transpose.int, c.pair(z), c.dim(d0, r), c.dim(d1, r))


def _t(c: _Lowering, z: Any) -> Any:
    return c.b(aten.transpose.int, c.pair(z), 0, 1) if c.rank(z) == 2 \
        else c.pair(z)


def _clone(c: _Lowering, z: Any, memory_format: Any = None) -> Any:
    return c.b(aten.clone.default, c.pair(z))


def _conj(c: _Lowering, z: Any) -> Any:
    re, im = c.parts(c.pair(z))
    return c.from_parts(re, c.b(aten.neg.default, im))


def _neg(c: _Lowering, z: Any) -> Any:
    return c.b(aten.neg.default, c.pair(z))


def _add_sub(c: _Lowering, a: Any, b: Any, alpha: Any = 1) -> Any:
    op = c.node.target
    if _is_complex(a) and _is_complex(b):
        return c.b(op, c.pair(a), c.pair(b), alpha=alpha) if alpha != 1 \
            else c.b(op, c.pair(a), c.pair(b))
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise _NoRule("alpha")
    # One side real: it moves the real part only.
    if _is_complex(a):
        re, im = c.parts(c.pair(a))
        re = c.b(op, re, b, alpha=alpha) if alpha != 1 else c.b(op, re, b)
        return c.from_parts(re, im)
    re, im = c.parts(c.pair(b))
    sign = 1 if op_name(op) == "aten.add.Tensor" else -1
    scaled_re = c.b(aten.mul.Tensor, re, alpha * sign)
    scaled_im = c.b(aten.mul.Tensor, im, alpha * sign)
    return c.from_parts(c.b(aten.add.Tensor, scaled_re, a), scaled_im)


def _mul(c: _Lowering, a: Any, b: Any) -> Any:
    if _is_complex(a) and _is_complex(b):
        ar, ai = c.parts(c.pair(a))
        br, bi = c.parts(c.pair(b))
        m = lambda x, y: c.b(aten.mul.Tensor, x, y)  # noqa: E731
        re = c.b(aten.sub.Tensor, m(ar, br), m(ai, bi))
        im = c.b(aten.add.Tensor, m(ar, bi), m(ai, br))
        return c.from_parts(re, im)
    z, r = (a, b) if _is_complex(a) else (b, a)
    return c.b(aten.mul.Tensor, c.pair(z), c.real_operand(r))


def _mul_div_scalar(c: _Lowering, z: Any, s: Any) -> Any:
    s = _complex_value(s)
    div = op_name(c.node.target) == "aten.div.Scalar"
    if s.imag == 0:  # (divided as eager divides, not by a reciprocal)
        return c.b(aten.div.Tensor if div else aten.mul.Tensor, c.pair(z),
                   s.real)
    if div:
        s = 1 / s
    re, im = c.parts(c.pair(z))
    m = lambda x, y: c.b(aten.mul.Tensor, x, y)  # noqa: E731
    return c.from_parts(c.b(aten.sub.Tensor, m(re, s.real), m(im, s.imag)),
                        c.b(aten.add.Tensor, m(re, s.imag), m(im, s.real)))


def _div(c: _Lowering, a: Any, b: Any) -> Any:
    if not _is_complex(a) or _is_complex(b):
        raise _NoRule("division by a complex value")
    return c.b(aten.div.Tensor, c.pair(a), c.real_operand(b))


# sum and mean over complex dims: the same reduction over the pair's dims.
_REDUCTIONS = {"aten.sum.dim_IntList": aten.sum.dim_IntList,
               "aten.mean.default": aten.mean.dim,
               "aten.mean.dim": aten.mean.dim}


def _reduce(c: _Lowering, z: Any, dims: Any = None, keepdim: bool = False,
            dtype: Any = None) -> Any:
    if dtype is not None:
        raise _NoRule("a reduction with a dtype")
    r = c.rank(z)
    dims = list(range(r)) if not dims else [c.dim(d, r) for d in dims]
    return c.b(_REDUCTIONS[op_name(c.node.target)], c.pair(z), dims, keepdim)


def _slice_scatter(c: _Lowering, z: Any, src: Any, dim: int = 0,
                   start: Any = None, end: Any = None, step: int = 1) -> Any:
    return c.b(aten.slice_scatter.default, c.pair(z), c.pair(src),
               c.dim(dim, c.rank(z)), start, end, step)


def _select_scatter(c: _Lowering, z: Any, src: Any, dim: int,
                    index: Any) -> Any:
    return c.b(aten.select_scatter.default, c.pair(z), c.pair(src),
               c.dim(dim, c.rank(z)), index)


def _complex_value(v: Any) -> complex:
    if isinstance(v, bool) or not isinstance(v, (int, float, complex)):
        raise _NoRule(f"value {v!r}")
    return complex(v)


def _creation_kwargs(c: _Lowering) -> Dict[str, Any]:
    val = _val(c.node)
    return {"dtype": _PART_DTYPE[val.dtype], "device": val.device}


def _full(c: _Lowering, size: Any, value: Any, **kwargs: Any) -> Any:
    v, kw = _complex_value(value), _creation_kwargs(c)
    return c.from_parts(c.b(aten.full.default, list(size), v.real, **kw),
                        c.b(aten.full.default, list(size), v.imag, **kw))


def _scalar_tensor(c: _Lowering, value: Any, **kwargs: Any) -> Any:
    v, kw = _complex_value(value), _creation_kwargs(c)
    return c.from_parts(c.b(aten.scalar_tensor.default, v.real, **kw),
                        c.b(aten.scalar_tensor.default, v.imag, **kw))


def _cat(c: _Lowering, tensors: Any, dim: int = 0) -> Any:
    if not all(_is_complex(t) for t in tensors):
        raise _NoRule("cat of complex and real tensors")
    return c.b(aten.cat.default, [c.pair(t) for t in tensors],
               c.dim(dim, c.rank(tensors[0])))


def _where(c: _Lowering, cond: Any, a: Any, b: Any) -> Any:
    if not (_is_complex(a) and _is_complex(b)):
        raise _NoRule("where of complex and real values")
    return c.b(aten.where.self, c.b(aten.unsqueeze.default, cond, -1),
               c.pair(a), c.pair(b))


def _polar(c: _Lowering, magnitude: Any, angle: Any) -> Any:
    b = c.b
    return c.from_parts(
        b(aten.mul.Tensor, magnitude, b(aten.cos.default, angle)),
        b(aten.mul.Tensor, magnitude, b(aten.sin.default, angle)))


def _complex(c: _Lowering, re: Any, im: Any) -> Any:
    return c.from_parts(re, im)


def _real(c: _Lowering, z: Any) -> Any:
    return c.b(aten.select.int, c.pair(z), -1, 0)


def _imag(c: _Lowering, z: Any) -> Any:
    return c.b(aten.select.int, c.pair(z), -1, 1)


def _abs(c: _Lowering, z: Any) -> Any:
    re, im = c.parts(c.pair(z))
    sq = c.b(aten.add.Tensor, c.b(aten.mul.Tensor, re, re),
             c.b(aten.mul.Tensor, im, im))
    return c.b(aten.sqrt.default, sq)


def _to_copy(c: _Lowering, z: Any, dtype: Any = None, **kwargs: Any) -> Any:
    device = kwargs.get("device")
    if device not in (None, _val(c.node).device) or kwargs.get(
            "memory_format") not in (
            None, torch.preserve_format, torch.contiguous_format):
        raise _NoRule("a copy to another device or layout")
    out = _val(c.node).dtype
    if out not in _PART_DTYPE:
        raise _NoRule("a copy from complex to real")
    if _is_complex(z):
        return c.b(aten._to_copy.default, c.pair(z), dtype=_PART_DTYPE[out])
    # Real to complex: the imaginary part is zero.
    return c.from_parts(z, c.b(aten.full.default, c.static_shape(), 0.0,
                               **_creation_kwargs(c)))


_RULES: Dict[str, Callable[..., Any]] = {
    "aten.view_as_complex.default": _view_as_complex,
    "aten.view_as_real.default": _view_as_real,
    "aten.alias.default": _identity,
    "aten.resolve_conj.default": _identity,
    "aten.resolve_neg.default": _identity,
    "aten.view.default": _reshape,
    "aten._unsafe_view.default": _reshape,
    "aten.reshape.default": _reshape,
    "aten.expand.default": _expand,
    "aten.slice.Tensor": _slice,
    "aten.select.int": _select,
    "aten.unsqueeze.default": _unsqueeze,
    "aten.squeeze.default": _squeeze,
    "aten.squeeze.dim": _squeeze,
    "aten.squeeze.dims": _squeeze,
    "aten.permute.default": _permute,
    "aten.transpose.int": _transpose,
    "aten.t.default": _t,
    "aten.clone.default": _clone,
    "aten._conj.default": _conj,
    "aten.conj_physical.default": _conj,
    "aten.neg.default": _neg,
    "aten.add.Tensor": _add_sub,
    "aten.sub.Tensor": _add_sub,
    "aten.mul.Tensor": _mul,
    "aten.div.Tensor": _div,
    "aten.mul.Scalar": _mul_div_scalar,
    "aten.div.Scalar": _mul_div_scalar,
    "aten.sum.dim_IntList": _reduce,
    "aten.mean.default": _reduce,
    "aten.mean.dim": _reduce,
    "aten.slice_scatter.default": _slice_scatter,
    "aten.select_scatter.default": _select_scatter,
    "aten.full.default": _full,
    "aten.scalar_tensor.default": _scalar_tensor,
    "aten.cat.default": _cat,
    "aten.where.self": _where,
    "aten.polar.default": _polar,
    "aten.complex.default": _complex,
    "aten.real.default": _real,
    "aten.imag.default": _imag,
    "aten.abs.default": _abs,
    "aten._to_copy.default": _to_copy,
}


def _touches_complex(node: torch.fx.Node) -> bool:
    return _is_complex(node) or any(_is_complex(a)
                                    for a in node.all_input_nodes)


def _viewable_as_complex(pair: Any) -> bool:
    """Whether view_as_complex takes this pair without a copy."""
    v = _val(pair)
    return (isinstance(v, torch.Tensor) and v.dim() >= 1 and
            v.stride()[-1] == 1 and v.storage_offset() % 2 == 0 and
            all(s % 2 == 0 for s in v.stride()[:-1]))


def _restrided(b: NodeBuilder, p: torch.fx.Node, want: Any) -> torch.fx.Node:
    """p laid out with strides `want` (same sizes) where those are a dense
    layout in another dim order: permute, a contiguous clone, permute
    back (Kiln writes the clone in that order; the views are free).
    Otherwise (equal already, symbolic, or not dense) p itself."""
    v = _val(p)
    have, sizes = tuple(v.stride()), tuple(v.shape)
    want = tuple(want)
    if have == want or len(want) != len(sizes) or not all(
            isinstance(x, int) for x in sizes + want):
        return p
    perm = sorted(range(len(want)), key=lambda d: (-want[d], -sizes[d]))
    expect = 1
    for d in reversed(perm):
        if sizes[d] != 1 and want[d] != expect:
            return p
        expect *= sizes[d]
    inverse = [perm.index(d) for d in range(len(perm))]
    q = b(aten.clone.default, b(aten.permute.default, p, perm),
          memory_format=torch.contiguous_format)
    return b(aten.permute.default, q, inverse)


def lower_complex(gm: torch.fx.GraphModule) -> int:
    """Rewrites gm's complex values as pairs where a rule covers them
    (module docstring). Returns how many nodes it lowered (0: gm is
    unchanged). Never raises for a node it cannot lower: that node keeps
    its complex operands."""
    graph = gm.graph
    if not any(_touches_complex(n) for n in graph.nodes):
        return 0
    fake_mode = fake_mode_of(graph)
    if fake_mode is None:
        return 0
    b = NodeBuilder(graph, None, fake_mode)
    boundary = NodeBuilder(graph, None, fake_mode, {BOUNDARY: True})
    pairs: Dict[torch.fx.Node, torch.fx.Node] = {}
    lowered: List[torch.fx.Node] = []  # complex results, held as pairs
    replaced: Dict[torch.fx.Node, torch.fx.Node] = {}  # real results
    after_inputs = next(n for n in graph.nodes if n.op != "placeholder")

    def after(n: torch.fx.Node) -> torch.fx.Node:
        """Where a node computed from n alone goes."""
        return after_inputs if n.op == "placeholder" else n.next

    def pair_of(z: torch.fx.Node) -> torch.fx.Node:
        """z's pair: lowered already, or a view of the complex tensor z
        (a graph input, or the result of an op that stayed complex)."""
        if z not in pairs:
            boundary.where = after(z)
            pairs[z] = boundary(aten.view_as_real.default, z)
        return pairs[z]

    for node in list(graph.nodes):
        if node.op != "call_function" or node.meta.get(BOUNDARY) or \
                not _touches_complex(node):
            continue
        rule = _RULES.get(op_name(node.target))
        if rule is None:
            continue
        b.where = node
        start = len(b.made)
        try:
            result = rule(_Lowering(b, node, pair_of), *node.args,
                          **node.kwargs)
        except Exception:  # noqa: BLE001 (_NoRule, or a fake kernel's error)
            for n in reversed(b.made[start:]):
                graph.erase_node(n)
            del b.made[start:]
            continue
        if _is_complex(node):
            pairs[node] = result
            lowered.append(node)
        else:
            replaced[node] = result

    # Readers that stayed complex (ops without a rule, the graph's outputs)
    # read each lowered value as a complex view of its pair.
    # They get the strides the traced graph gave the value (what a graph
    # output saved for the backward was compiled for there).
    gone = set(lowered) | set(replaced)
    for node, result in replaced.items():
        users = [u for u in node.users if u not in gone]
        if users:
            boundary.where = after(result)
            laid = _restrided(boundary, result, _val(node).stride())
            for u in users:
                u.replace_input_with(node, laid)
        node.replace_all_uses_with(result)
    for node in reversed(lowered):
        users = [u for u in node.users if u not in gone]
        if users:
            p = pairs[node]
            boundary.where = after(p)
            p = _restrided(boundary, p,
                           [2 * s for s in _val(node).stride()] + [1])
            if not _viewable_as_complex(p):
                p = boundary(aten.clone.default, p,
                             memory_format=torch.contiguous_format)
            z = boundary(aten.view_as_complex.default, p)
            for u in users:
                u.replace_input_with(node, z)
    for node in reversed(list(graph.nodes)):
        if node in gone:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return len(lowered) + len(replaced)
