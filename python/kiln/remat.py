"""A norm's output recomputed in the backward instead of saved.

AOTAutograd's default partitioner saves every forward value the backward
reads. After a group, layer or batch norm, the backward usually reads the
norm's output y (a SiLU's or a square's derivative) and, for the norm's own
backward, its input x and the statistics mean and rstd. Saving y then costs
a write of the whole tensor in the forward and a read in the backward,
though y is one pointwise expression of values the backward has anyway:

    y = (x - mean) * rstd * weight + bias

``rematerialize_norm_outputs`` rewrites the joint graph so that the
backward's readers of y read that expression instead, placed in the
backward; y is then not saved, and the expression fuses into the
backward's kernels (which read x already). It is Inductor's min-cut
partitioner's choice for this pattern, made without its recomputation of
anything else (``kiln.backend(recompute=True)`` is that).

A norm's output is recomputed only where it costs nothing to save the
expression's inputs and nothing to compute it:
- its input and statistics are saved anyway (the norm's backward reads
  them) or are graph inputs, and its weight and bias are graph inputs,
  small, or absent;
- float32 throughout (a float32 norm of half inputs rounds y, which
  recomputed would round again);
- static channels and groups for group norm (its batch may be symbolic);
- no backward reader of y reaches a matrix product, convolution or
  attention, directly or through views: those read y from memory, so it
  would be written in the backward instead of the forward;
- no backward reader compares y (a comparison must read the forward's own
  bits; see ``dynamo.recompute_partition``).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, Optional, Sequence, Set

import torch

from .fx_build import NodeBuilder
from .fx_graph import COMPARISON_OPS, op_name
from .partition import VIEW_OPS

__all__ = ["kiln_default_partition", "rematerialize_norm_outputs"]

aten = torch.ops.aten

# Norms in training graphs: op -> (index of weight, index of bias).
_NORMS: Dict[str, Any] = {
    "aten.native_group_norm.default": (1, 2),
    "aten.native_layer_norm.default": (2, 3),
    "aten._native_batch_norm_legit_functional.default": (1, 2),
    "aten._native_batch_norm_legit.default": (1, 2),
    "aten._native_batch_norm_legit.no_stats": (1, 2),
    "aten.native_batch_norm.default": (1, 2),
}

# Batch norms: the index of `training` (statistics of the batch only then).
_TRAINING = {
    "aten._native_batch_norm_legit_functional.default": 5,
    "aten._native_batch_norm_legit.default": 5,
    "aten._native_batch_norm_legit.no_stats": 3,
    "aten.native_batch_norm.default": 5,
}

# Backward readers that read y from memory whatever Kiln fuses.
_LIBRARY_CALL_WORDS = ("mm", "convolution", "_scaled_dot_product",
                       "_efficient_attention", "_flash_attention",
                       "_cudnn_attention")

# Readers that compare y, or pick elements of it by their values.
_COMPARISONS = COMPARISON_OPS | frozenset({
    "aten.threshold_backward.default", "aten.maximum.default",
    "aten.minimum.default", "aten.max.dim", "aten.min.dim",
    "aten.amax.default", "aten.amin.default", "aten.argmax.default",
    "aten.argmin.default", "aten.sort.default", "aten.topk.default",
})

# Pointwise ops a norm's output may pass through and still be recomputed
# (their other operands scalars, or tensors saved anyway or small).
_CHAIN_OPS = frozenset({
    "aten.silu.default", "aten.gelu.default", "aten.sigmoid.default",
    "aten.tanh.default", "aten.mul.Tensor", "aten.mul.Scalar",
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor",
    "aten.div.Tensor", "aten.div.Scalar", "aten.neg.default",
    "aten.pow.Tensor_Scalar", "aten.hardswish.default", "aten.mish.default",
})

# Statistics or weights at most this share of y's elements count as small.
_SMALL_SHARE = 8


def _forward_nodes(graph: torch.fx.Graph, num_fwd_outputs: int) -> Set[Any]:
    """The nodes the forward outputs need (what the default partitioner
    puts in the forward, by data flow or, in newer torch, by place)."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    outputs = out.args[0]
    todo = [a for a in outputs[:num_fwd_outputs] if isinstance(a, torch.fx.Node)]
    seen: Set[Any] = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    for n in graph.nodes:
        if n.meta.get("partitioner_tag") == "is_forward" or n.op == "placeholder":
            seen.add(n)
    return seen


def _numel(node: Any) -> Optional[int]:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    # A symbolic count is unknown here: int() of it would guard the graph
    # on its value (a recompile per size).
    numel = val.numel()
    return numel if isinstance(numel, int) else None


def _is_float32(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def _reads_from_memory(node: Any, forward: Set[Any]) -> bool:
    """Whether a backward reader of `node`, through views, is a library
    call, a comparison or something other than an op (an output)."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        for user in n.users:
            if user in forward or user in seen:
                continue
            seen.add(user)
            if user.op != "call_function":
                return True
            name = op_name(user.target)
            if name in _COMPARISONS or any(w in name for w in _LIBRARY_CALL_WORDS):
                return True
            if name in VIEW_OPS:
                todo.append(user)
    return False


def _unsqueezed(b: NodeBuilder, node: Any, times: int) -> Any:
    for _ in range(times):
        node = b(aten.unsqueeze.default, node, -1)
    return node


def _expression(b: NodeBuilder, name: str, norm: Any, x: Any, mean: Any,
                rstd: Any, weight: Any, bias: Any) -> Optional[Any]:
    """y as ATen nodes of x and the statistics, or None where the sizes it
    needs are not static."""
    shape = list(x.meta["val"].shape)
    if name == "aten.native_group_norm.default":
        # Per channel: (N, G) -> (N, G, C/G) -> (N, C), then broadcast over
        # the positions (a load of the group's value by channel index; a
        # view of x would cost every load an index division).
        # The channels and groups are static; the batch is left to the
        # statistics' own size (-1: no guard on a symbolic batch).
        _, c, _, group = norm.args[3:7]
        if not (isinstance(c, int) and isinstance(group, int)) or \
                len(shape) < 2 or c % group:
            return None

        def by_channel(stat: Any) -> Any:
            stat = b(aten.expand.default, _unsqueezed(b, stat, 1),
                     [-1, group, c // group])
            return _unsqueezed(b, b(aten.reshape.default, stat, [-1, c]),
                               len(shape) - 2)

        t = b(aten.mul.Tensor, b(aten.sub.Tensor, x, by_channel(mean)),
              by_channel(rstd))
        per_channel = len(shape) - 2
    elif name == "aten.native_layer_norm.default":
        t = b(aten.mul.Tensor, b(aten.sub.Tensor, x, mean), rstd)
        per_channel = 0
    else:
        if len(shape) < 2:
            return None
        per_channel = len(shape) - 2
        t = b(aten.mul.Tensor,
              b(aten.sub.Tensor, x, _unsqueezed(b, mean, per_channel)),
              _unsqueezed(b, rstd, per_channel))
    if weight is not None:
        t = b(aten.mul.Tensor, t, _unsqueezed(b, weight, per_channel))
    if bias is not None:
        t = b(aten.add.Tensor, t, _unsqueezed(b, bias, per_channel))
    return t


def _last_forward(graph: torch.fx.Graph, forward: Set[Any]) -> Any:
    """The node after the forward's last one: where the backward's
    expressions go (inputs all before it, every reader after it)."""
    last = None
    for n in graph.nodes:
        if n in forward:
            last = n
    return last.next


def rematerialize_norm_outputs(joint: torch.fx.GraphModule,
                               num_fwd_outputs: int) -> int:
    """Rewrites `joint` (AOTAutograd's joint forward-backward graph) so that
    the backward reads each eligible norm's output, and the pointwise
    values of it that the backward reads (a SiLU after a group norm), as
    expressions of the norm's input and statistics (module docstring).
    Returns how many values it rewrote. The graph stays valid whether or
    not any is."""
    graph = joint.graph
    forward = _forward_nodes(graph, num_fwd_outputs)
    # The expressions go before the node after the forward's last one. A
    # backward node can come before that in the joint graph (AOTAutograd
    # traced it early): it keeps reading the saved value.
    start = _last_forward(graph, forward)
    after_start: Set[Any] = set()
    seen = False
    for n in graph.nodes:
        seen = seen or n is start
        if seen:
            after_start.add(n)
    b: Optional[NodeBuilder] = None
    again: Dict[Any, Any] = {}  # forward value -> the backward's expression

    def read_by_backward(v: Any) -> bool:
        """Whether the backward reads v, or a view of it (AOTAutograd saves
        a norm's statistics as alias nodes)."""
        return any(u not in forward or
                   (u.op == "call_function" and op_name(u.target) in VIEW_OPS
                    and read_by_backward(u)) for u in v.users)

    def saved(v: Any, size: Optional[int]) -> bool:
        """Saved anyway, a graph input or small (against `size`)."""
        if v.op == "placeholder" or read_by_backward(v):
            return True
        numel = _numel(v)
        return numel is not None and size is not None and \
            numel * _SMALL_SHARE <= size

    def builder(like: Any) -> Optional[NodeBuilder]:
        nonlocal b
        if b is None:
            fake_mode = getattr(like.meta.get("val"), "fake_mode", None)
            if fake_mode is not None:
                b = NodeBuilder(graph, start, fake_mode,
                                {"partitioner_tag": "is_backward"})
        return b

    for node in list(graph.nodes):
        if node.op != "call_function" or node not in forward:
            continue
        name = op_name(node.target)
        if name not in _NORMS and not (
                name in _CHAIN_OPS and any(a in again for a in node.args)):
            continue
        made = len(b.made) if b is not None else 0
        try:
            value = (_norm(node, name, forward, saved, builder)
                     if name in _NORMS else
                     _chain(node, forward, saved, builder, again))
        except Exception:  # noqa: BLE001 (a value fake tensors refuse:
            value = None   # keep saving it, never fail the user's graph)
        if value is None:
            if b is not None:  # what this attempt built and left unread
                for n in reversed(b.made[made:]):
                    if not n.users:
                        graph.erase_node(n)
                del b.made[made:]
            continue
        y, expression = value
        again[y] = expression
        for user in [u for u in y.users if u not in forward and
                     u is not expression and u in after_start]:
            user.replace_input_with(y, expression)
    if again:
        graph.lint()
        joint.recompile()
    return len(again)


def _norm(norm: Any, name: str, forward: Set[Any], saved: Callable[..., bool],
          builder: Callable[[Any], Optional[NodeBuilder]]) -> Optional[Any]:
    """(y, y's expression in the backward) of an eligible norm, else None."""
    at = _TRAINING.get(name)
    if at is not None and (len(norm.args) <= at or norm.args[at] is not True):
        return None
    outs: Dict[int, Any] = {}
    for user in norm.users:
        if user.target is operator.getitem:
            outs.setdefault(user.args[1], user)
    y, mean, rstd = outs.get(0), outs.get(1), outs.get(2)
    if y is None or mean is None or rstd is None:
        return None
    if not any(u not in forward for u in y.users) or \
            _reads_from_memory(y, forward):
        return None
    x = norm.args[0]
    w_at, b_at = _NORMS[name]
    weight = norm.args[w_at] if len(norm.args) > w_at else None
    bias = norm.args[b_at] if len(norm.args) > b_at else None
    size = _numel(y)
    if not all(_is_float32(v) for v in (x, y, mean, rstd)) or \
            not all(saved(v, size) for v in (x, mean, rstd)):
        return None
    if any(v is not None and (not isinstance(v, torch.fx.Node) or
                              not _is_float32(v) or not saved(v, size))
           for v in (weight, bias)):
        return None
    b = builder(y)
    if b is None:
        return None
    expression = _expression(b, name, norm, x, mean, rstd, weight, bias)
    return None if expression is None else (y, expression)


def _chain(node: Any, forward: Set[Any], saved: Callable[..., bool],
           builder: Callable[[Any], Optional[NodeBuilder]],
           again: Dict[Any, Any]) -> Optional[Any]:
    """(node, its expression in the backward) for a pointwise op of an
    expression (a SiLU of a norm's output) that the backward reads, its
    other tensor operands saved anyway or small; else None."""
    if node.kwargs or not any(u not in forward for u in node.users) or \
            not _is_float32(node) or _reads_from_memory(node, forward):
        return None
    size = _numel(node)
    args = []
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            if a in again:
                a = again[a]
            elif not _is_float32(a) or not saved(a, size):
                return None
        elif not isinstance(a, (int, float, bool)):
            return None
        args.append(a)
    b = builder(node)
    return None if b is None else (node, b(node.target, *args))


def kiln_default_partition(joint_module: torch.fx.GraphModule,
                           joint_inputs: Sequence[Any], *,
                           num_fwd_outputs: int, **kwargs: Any) -> Any:
    """AOTAutograd's default partitioner after rematerialize_norm_outputs:
    the Kiln backend's partition_fn (recompute=False)."""
    from torch._functorch.partitioners import default_partition  # noqa: PLC0415

    rematerialize_norm_outputs(joint_module, num_fwd_outputs)
    _fill_tensor_meta(joint_module)
    return default_partition(joint_module, joint_inputs,
                             num_fwd_outputs=num_fwd_outputs, **kwargs)


def _fill_tensor_meta(gm: torch.fx.GraphModule) -> None:
    """Gives each tensor-valued call_function node without "tensor_meta"
    one from its fake value. torch 2.6's default_partition takes a node
    without it for a tuple-valued one whose users must all be getitems,
    and asserts; some nodes of its own joint graphs under dynamic shapes
    lack it (a causal attention's scale computed from a symbolic head
    dim: scalar_tensor, div, pow, mul). Newer torch looks at "val"."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata  # noqa: PLC0415

    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if (node.op == "call_function" and "tensor_meta" not in node.meta
                and isinstance(val, torch.Tensor)):
            node.meta["tensor_meta"] = _extract_tensor_metadata(val)
