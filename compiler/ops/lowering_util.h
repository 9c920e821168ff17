// Building blocks of the compiler's lowering tables
// (compiler/ops/*_lowering.cc): reductions over a lowered value, reading
// a kept-dim reduction broadcast, and a pointwise node over the output.
#ifndef KILN_COMPILER_OPS_LOWERING_UTIL_H_
#define KILN_COMPILER_OPS_LOWERING_UTIL_H_

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/lower.h"

namespace kiln::ops {

// Adds a reduction node over `in`'s index space reducing the `reduced` dims
// of body (default: `in` cast to `compute`); `finalize` maps the
// accumulator and the reduced element count to the result (null: acc).
absl::StatusOr<std::vector<LoweredValue>> LowerReductionOver(
    LowerContext& ctx, const LoweredValue& in, const std::vector<bool>& reduced, bool keepdim,
    ReduceKind kind, DType compute, DType out_dtype, Expr body_override,
    std::function<Expr(Expr acc, Expr count)> finalize);
// A keepdim reduction result `r` read broadcast over its input space.
Expr ReadKept(const LoweredValue& r, const std::vector<bool>& reduced);

// A pointwise node over the op's output (its sizes and dtype) computing
// `body`, cast to the output dtype: what a creation op or cat lowers to.
LoweredValue PointwiseOutput(LowerContext& ctx, Expr body);

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_LOWERING_UTIL_H_
