"""Building ATen nodes into an FX graph with their fake values.

Kiln's graph passes (kiln/remat.py, kiln/complex.py) add nodes to graphs
that AOTAutograd traced; the partitioner and the translator read each
node's ``meta["val"]`` (its FakeTensor: dtype, sizes, strides), so a new
node needs one too. NodeBuilder computes it by running the op on its
arguments' fake values in the graph's fake mode.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.fx

__all__ = ["NodeBuilder", "fake_mode_of"]


def fake_mode_of(graph: torch.fx.Graph) -> Optional[Any]:
    """The fake mode of the first node of graph whose value has one (a
    traced graph's nodes share it), else None."""
    for node in graph.nodes:
        val = node.meta.get("val")
        mode = getattr(val, "fake_mode", None)
        if mode is not None:
            return mode
    return None


class NodeBuilder:
    """Inserts call_function nodes before `where` (which may be moved
    between calls), each with its fake value and the entries of `meta`.
    ``b(target, *args, **kwargs)`` returns the new node; `made` lists the
    nodes built, in order. Raises what the op's fake kernel raises (the
    node is then already in the graph: callers that recover erase it)."""

    def __init__(self, graph: torch.fx.Graph, where: Any, fake_mode: Any,
                 meta: Optional[Dict[str, Any]] = None) -> None:
        self.graph, self.where, self.fake_mode = graph, where, fake_mode
        self.meta = dict(meta or {})
        self.made: List[Any] = []

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        with self.graph.inserting_before(self.where):
            node = self.graph.call_function(target, tuple(args), kwargs)
        self.made.append(node)
        vals = torch.fx.node.map_arg((args, kwargs), lambda a: a.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*vals[0], **vals[1])
        node.meta.update(self.meta)
        return node
