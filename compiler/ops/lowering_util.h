// Building blocks of the compiler's lowering tables
// (compiler/ops/*_lowering.cc): reductions over a lowered value, reading
// a kept-dim reduction broadcast, a pointwise node over the output, and the
// extern GEMM nodes of the matrix products and convolutions (issue 16).
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

// A pointwise node of `sizes` and `dtype` computing `body`, cast to
// `dtype`.
LoweredValue PointwiseNode(LowerContext& ctx, std::vector<SymExpr> sizes,
                           DType dtype, Expr body);

// A pointwise node over the op's output (its sizes and dtype) computing
// `body`, cast to the output dtype: what a creation op or cat lowers to.
LoweredValue PointwiseOutput(LowerContext& ctx, Expr body);

// `v` converted to `dtype` in a contiguous node of its own.
LoweredValue Materialize(LowerContext& ctx, const LoweredValue& v, DType dtype);

// alpha * x @ y as an extern GEMM node (loop_ir.h, GemmCall) of `sizes`
// ([m, n], or [batch, m, n] with x and y of rank 3) whose matrices are in
// `data` (accumulating in float32). An operand the library can read in
// place (an input or realized node through an affine view with a unit row
// or column stride) is passed as it is; any other (a broadcast, a gather, a
// non-affine view, another dtype) is first written contiguously in `data`
// by a Kiln kernel.
LoweredValue AddGemm(LowerContext& ctx, const LoweredValue& x,
                     const LoweredValue& y, double alpha,
                     const std::vector<SymExpr>& sizes, DType data);

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_LOWERING_UTIL_H_
