"""Partitioning an AOTAutograd graph by what Kiln compiles.

KilnOperatorSupport says, per FX node, whether Kiln runs it: an ATen
overload in Kiln's op set (kiln.supported_ops(), the op registry of the
client library, which is kilnd's when both come from one build), with
arguments and results Kiln's graph format can say (kiln/fx_graph.py);
``getitem`` and views count as supported. Each node it refuses gets a
reason, which the fallback report (kiln/dynamo.py) counts per op.

partition() runs torch's CapabilityBasedPartitioner with it: supported
regions become submodules ``kiln_0``, ``kiln_1``, ... (one Kiln compile
each). Where it supports every node (most graphs of real models) the
partition is the whole graph, which is what the partitioner would find,
without it: its proposal walks every node's downstream set and took 3.3 of
a warm DenseNet-121 step's 24 s under cProfile on the 2-core box. Views go
in with their partition: one that only feeds it is read in place, one of a
value it computes that leaves it is written in that shape or layout
directly, and one of its input (or one Kiln need not write: an expand, a
view of a value it returns anyway) is returned as a view of that tensor
(fx_graph.ViewOutput), as eager's view would be; partitions of views alone
are dropped.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Mapping, Tuple

import torch
import torch.fx
from torch.fx.node import _get_qualified_name
from torch.fx.passes.infra.partitioner import (CapabilityBasedPartitioner,
                                               Partition)
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.fx.passes.operator_support import OperatorSupportBase

from .fx_graph import (AS_STRIDED_OPS, IDENTITY_OPS, SLICE_OPS, Unsupported,
                       as_strided_view, check_node_args, graph_device,
                       op_name, schema_args, slice_to_the_end)

__all__ = ["KilnOperatorSupport", "PartitionResult", "graph_device",
           "partition", "symbolic_window_op", "VIEW_OPS"]

# Ops that only re-index or copy their input (no compute): not worth a
# partition of their own.
VIEW_OPS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.permute.default", "aten.expand.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default",
    "aten.slice.Tensor", "aten.select.int", "aten.alias.default",
    "aten.t.default", "aten.transpose.int", "aten.clone.default",
    "aten.as_strided.default", "aten.expand_copy.default",
})

# Ops whose lowering needs some trailing dims of input 0 static (their
# windows are laid out at compile time): refused when those are symbolic.
_STATIC_TRAILING_DIMS = {
    "aten.max_pool2d_with_indices.default": 2,
    "aten.max_pool2d_with_indices_backward.default": 2,
    "aten.avg_pool2d.default": 2,
    "aten.avg_pool2d_backward.default": 2,
    "aten._adaptive_avg_pool2d.default": 2,
    "aten._adaptive_avg_pool2d_backward.default": 2,
}

# Convolutions lay out their windows at compile time: the batch may be
# symbolic, the channels and spatial sizes of every tensor must be static.
_CONV_OPS = frozenset({
    "aten.convolution.default", "aten.convolution_backward.default",
})


def symbolic_window_op(gm: torch.fx.GraphModule) -> "str | None":
    """A convolution or pooling of gm whose input has a symbolic size past
    its batch dim (an op the partitioner would leave to eager: Kiln lays
    its windows out at compile time), or None. dynamo.SpecializedGraph
    compiles such a graph per concrete size instead."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not node.args:
            continue
        name = op_name(node.target)
        if name not in _CONV_OPS and name not in _STATIC_TRAILING_DIMS:
            continue
        arg = node.args[0]
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and any(
                isinstance(d, torch.SymInt) for d in val.shape[1:]):
            return name
    return None


# Scatters that replace (scatter, index_put without accumulate), and
# cumsum, are quadratic reductions on CUDA in Kiln (cumsum in blocks of
# about sqrt(n) along rows longer than 64; gather_scatter_lowering.cc):
# compiled there only when every size is static (the work is then
# bounded). Accumulating ones
# (embedding_dense_backward, scatter_add, index_put with accumulate), and
# every scatter and cumsum on the CPU, are linear and take any sizes.
_SCATTER_OPS = frozenset({
    "aten.scatter.src", "aten.scatter.value", "aten.index_put.default",
    "aten.cumsum.default",
})


# Sorts are quadratic in the sorted dim's size in Kiln (sort_lowering.cc):
# compiled only when that size is static and at most graph/ops/sort.h's
# kMaxSortSize (kilnd refuses the others; saying so here saves a retry).
_SORT_OPS = frozenset({
    "aten.sort.default", "aten.sort.stable", "aten.topk.default",
})
_MAX_SORT_SIZE = 4096


# Slices (fx_graph.SLICE_OPS): on a symbolic dim Kiln takes bounds that
# are polynomials (graph/ops/indexing.h, SymbolicSlice): step 1, start/end
# in [-2, 2] or no end (or an end that is the dim's size), never clamped, a
# length never negative (slice_scatter: never below 1).


def _slice_reason(node: torch.fx.Node, name: str,
                  self_val: torch.Tensor) -> "str | None":
    """Why Kiln cannot take a slice over a symbolic dim, or None."""
    dim_i, start_i, end_i, step_i = SLICE_OPS[name]
    args = slice_to_the_end(node, schema_args(node))
    dim, start, end, step = (args[dim_i], args[start_i], args[end_i],
                             args[step_i])
    if not all(v is None or isinstance(v, int) for v in (dim, start, end, step)):
        return None  # refused by the argument check
    dim = dim or 0
    if not -self_val.dim() <= dim < self_val.dim():
        return None
    size = self_val.shape[dim]
    if not isinstance(size, torch.SymInt) or size.node.expr.is_Integer:
        return None
    why = (f"a slice of symbolic dim {dim} ({size.node.expr}) with start="
           f"{start} end={end} step={step} (Kiln takes step 1, start and end "
           "in [-2, 2] or no end, on a dim that is one symbol)")
    if not size.node.expr.is_Symbol or (step or 1) != 1:
        return why

    def bound(b: int) -> "Tuple[int, int] | None":  # (coeff of n, constant)
        if 0 <= b <= 2:
            return (0, b)
        if -2 <= b < 0:
            return (1, b)
        return None

    s = bound(start or 0)
    e = (1, 0) if end is None or end >= 2**62 else bound(end)
    if s is None or e is None:
        return why
    a, c = e[0] - s[0], e[1] - s[1]  # length = a * n + c, n >= 2
    least = 1 if name == "aten.slice_scatter.default" else 0
    if a < 0 or 2 * a + c < least:
        return why
    return None


def _sort_reason(node: torch.fx.Node, self_val: torch.Tensor) -> "str | None":
    """Why Kiln cannot sort along this node's dim, or None."""
    names = [a.name for a in node.target._schema.arguments]
    dim = schema_args(node)[names.index("dim")]
    rank = self_val.dim()
    if not isinstance(dim, int) or rank == 0 or not -rank <= dim < rank:
        return None
    size = self_val.shape[dim]
    limit = (f"Kiln's sort is quadratic in that size and compiles static "
             f"sizes up to {_MAX_SORT_SIZE}")
    if isinstance(size, torch.SymInt) and not size.node.expr.is_Integer:
        return f"sorts along symbolic dim {dim} ({size.node.expr}): {limit}"
    if int(size) > _MAX_SORT_SIZE:
        return f"sorts along dim {dim} of size {int(size)}: {limit}"
    return None


def _shape_reason(node: torch.fx.Node, name: str) -> "str | None":
    """Why Kiln cannot take this node for its input's sizes, or None."""
    inputs = [a.meta.get("val") for a in node.all_input_nodes]
    first = inputs[0] if inputs else None
    if not isinstance(first, torch.Tensor):
        return None
    if name in SLICE_OPS:
        why = _slice_reason(node, name, node.args[0].meta.get("val"))
        if why is not None:
            return why
    if name in _SORT_OPS:
        why = _sort_reason(node, first)
        if why is not None:
            return why
    if name in AS_STRIDED_OPS:
        as_strided_view(node)  # raises Unsupported with the reason
    accumulates = name == "aten.index_put.default" and (
        node.args[3] if len(node.args) > 3 else
        node.kwargs.get("accumulate", False)) is True
    if name in _SCATTER_OPS and not accumulates and \
            first.device.type == "cuda":
        out = node.meta.get("val")
        if any(isinstance(t, torch.Tensor) and
               any(isinstance(d, torch.SymInt) for d in t.shape)
               for t in inputs + [out]):
            what = "cumsum" if name == "aten.cumsum.default" else \
                "a scatter that replaces"
            return (f"{what}, over symbolic sizes (Kiln's are reductions "
                    "on CUDA, compiled only for static sizes)")
    if name in _CONV_OPS and any(
            isinstance(t, torch.Tensor) and
            any(isinstance(s, torch.SymInt) for s in t.shape[1:])
            for t in inputs):
        return ("needs its channels and spatial sizes static (the batch may "
                "be symbolic)")
    trailing = _STATIC_TRAILING_DIMS.get(name)
    if trailing and any(isinstance(s, torch.SymInt)
                        for s in first.shape[-trailing:]):
        return f"needs its input's last {trailing} dims static"
    return None


class KilnOperatorSupport(OperatorSupportBase):
    """Supported: call_function nodes of Kiln's ops (and getitem) whose
    arguments Kiln's graph format can hold, except those named in
    `excluded` (FX node name -> reason: kilnd refused them before).
    `reasons` maps each refused node to why."""

    def __init__(self, ops: FrozenSet[str],
                 excluded: Mapping[str, str] = {},  # noqa: B006
                 device: "torch.device | None" = None,
                 eager_ops: Mapping[str, str] = {}  # noqa: B006
                 ) -> None:
        super().__init__()
        self.ops = ops
        # Op name -> why: ops of Kiln's set that this compile runs eagerly
        # (the random ops under kiln.backend(eager_random=True)).
        self.eager_ops = dict(eager_ops)
        # The graph's device (graph_device): a node computing on another
        # (a tensor literal made on the CPU in a CUDA model) stays out, or it
        # would make its partition one of two devices, which Kiln refuses.
        self.device = device
        # FX node name -> why: nodes kilnd refused in an earlier attempt.
        self.excluded = dict(excluded)
        self.reasons: Dict[torch.fx.Node, str] = {}
        self._answers: Dict[torch.fx.Node, bool] = {}  # asked once per node

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module],
                          node: torch.fx.Node) -> bool:
        answer = self._answers.get(node)
        if answer is None:
            answer = self._answers[node] = self._supported(node)
        return answer

    def _supported(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            return True  # merged into its source's partition by the partitioner
        reason = self._reason(node)
        if reason is None:
            return True
        self.reasons[node] = reason
        return False

    def _reason(self, node: torch.fx.Node) -> "str | None":
        if node.name in self.excluded:
            return self.excluded[node.name]
        if not isinstance(node.target, torch._ops.OpOverload):
            return f"{op_name(node.target)} is not an ATen op"
        name = op_name(node.target)
        if name in self.eager_ops:
            return self.eager_ops[name]
        if name not in self.ops and name not in IDENTITY_OPS:
            if name.startswith("aten._scaled_dot_product_"):
                return ("PyTorch's fused attention kernel, kept by the "
                        "attention policy (kiln/attention.py, KILN_ATTENTION)")
            return "not in Kiln's op set"
        try:
            check_node_args(node)
            val = node.meta.get("val")
            if self.device is not None and isinstance(val, torch.Tensor) \
                    and val.device != self.device:
                return (f"a value on {val.device} in a graph on "
                        f"{self.device} (e.g. a tensor literal made on the "
                        "CPU): runs eagerly where PyTorch mixes them")
            return _shape_reason(node, name)
        except Unsupported as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 (never fail the user's graph)
            return f"cannot be checked: {e!r}"


@dataclass
class PartitionResult:
    """The partitioned module and, per submodule name, its original nodes'
    op names."""

    module: torch.fx.GraphModule
    partitions: Dict[str, List[str]] = field(default_factory=dict)
    # Nodes left out of every partition although supported, with why.
    left_out: Dict[str, List[str]] = field(default_factory=dict)


def partition(gm: torch.fx.GraphModule,
              support: KilnOperatorSupport) -> PartitionResult:
    """Partitions `gm` in place (see the module docstring)."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if all(support.is_node_supported({}, n) for n in calls):
        # The partitioner's answer without its search: with no node left
        # out, every merge it tries succeeds (nothing outside can close a
        # cycle), so its one partition holds every call.
        proposed = [Partition(id=0, nodes=calls)] if calls else []
    else:
        view_names = set()
        for node in calls:
            if op_name(node.target) in VIEW_OPS:
                view_names.add(_get_qualified_name(node.target))
        proposed = CapabilityBasedPartitioner(
            gm, support, allows_single_node_partition=True,
            non_compute_ops=sorted(view_names)).propose_partitions()
    kept, left_out = [], {}
    for p in proposed:
        compute = [n for n in p.nodes if n.op == "call_function" and
                   n.target is not operator.getitem and
                   op_name(n.target) not in VIEW_OPS]
        if compute:
            kept.append(p)
        else:
            for n in p.nodes:
                if n.target is not operator.getitem:
                    left_out.setdefault(op_name(n.target), []).append(
                        "a view or copy outside any computation Kiln runs")
    # Views removed from a partition's edge.
    in_kept = {n for p in kept for n in p.nodes}
    for node in gm.graph.nodes:
        if (node.op == "call_function" and node not in in_kept and
                node not in support.reasons and
                node.target is not operator.getitem and
                not any(node in p.nodes for p in proposed if p not in kept)):
            left_out.setdefault(op_name(node.target), []).append(
                "a view or copy at a partition's edge (runs eagerly)")
    groups = [list(p.nodes) for p in kept]
    if support.eager_ops:  # random ops run eagerly draw in the graph's order
        groups = _split_at_random_ops(gm, groups, left_out)
    result = PartitionResult(module=gm, left_out=left_out)
    for i, nodes in enumerate(groups):
        result.partitions[f"kiln_{i}"] = [
            op_name(n.target) for n in nodes
            if n.op == "call_function" and n.target is not operator.getitem]
    if groups:
        position = {n.name: i for i, n in enumerate(gm.graph.nodes)}
        last = {f"kiln_{i}": max(position[n.name] for n in nodes)
                for i, nodes in enumerate(groups)}
        result.module = fuse_by_partitions(gm, groups, prefix="kiln_")
        _restore_order(result.module, position, last)
    else:
        result.module = gm
    return result


def _is_random(node: torch.fx.Node) -> bool:
    """Whether node draws from torch's generator (an op tagged
    nondeterministic_seeded: rand, randn, bernoulli, dropout, exponential,
    uniform, ...)."""
    return node.op == "call_function" and \
        isinstance(node.target, torch._ops.OpOverload) and \
        torch.Tag.nondeterministic_seeded in node.target.tags


def _split_at_random_ops(gm: torch.fx.GraphModule,
                         groups: List[List[torch.fx.Node]],
                         left_out: Dict[str, List[str]]
                         ) -> List[List[torch.fx.Node]]:
    """`groups` cut where a random op that runs eagerly lies between their
    nodes in gm's order: each piece holds the nodes between two such ops.
    A partition holding nodes before and after one would have to run
    entirely before or after it, and move it past the other random ops
    (kiln.backend(eager_random=True) draws eager's numbers only in eager's
    order). Cutting in gm's (topological) order makes no cycle: every edge
    between pieces goes forward. A piece with nothing to compute is left
    out (its nodes run eagerly), with the reason in `left_out`."""
    in_groups = {n for nodes in groups for n in nodes}
    cuts, segment = 0, {}
    for n in gm.graph.nodes:
        if _is_random(n) and n not in in_groups:
            cuts += 1
        segment[n] = cuts
    if cuts == 0:
        return groups
    pieces: List[List[torch.fx.Node]] = []
    for nodes in groups:
        by_segment: Dict[int, List[torch.fx.Node]] = {}
        for n in nodes:
            # A getitem stays with its source.
            source = n.args[0] if n.target is operator.getitem and \
                isinstance(n.args[0], torch.fx.Node) else n
            by_segment.setdefault(segment[source], []).append(n)
        for _, piece in sorted(by_segment.items()):
            if any(n.op == "call_function" and
                   n.target is not operator.getitem and
                   op_name(n.target) not in VIEW_OPS for n in piece):
                pieces.append(piece)
            else:
                for n in piece:
                    if n.target is not operator.getitem:
                        left_out.setdefault(op_name(n.target), []).append(
                            "a view between random ops run eagerly")
    return pieces


def _restore_order(gm: torch.fx.GraphModule, position: Mapping[str, int],
                   last: Mapping[str, int]) -> None:
    """Orders gm's nodes as before partitioning, each partition's call (and
    its getitems) where its last node was, as far as data dependencies
    allow. torch.fx's fuse_by_partitions sorts the fused graph
    breadth-first in torch 2.6 (legalize_graph), which put a graph's output
    before its side effects (an optimizer step's copy_ into its parameters:
    `return ()` first, the update never ran) and may move a write of an
    input before a read of it. torch 2.11 and later sort stably; there this
    keeps the order they made."""
    keys: Dict[torch.fx.Node, Tuple] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            keys[n] = (-1, len(keys))
        elif n.op == "output":
            keys[n] = (float("inf"),)
        elif n.op == "call_module" and n.target in last:
            keys[n] = (last[n.target], 0)
        elif (n.target is operator.getitem and
              isinstance(n.args[0], torch.fx.Node) and
              n.args[0].op == "call_module" and n.args[0].target in last):
            keys[n] = (last[n.args[0].target], 1, n.args[1])
        elif n.name in position:
            keys[n] = (position[n.name], 0)
        else:  # a node fusing made: after its inputs
            keys[n] = max((keys[i] for i in n.all_input_nodes),
                          default=(-1,)) + (2,)
    pending = {n: len(n.all_input_nodes) for n in gm.graph.nodes}
    ready = [(keys[n], i, n) for i, n in enumerate(gm.graph.nodes)
             if pending[n] == 0]
    heapq.heapify(ready)
    ordered: List[torch.fx.Node] = []
    tie = len(ready)
    while ready:
        _, _, n = heapq.heappop(ready)
        ordered.append(n)
        for user in n.users:
            pending[user] -= 1
            if pending[user] == 0:
                tie += 1
                heapq.heappush(ready, (keys[user], tie, user))
    if len(ordered) != len(pending):
        raise RuntimeError("partitioned graph has a cycle")
    if ordered == list(gm.graph.nodes):
        return
    for before, n in zip(ordered, ordered[1:]):
        if before.next is not n:
            before.append(n)
    gm.graph.lint()
    gm.recompile()
