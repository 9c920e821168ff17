// The pointwise family's signatures (graph/ops/pointwise.cc), shared with
// the compiler's reference (compiler/ops/pointwise_reference.cc) and
// lowering (compiler/ops/pointwise_lowering.cc) of the same ops.
//
// A pointwise op combines some of its arguments (its operands: tensors
// broadcast together, or Python scalars) element by element in a compute
// dtype chosen by type promotion. Its signature says which arguments are
// operands, how the compute dtype is chosen and which compute dtypes the op
// is defined for; the compiler's tables give the element functions and the
// loop-IR expression, computed in that same dtype (ComputeDType).
//
// The casts (aten._to_copy, prims.convert_element_type) are registered by
// the same file but are not PointwiseSignatures: their compute dtype is the
// target dtype.
//
// Thread-safety: the table is built once on first use and immutable.
#ifndef KILN_GRAPH_OPS_POINTWISE_H_
#define KILN_GRAPH_OPS_POINTWISE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "graph/dtype.h"
#include "graph/graph.h"
#include "graph/op_signature.h"

namespace kiln::ops {

// How the compute dtype and the output dtype are chosen.
enum class Promotion : uint8_t {
  kResultType,  // compute and output: result_type of the operands
  kIntToFloat,  // as kResultType, then integral/bool -> default float
  kBoolOutput,  // compute: result_type; output bool (comparisons, logical)
  kFloatOnly,   // compute: result_type, which must be floating
};

// An op-specific check of the dtype rule, run once the compute dtype is
// known and found supported.
using PointwiseCheck = absl::Status (*)(const OpContext& ctx, DType compute);

struct PointwiseSignature {
  std::string name;  // ATen overload name
  std::vector<ArgSpec> schema;
  std::vector<int> operands;  // argument positions combined elementwise
  Promotion promotion = Promotion::kResultType;
  // The compute dtypes the op is defined for: floating (the compiler has a
  // double element function), integral and bool (an int64 one), and whether
  // bool is excluded from the latter.
  bool float_compute = true;
  bool int_compute = true;
  bool allow_bool = true;
  PointwiseCheck check = nullptr;  // null: none
  // How many leading `operands` take part in type promotion (-1: all);
  // where's condition does not.
  int promoted_operands = -1;
  // div's rounding_mode: when this argument is None the op is true division
  // and integral inputs compute in the default float dtype.
  int true_division_if_none_arg = -1;
};

// The signature of pointwise op `op`, or nullptr when `op` is not one (the
// casts included).
const PointwiseSignature* FindPointwiseSignature(absl::string_view op);

// The dtype of tensor argument `arg` and whether it is zero-dim, as the
// caller knows it (graph types, host tensors or lowered values).
using OperandDType = absl::FunctionRef<std::pair<DType, bool>(int arg)>;

// The dtype `op`'s element function computes in for `node`.
DType ComputeDType(const PointwiseSignature& op, const Node& node,
                   OperandDType operand_dtype);

}  // namespace kiln::ops

#endif  // KILN_GRAPH_OPS_POINTWISE_H_
