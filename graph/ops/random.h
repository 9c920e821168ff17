// What the random ops' signatures (graph/ops/random.cc), reference
// semantics (compiler/ops/random_reference.cc) and lowerings
// (compiler/ops/random_lowering.cc) share: where the seed and offset are,
// and the arithmetic that turns Philox bits (support/philox.h) into values,
// so that the reference and compiled kernels draw the same numbers.
//
// Every random op takes two keywords beyond its ATen schema: `seed`, an
// int64 0-dim tensor (a graph input; the torch backend draws it per call
// from torch's generator) and `offset`, an int naming the op's stream (the
// torch backend numbers the random ops of a partition 0, 1, ...). One call
// of Philox4x32-10 gives 4 words; an op draws `words` of them per element
// (1, or 2 for a normal), so consecutive elements share a call: element i
// (row-major over the output) takes words l * words ... l * words + words -
// 1 of Philox4x32-10(seed, offset, i / n), where n = 4 / words elements
// share a call and l = i % n (PhiloxCall, PhiloxWord). As PyTorch's CUDA
// generators, which take 4 numbers from each call.
#ifndef KILN_GRAPH_OPS_RANDOM_H_
#define KILN_GRAPH_OPS_RANDOM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "graph/op_signature.h"

namespace kiln::ops {

// Words of one Philox4x32 call.
inline constexpr int kPhiloxWords = 4;
// For an op drawing `words` words per element (1 or 2): the call element
// `index` draws from, and the position among the call's words of its word
// `which` (< words).
inline constexpr int64_t PhiloxCall(int64_t index, int words) {
  return index / (kPhiloxWords / words);
}
inline constexpr int PhiloxWord(int64_t index, int words, int which) {
  return static_cast<int>(index % (kPhiloxWords / words)) * words + which;
}

// Argument positions of the seed and offset keywords in `node`'s schema.
struct RandomArgs {
  int seed = -1;
  int offset = -1;
};
RandomArgs RandomArgsOf(const Node& node);

// Checks `ctx`'s node (a random op) for its seed and offset keywords: the
// seed given, an int64 0-dim tensor; the offset non-negative. Errors:
// INVALID_ARGUMENT naming the node.
absl::Status CheckSeed(const OpContext& ctx);

// Uniform [0, 1) in dtype d as PyTorch builds it from random bits: the low
// UniformBits(d) bits of a word times 2^-UniformBits(d) (24 for float32, 11
// for float16, 8 for bfloat16: every value exact in d, never 1).
int UniformBits(DType d);

// Bernoulli(p) from the element's word: 1 iff (word & (2^24 - 1)) <
// BernoulliThreshold(p) = ceil(p * 2^24) clamped to [0, 2^24]: the probability
// is p to 2^-24, exactly 0 at p <= 0 and 1 at p >= 1, decided on integers (no
// rounding differences between the reference and a kernel).
inline constexpr int kBernoulliBits = 24;
int64_t BernoulliThreshold(double p);

// native_dropout's scale of kept elements: 1 / (1 - p), 0 when p == 1
// (ATen's native_dropout).
double DropoutScale(double p);
// Whether native_dropout `node` drops (train is None or true).
bool DropoutTrains(const Node& node);

// Normal: Box-Muller on two uniforms of 24 bits, u1 from the element's
// first word and u2 from its second: sqrt(-2 log(1 - u1)) * cos(2 pi u2) (as
// PyTorch's CPU normal_).
inline constexpr double kTwoPi = 6.283185307179586476925286766559;

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_RANDOM_H_
