// What the random ops' signatures (graph/ops/random.cc), reference
// semantics (compiler/ops/random_reference.cc) and lowerings
// (compiler/ops/random_lowering.cc) share: where the seed and offset are,
// and the arithmetic that turns Philox bits (support/philox.h) into values,
// so that the reference and compiled kernels draw the same numbers.
//
// Every random op takes two keywords beyond its ATen schema: `seed`, an
// int64 0-dim tensor (a graph input; the torch backend draws it per call
// from torch's generator) and `offset`, an int naming the op's stream (the
// torch backend numbers the random ops of a partition 0, 1, ...). Element i
// (row-major over the output) draws Philox4x32-10(seed, offset, i).
#ifndef KILN_GRAPH_OPS_RANDOM_H_
#define KILN_GRAPH_OPS_RANDOM_H_

#include <cstdint>

#include "graph/dtype.h"
#include "graph/graph.h"

namespace kiln::ops {

// Argument positions of the seed and offset keywords in `node`'s schema.
struct RandomArgs {
  int seed = -1;
  int offset = -1;
};
RandomArgs RandomArgsOf(const Node& node);

// Uniform [0, 1) in dtype d as PyTorch builds it from random bits: the low
// UniformBits(d) bits of a word times 2^-UniformBits(d) (24 for float32, 11
// for float16, 8 for bfloat16: every value exact in d, never 1).
int UniformBits(DType d);

// Bernoulli(p) from word 0: 1 iff (word & (2^24 - 1)) < BernoulliThreshold(p)
// = ceil(p * 2^24) clamped to [0, 2^24]: the probability is p to 2^-24,
// exactly 0 at p <= 0 and 1 at p >= 1, decided on integers (no rounding
// differences between the reference and a kernel).
inline constexpr int kBernoulliBits = 24;
int64_t BernoulliThreshold(double p);

// native_dropout's scale of kept elements: 1 / (1 - p), 0 when p == 1
// (ATen's native_dropout).
double DropoutScale(double p);
// Whether native_dropout `node` drops (train is None or true).
bool DropoutTrains(const Node& node);

// Normal: Box-Muller on two uniforms of 24 bits, u1 from word 0 and u2 from
// word 1: sqrt(-2 log(1 - u1)) * cos(2 pi u2) (as PyTorch's CPU normal_).
inline constexpr double kTwoPi = 6.283185307179586476925286766559;

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_RANDOM_H_
