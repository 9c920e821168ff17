// The reduction family's descriptors (sum, mean, prod, amax, amin, var,
// argmax, argmin, any, all over any set of dims, with keepdim): which
// argument holds the dims, keepdim, dtype and correction. The signature
// table (graph/ops/reduction.cc) and the compiler's reference and lowering
// tables (compiler/ops/reduction_*.cc) read the same descriptor.
//
// Thread-safety: the descriptors are built once and immutable.
#ifndef KILN_GRAPH_OPS_REDUCTION_H_
#define KILN_GRAPH_OPS_REDUCTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "graph/op_signature.h"

namespace kiln {

enum class Reduction : uint8_t {
  kSum,
  kMean,
  kProd,
  kMax,
  kMin,
  kVar,
  kArgMax,
  kArgMin,
  kAny,
  kAll
};

struct ReductionOp {
  std::string name;
  Reduction kind;
  std::vector<ArgSpec> schema;
  int dims_arg = -1;     // -1: reduce all dims
  int keepdim_arg = -1;  // -1: keepdim = false
  int dtype_arg = -1;    // -1: no dtype argument
  int correction_arg = -1;
};

// The descriptor of a reduction op; nullptr for any other op.
const ReductionOp* FindReduction(absl::string_view op);
// Every reduction op, in registration order.
const std::vector<ReductionOp>& ReductionOps();

// keepdim of a bound node (false where the op has no such argument).
bool KeepDim(const Node& node, const ReductionOp& op);
// The reduced-dims mask of a bound node whose dims were validated by import
// (an int dim, a list, or None/empty for all dims).
std::vector<bool> ReducedMask(const Node& node, const ReductionOp& op,
                              int rank);
// var's correction (default 1).
double Correction(const Node& node, const ReductionOp& op);

}  // namespace kiln

#endif  // KILN_GRAPH_OPS_REDUCTION_H_
