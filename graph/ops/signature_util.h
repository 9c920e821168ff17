// Building blocks of the op signature tables (graph/ops/*.cc): schema
// shorthands, broadcasting, type promotion over arguments and reduction-dim
// handling. Internal to the graph layer and the compiler's op tables.
#ifndef KILN_GRAPH_OPS_SIGNATURE_UTIL_H_
#define KILN_GRAPH_OPS_SIGNATURE_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/op_signature.h"

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

// "[2, n, 3]": a shape for error messages.
std::string ShapeString(const std::vector<SymExpr>& sizes);

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

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_SIGNATURE_UTIL_H_
