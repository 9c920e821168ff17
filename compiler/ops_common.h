// Building blocks shared by the op families in compiler/ops_*.cc: schema
// shorthands, broadcasting, reduction-dim handling and the elementwise
// reference engine. Internal to the compiler.
#ifndef KILN_COMPILER_OPS_COMMON_H_
#define KILN_COMPILER_OPS_COMMON_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/op_registry.h"

namespace kiln::ops {

// Schema shorthands.
ArgSpec Arg(std::string name, ArgKind kind);
ArgSpec ArgDefault(std::string name, ArgKind kind, Attr default_value);
ArgSpec KwArg(std::string name, ArgKind kind, Attr default_value);
// The factory keywords (layout, device, pin_memory) all ignored.
std::vector<ArgSpec> FactoryKwArgs();

// PyTorch broadcasting of two shapes. A symbolic size broadcasts with 1 or
// with the same expression only.
absl::StatusOr<std::vector<SymExpr>> Broadcast(const OpContext& ctx,
                                               const std::vector<SymExpr>& a,
                                               const std::vector<SymExpr>& b);

// Shape of argument i: a tensor's sizes, or [] for a Python scalar or None.
std::vector<SymExpr> OperandShape(const OpContext& ctx, int i);

// Broadcast shape of the given argument positions.
absl::StatusOr<std::vector<SymExpr>> BroadcastArgs(
    const OpContext& ctx, const std::vector<int>& args);

// result_type over the given argument positions (tensors and scalars; None
// is skipped).
DType ResultTypeOf(const OpContext& ctx, const std::vector<int>& args);

// The dims a reduction reduces: `dims` (wrapped, deduplicated-checked) or all
// dims when empty/None.
absl::StatusOr<std::vector<bool>> ReducedDims(const OpContext& ctx,
                                              const Attr& dims, int rank);
std::vector<SymExpr> ReducedShape(const std::vector<SymExpr>& sizes,
                                  const std::vector<bool>& reduced,
                                  bool keepdim);
// A static int from a size list entry, or an error naming `what`.
absl::StatusOr<int64_t> StaticInt(const OpContext& ctx, const SymExpr& e,
                                  absl::string_view what);

// ---- reference helpers ----

// `t` broadcast (stride-0 expanded) to `sizes`.
HostTensor BroadcastTo(const HostTensor& t, const std::vector<int64_t>& sizes);

// The elementwise engine. Operands (tensor or scalar arguments, by
// position) are broadcast to the output, converted to `compute` (rounded
// like a cast), and combined by `fd` when `compute` is floating or `fi`
// otherwise; the result is stored with `out`'s rounding.
using FloatFn = std::function<double(const double*)>;
using IntFn = std::function<int64_t(const int64_t*)>;
HostTensor Elementwise(const RefContext& ctx, const std::vector<int>& operands,
                       DType compute, const FloatFn& fd, const IntFn& fi);

// ---- lowering helpers ----

// Adds a reduction node over `in`'s index space reducing the `reduced` dims
// of body (default: `in` cast to `compute`); `finalize` maps the
// accumulator and the reduced element count to the result (null: acc).
absl::StatusOr<std::vector<LoweredValue>> LowerReductionOver(
    LowerContext& ctx, const LoweredValue& in, const std::vector<bool>& reduced, bool keepdim,
    ReduceKind kind, DType compute, DType out_dtype, Expr body_override,
    std::function<Expr(Expr acc, Expr count)> finalize);
// A keepdim reduction result `r` read broadcast over its input space.
Expr ReadKept(const LoweredValue& r, const std::vector<bool>& reduced);

// Iterates the multi-indices of `sizes` in row-major order.
void ForEachIndex(const std::vector<int64_t>& sizes,
                  const std::function<void(const std::vector<int64_t>&)>& fn);

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_COMMON_H_
