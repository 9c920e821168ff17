#!/usr/bin/python3
"""Writes the GPU benchmark's row graphs as kiln.v1.Graph JSON.

  gen_graphs.py softmax ROWS COLS     aten._softmax over the last dim
  gen_graphs.py layernorm ROWS COLS   aten.native_layer_norm over the last dim
  gen_graphs.py var ROWS COLS         aten.var.correction over the last dim
  gen_graphs.py sum ROWS COLS         aten.sum over the last dim
  gen_graphs.py argmax ROWS COLS      aten.argmax over the last dim
  gen_graphs.py gelu ROWS COLS [DTYPE]      tanh-GELU (default BFLOAT16)
  gen_graphs.py gelu_bwd ROWS COLS [DTYPE]  its backward (grad, x)
  gen_graphs.py add ROWS COLS [DTYPE]       x + y
"""
import json
import sys


def dims(*sizes):
    return [{"value": str(s)} for s in sizes]


def softmax(rows, cols):
    return {
        "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                                         "sizes": dims(rows, cols)}}],
        "nodes": [{"op": "aten._softmax.default",
                   "args": [{"ref": "x"}, {"i": "-1"}, {"b": False}],
                   "outputs": ["y"]}],
        "outputs": ["y"],
    }


def layernorm(rows, cols):
    meta = lambda *s: {"dtype": "FLOAT32", "sizes": dims(*s)}
    return {
        "inputs": [{"name": "x", "meta": meta(rows, cols)},
                   {"name": "weight", "meta": meta(cols)},
                   {"name": "bias", "meta": meta(cols)}],
        "nodes": [{"op": "aten.native_layer_norm.default",
                   "args": [{"ref": "x"}, {"ints": {"values": [str(cols)]}},
                            {"ref": "weight"}, {"ref": "bias"}, {"f": 1e-5}],
                   "outputs": ["y", "mean", "rstd"]}],
        "outputs": ["y"],
    }


def row_reduction(op, dim_arg):
    """A graph of `op` over the last dim of an x[rows, cols] float32."""
    def graph(rows, cols):
        return {
            "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
                                             "sizes": dims(rows, cols)}}],
            "nodes": [{"op": op, "args": [{"ref": "x"}, dim_arg],
                       "outputs": ["y"]}],
            "outputs": ["y"],
        }
    return graph


LAST_DIM = {"ints": {"values": ["1"]}}


def sum_amax(rows, cols):
    """Two reductions of the same rows, two outputs (one fused kernel)."""
    graph = row_reduction("aten.sum.dim_IntList", LAST_DIM)(rows, cols)
    graph["nodes"].append({"op": "aten.amax.default",
                           "args": [{"ref": "x"}, LAST_DIM],
                           "outputs": ["m"]})
    graph["outputs"].append("m")
    return graph


def pointwise(op, inputs, extra):
    """A graph of one pointwise `op` over `inputs` x[rows, cols] of dtype,
    then the arguments `extra`."""
    def graph(rows, cols, dtype="BFLOAT16"):
        names = ["g", "x"] if inputs == 2 and op.endswith("backward.default") \
            else ["x", "y"][:inputs]
        return {
            # 16-byte aligned, as the client reports PyTorch's tensors.
            "inputs": [{"name": n, "meta": {"dtype": dtype,
                                           "sizes": dims(rows, cols),
                                           "alignment": 16}}
                       for n in names],
            "nodes": [{"op": op, "args": [{"ref": n} for n in names] + extra,
                       "outputs": ["out"]}],
            "outputs": ["out"],
        }
    return graph


TANH = [{"name": "approximate", "str": "tanh"}]
HALF_GRAPHS = {"gelu": pointwise("aten.gelu.default", 1, TANH),
               "gelu_bwd": pointwise("aten.gelu_backward.default", 2, TANH),
               "add": pointwise("aten.add.Tensor", 2, [])}

GRAPHS = {"sum_amax": sum_amax, "softmax": softmax, "layernorm": layernorm,
          "sum": row_reduction("aten.sum.dim_IntList", LAST_DIM),
          "var": row_reduction("aten.var.correction", LAST_DIM),
          "argmax": row_reduction("aten.argmax.default", {"i": "1"})}


def main():
    if sys.argv[1:2] and sys.argv[1] in HALF_GRAPHS and \
            len(sys.argv) in (4, 5):
        graph = HALF_GRAPHS[sys.argv[1]](int(sys.argv[2]), int(sys.argv[3]),
                                         *sys.argv[4:])
        json.dump(graph, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if len(sys.argv) != 4 or sys.argv[1] not in GRAPHS:
        sys.exit(__doc__)
    rows, cols = int(sys.argv[2]), int(sys.argv[3])
    graph = GRAPHS[sys.argv[1]](rows, cols)
    json.dump(graph, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
