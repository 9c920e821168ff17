// The geometry of convolution and convolution_backward, shared by their
// signatures (graph/ops/conv.cc), references and lowerings
// (compiler/ops/conv_*.cc), so that all three read the arguments alike.
//
// PyTorch's semantics (aten/src/ATen/native/Convolution.cpp): input
// [N, C, *S] and weight [O, C / groups, *K] (transposed: [C, O / groups,
// *K]) with 1 to 3 spatial dims; stride, padding, dilation and
// output_padding each one int per spatial dim or a single int for all;
// output size (S + 2p - d (K - 1) - 1) / s + 1, transposed
// (S - 1) s - 2p + d (K - 1) + output_padding + 1. output_padding is used
// only by transposed convolutions and must be smaller than the stride or
// the dilation.
#ifndef KILN_GRAPH_OPS_CONV_H_
#define KILN_GRAPH_OPS_CONV_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/sym_expr.h"

namespace kiln::ops {

struct ConvGeometry {
  int dims = 0;  // spatial dims, 1..3
  bool transposed = false;
  int64_t groups = 1;
  std::vector<int64_t> stride, padding, dilation, output_padding, kernel;
  int64_t in_channels = 0;   // C
  int64_t out_channels = 0;  // O
  SymExpr batch;             // N
  std::vector<SymExpr> in_spatial, out_spatial;
  std::vector<SymExpr> out_sizes;  // [N, O, *out_spatial]
  // Kernel elements: the product of `kernel`.
  int64_t kernel_elements() const;
};

// The geometry of a node whose input and weight have `input` and `weight`
// sizes and whose stride, padding, dilation, transposed, output_padding and
// groups arguments are at `first_arg` .. first_arg + 5 (convolution: 3,
// convolution_backward: 4). Channel and kernel sizes must be static; the
// batch may be symbolic, a spatial size too where its output size stays a
// polynomial (stride 1, or transposed). Errors (INVALID_ARGUMENT, for the
// signature to prefix with the node) say which argument is wrong.
absl::StatusOr<ConvGeometry> ConvGeometryOf(const Node& node, int first_arg,
                                            const std::vector<SymExpr>& input,
                                            const std::vector<SymExpr>& weight);

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_CONV_H_
