// What the creation ops' signatures (graph/ops/creation.cc) share with their
// reference semantics and lowerings (compiler/ops/creation_*.cc): arange's
// start, end and step. Defined in graph/ops/creation.cc.
#ifndef KILN_GRAPH_OPS_CREATION_H_
#define KILN_GRAPH_OPS_CREATION_H_

#include "graph/graph.h"

namespace kiln::ops {

// Argument positions of arange.default (end), arange.start (start, end) and
// arange.start_step (start, end, step), found by name in the node's schema;
// -1 where the overload has no such argument.
struct ArangePositions {
  int start = -1, end = -1, step = -1, dtype = -1;
};
ArangePositions ArangePositionsOf(const Node& node);

// An arange node's start (default 0), end and step (default 1).
struct ArangeRange {
  double start, end, step;
};
ArangeRange ArangeRangeOf(const Node& node);

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_CREATION_H_
