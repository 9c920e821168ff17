// Building blocks of the compiler's lowering tables
// (compiler/ops/*_lowering.cc): reductions over a lowered value, reading
// a kept-dim reduction broadcast, a pointwise node over the output, and the
// extern GEMM nodes of the matrix products and convolutions (issue 16).
#ifndef KILN_COMPILER_OPS_LOWERING_UTIL_H_
#define KILN_COMPILER_OPS_LOWERING_UTIL_H_

#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/lower.h"

namespace kiln::ops {

// Adds a reduction node over `in`'s index space reducing the `reduced` dims
// of body (default: `in` cast to `compute`); `finalize` maps the
// accumulator and the reduced element count to the result (null: acc).
absl::StatusOr<std::vector<LoweredValue>> LowerReductionOver(
    LowerContext& ctx, const LoweredValue& in, const std::vector<bool>& reduced,
    bool keepdim, ReduceKind kind, DType compute, DType out_dtype,
    Expr body_override, std::function<Expr(Expr acc, Expr count)> finalize);
// A keepdim reduction result `r` read broadcast over its input space.
Expr ReadKept(const LoweredValue& r, const std::vector<bool>& reduced);

// A pointwise node of `sizes` and `dtype` computing `body`, cast to
// `dtype`.
LoweredValue PointwiseNode(LowerContext& ctx, std::vector<SymExpr> sizes,
                           DType dtype, Expr body);

// A pointwise node over the op's output (its sizes and dtype) computing
// `body`, cast to the output dtype: what a creation op or cat lowers to.
LoweredValue PointwiseOutput(LowerContext& ctx, Expr body);

// An accumulator dtype for sums of `dtype`: float32 for floating dtypes,
// int64 for the others.
DType SumDType(DType dtype);

// A scatter (LoopNode::kScatter) of `sizes`: `base` (over the vars of
// `sizes`, in dtype), plus value(q) at target(q) for every q of `space`
// (target: one expression per dim of `sizes`, each within its dim; value
// over the vars of `space`), summed in SumDType(dtype); with `replace`,
// value(q) replaces the element instead, in dtype. On the CPU the source
// dims that are a target coordinate of their own run in parallel and the
// others in source order (deterministic); with LowerOptions::
// atomic_scatters (CUDA) every source position is parallel. Source dim
// `in_order` (>= 0; CPU targets) runs in source order even where it is a
// target coordinate of its own: a scan, whose value reads the elements
// stored before it.
LoweredValue AddScatter(LowerContext& ctx, const std::vector<SymExpr>& sizes,
                        DType dtype, const Expr& base,
                        const std::vector<SymExpr>& space,
                        std::vector<Expr> target, const Expr& value,
                        bool replace = false, int in_order = -1);

// `sum` (an AddScatter) as the op's output of `dtype`: the scatter itself
// when it is summed in that dtype (no copy), else a cast of it.
std::vector<LoweredValue> ScatterOutput(LowerContext& ctx,
                                        const LoweredValue& sum, DType dtype);

// `v` converted to `dtype` in a contiguous node of its own.
LoweredValue Materialize(LowerContext& ctx, const LoweredValue& v, DType dtype);

// `v` as a whole contiguous node of `dtype`, as a library reads it: its
// own node when `v` reads all of it in order, else a copy written by a
// Kiln kernel.
int ContiguousNode(LowerContext& ctx, const LoweredValue& v, DType dtype);

// The dtypes of a library GEMM's operands and of its C for a product in
// `out` (Kiln's floating dtypes are float32, float16 and bfloat16); it
// accumulates in float32.
struct GemmDTypes {
  DType operands, c;
};
GemmDTypes GemmDTypesFor(const LowerOptions& options, DType out);

// alpha * x @ y as an extern GEMM node (loop_ir.h, GemmCall) of `sizes`
// ([m, n], or [batch, m, n] with x and y of rank 3) whose matrices are in
// `data` (accumulating in float32). An operand the library can read in
// place (an input or realized node through an affine view with a unit row
// or column stride) is passed as it is; any other (a broadcast, a gather, a
// non-affine view, another dtype) is first written contiguously in `data`
// by a Kiln kernel. The product (C) is in `result` (default: `data`).
LoweredValue AddGemm(LowerContext& ctx, const LoweredValue& x,
                     const LoweredValue& y, double alpha,
                     const std::vector<SymExpr>& sizes, DType data,
                     std::optional<DType> result = std::nullopt);

// The row-major linear index (int64) of the vars 0 .. rank - 1 over
// `sizes`.
Expr RowMajorIndex(const std::vector<SymExpr>& sizes);

// Word `which` (< words) of Philox stream (seed, offset) (int64
// expressions) for the element at row-major `index` of an op drawing
// `words` words per element (graph/ops/random.h: PhiloxCall, PhiloxWord).
// The elements of a call are consecutive, so where a kernel runs them
// together (a vector group on CUDA) the compiler computes the call once for
// all of them.
Expr PhiloxWordAt(const Expr& seed, const Expr& offset, const Expr& index,
                  int words, int which);

// A Bernoulli draw (bool) of `word`: its low kBernoulliBits bits <
// `threshold` (graph/ops/random.h, BernoulliThreshold).
Expr BernoulliDraw(const Expr& word, int64_t threshold);

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_LOWERING_UTIL_H_
