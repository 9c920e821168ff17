// What the gather/scatter ops' signatures (graph/ops/gather_scatter.cc)
// share with their reference semantics and lowerings
// (compiler/ops/gather_scatter_*.cc): the reduction codes of the loss ops
// and constant_pad_nd's per-dim padding. Defined in
// graph/ops/gather_scatter.cc.
#ifndef KILN_GRAPH_OPS_GATHER_SCATTER_H_
#define KILN_GRAPH_OPS_GATHER_SCATTER_H_

#include <cstdint>
#include <vector>

namespace kiln::ops {

// at::Reduction: the `reduction` int of nll_loss_forward/backward.
enum class LossReduction : int64_t { kNone = 0, kMean = 1, kSum = 2 };

// constant_pad_nd's `pad` as (before, after) per dim of a rank-`rank`
// tensor: pad[2i], pad[2i+1] apply to dim rank-1-i; dims it does not name
// get (0, 0). The caller checked pad.size() is even and <= 2 * rank.
struct PadPair {
  int64_t before = 0, after = 0;
};
std::vector<PadPair> PadPairs(const std::vector<int64_t>& pad, int rank);

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_GATHER_SCATTER_H_
