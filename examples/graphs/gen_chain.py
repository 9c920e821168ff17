#!/usr/bin/python3
"""Writes the chain-N benchmark graph (TARGETS.md) as kiln.v1.Graph JSON.

chain-N is N statements `x = f(x)` taken in turn from a cycle of 20; with
--sum the graph ends in `x.sum()` (the launch-overhead variant). Each
statement is one Core ATen node, except exp(x*c), which is two (aten.mul
then aten.exp) but counts as one statement.

  gen_chain.py 30 > chain30.json
  gen_chain.py 30 --sum > chain30_sum.json
  gen_chain.py 10 --rows s0 > chain10_dynamic.json   # dynamic first dim
"""
import argparse
import json
import sys

# (kind, scalar): "add"/"mul"/"sub" take x and a float; "exp_mul" is
# exp(x * scalar); the rest are unary.
CYCLE = [
    ("add", 0.1), ("sin", None), ("mul", 1.1), ("cos", None),
    ("add", 0.2), ("relu", None), ("sub", 0.1), ("exp_mul", 0.5),
    ("add", 0.3), ("sigmoid", None), ("mul", 1.2), ("sin", None),
    ("add", 0.4), ("cos", None), ("sub", 0.2), ("relu", None),
    ("add", 0.5), ("exp_mul", 0.4), ("mul", 1.3), ("sigmoid", None),
]

BINARY = {"add": "aten.add.Tensor", "mul": "aten.mul.Tensor",
          "sub": "aten.sub.Tensor"}
UNARY = {"sin": "aten.sin.default", "cos": "aten.cos.default",
         "relu": "aten.relu.default", "sigmoid": "aten.sigmoid.default"}


def node(op, args, out):
    return {"op": op, "args": args, "outputs": [out]}


def chain(n, rows, cols, with_sum):
    dims = []
    symbols = []
    for d in (rows, cols):
        if d.isdigit():
            dims.append({"value": d})
        else:
            dims.append({"symbol": d})
            symbols.append({"name": d})
    graph = {"inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                                              "sizes": dims}}]}
    if symbols:
        graph["symbols"] = symbols
    nodes = []
    x = "x"
    for i in range(n):
        kind, c = CYCLE[i % len(CYCLE)]
        out = "v%d" % (i + 1)
        if kind in BINARY:
            nodes.append(node(BINARY[kind], [{"ref": x}, {"f": c}], out))
        elif kind == "exp_mul":
            tmp = "v%d_scaled" % (i + 1)
            nodes.append(node("aten.mul.Tensor", [{"ref": x}, {"f": c}], tmp))
            nodes.append(node("aten.exp.default", [{"ref": tmp}], out))
        else:
            nodes.append(node(UNARY[kind], [{"ref": x}], out))
        x = out
    if with_sum:
        nodes.append(node("aten.sum.default", [{"ref": x}], "sum"))
        x = "sum"
    graph["nodes"] = nodes
    graph["outputs"] = [x]
    return graph


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("n", type=int, help="number of statements")
    p.add_argument("--sum", action="store_true", help="end with x.sum()")
    p.add_argument("--rows", default="8", help="static size or symbol name")
    p.add_argument("--cols", default="16", help="static size or symbol name")
    a = p.parse_args()
    if a.n < 1:
        p.error("n must be at least 1")
    sys.stdout.write(to_json(chain(a.n, a.rows, a.cols, a.sum)))


def to_json(graph):
    """JSON with one input, symbol or node per line, for reading and diffs."""
    parts = []
    for key, value in graph.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n".join("  " + json.dumps(v) for v in value)
            parts.append(' "%s": [\n%s\n ]' % (key, items))
        else:
            parts.append(' "%s": %s' % (key, json.dumps(value)))
    return "{\n" + ",\n".join(parts) + "\n}\n"


if __name__ == "__main__":
    main()
