// The compiler's table of reference semantics: for each op of the signature
// table (graph/op_signature.h), a named function that computes the op on
// HostTensors — plain loops, floating math in double, integer math in int64,
// each result rounded to its dtype as eager PyTorch stores it. The reference
// evaluator (reference.h) runs a graph with it; it is the oracle of every
// numerics test and of `kilnctl compile --run`. It does not depend on the
// loop IR or LLVM.
//
// Adding an op: a function `<Op>Reference` and one line in the table of its
// family in compiler/ops/*_reference.cc.
//
// Built once on first use, immutable afterwards; lookups are thread-safe.
#ifndef KILN_COMPILER_OP_REFERENCE_H_
#define KILN_COMPILER_OP_REFERENCE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/op_table.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"

namespace kiln {

// What reference semantics see: arguments with tensors as HostTensors, the
// output types (dtypes, and sizes already evaluated to concrete values).
struct RefContext {
  const Node& node;
  std::vector<HostTensor> tensors;  // tensors[i] is argument i if a tensor
  std::vector<std::vector<HostTensor>> tensor_lists;  // for Tensor[] args
  std::vector<DType> out_dtypes;
  std::vector<std::vector<int64_t>> out_sizes;
  const Attr& arg(int i) const { return node.args[i]; }
};
using ReferenceFn =
    std::function<absl::StatusOr<std::vector<HostTensor>>(const RefContext&)>;

// Find(op): nullptr when the op has none; Names(): sorted; Add(op, fn)
// while building only (a name added twice aborts).
class OpReferences : public OpTable<ReferenceFn> {
 public:
  // The process-wide table, built on first call.
  static const OpReferences& Get();
};

// Per-family tables, one per compiler/ops/*_reference.cc.
void RegisterPointwiseReferences(OpReferences& table);
void RegisterReductionReferences(OpReferences& table);
void RegisterViewReferences(OpReferences& table);
void RegisterIndexingReferences(OpReferences& table);
void RegisterCreationReferences(OpReferences& table);
void RegisterCompositeReferences(OpReferences& table);
void RegisterMatmulReferences(OpReferences& table);
void RegisterNormReferences(OpReferences& table);
void RegisterPoolingReferences(OpReferences& table);
void RegisterConvReferences(OpReferences& table);
void RegisterAttentionReferences(OpReferences& table);
void RegisterGatherScatterReferences(OpReferences& table);
void RegisterRandomReferences(OpReferences& table);
void RegisterSortReferences(OpReferences& table);

}  // namespace kiln

#endif  // KILN_COMPILER_OP_REFERENCE_H_
