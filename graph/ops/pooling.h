// The window arithmetic of the 2-d pooling ops (max_pool2d_with_indices,
// avg_pool2d, _adaptive_avg_pool2d and their backward ops), shared by their
// signatures (graph/ops/pooling.cc), references and lowerings
// (compiler/ops/pooling_*.cc): PyTorch's pooling_output_shape and
// adaptive start/end indices. Inputs are [N, C, H, W] or [C, H, W] with
// static H and W.
#ifndef KILN_GRAPH_OPS_POOLING_H_
#define KILN_GRAPH_OPS_POOLING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace kiln::ops {

struct Pool2dWindow {
  int64_t kh = 1, kw = 1;  // kernel
  int64_t sh = 1, sw = 1;  // stride
  int64_t ph = 0, pw = 0;  // padding
  int64_t dh = 1, dw = 1;  // dilation
  bool ceil_mode = false;
  int64_t h = 0, w = 0;    // input
  int64_t oh = 0, ow = 0;  // output
};

// The window of `node`: kernel_size, stride (empty: kernel_size), padding
// and dilation (-1: none, 1) at the given argument positions, each one int
// or two; ceil_mode at `ceil_arg`; input spatial sizes h and w. An error
// (for the signature to report) says which argument is wrong.
absl::StatusOr<Pool2dWindow> Pool2dWindowOf(const Node& node, int kernel_arg,
                                            int stride_arg, int pad_arg,
                                            int dilation_arg, int ceil_arg,
                                            int64_t h, int64_t w);

// PyTorch's pooling_output_shape.
int64_t PoolOutputSize(int64_t in, int64_t kernel, int64_t pad, int64_t stride,
                       int64_t dilation, bool ceil_mode);

// Adaptive pooling: the window of output o of `out` over `in` positions is
// [AdaptiveStart, AdaptiveEnd).
inline int64_t AdaptiveStart(int64_t o, int64_t out, int64_t in) {
  return (o * in) / out;
}
inline int64_t AdaptiveEnd(int64_t o, int64_t out, int64_t in) {
  return ((o + 1) * in + out - 1) / out;
}
// The largest adaptive window (the reduction extent the lowering uses).
int64_t AdaptiveMaxWindow(int64_t out, int64_t in);

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_POOLING_H_
