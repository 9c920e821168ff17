// The compiler's table of lowerings: for each op of the signature table
// (graph/op_signature.h), a named function that expresses the op in the
// loop IR (lower.h's LowerContext: loop nodes and index maps), the way
// Inductor's lowering.py registers one lowering per op.
//
// Adding an op: a function `Lower<Op>` and one line in the table of its
// family in compiler/ops/*_lowering.cc.
//
// Built once on first use, immutable afterwards; lookups are thread-safe.
#ifndef KILN_COMPILER_OP_LOWERING_H_
#define KILN_COMPILER_OP_LOWERING_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/op_table.h"
#include "compiler/lower.h"

namespace kiln {

using LowerFn =
    std::function<absl::StatusOr<std::vector<LoweredValue>>(LowerContext&)>;

// Find(op): nullptr when the op has none; Names(): sorted; Add(op, fn)
// while building only (a name added twice aborts).
class OpLowerings : public OpTable<LowerFn> {
 public:
  // The process-wide table, built on first call.
  static const OpLowerings& Get();
};

// Per-family tables, one per compiler/ops/*_lowering.cc.
void RegisterPointwiseLowerings(OpLowerings& table);
void RegisterReductionLowerings(OpLowerings& table);
void RegisterViewLowerings(OpLowerings& table);
void RegisterIndexingLowerings(OpLowerings& table);
void RegisterCreationLowerings(OpLowerings& table);
void RegisterCompositeLowerings(OpLowerings& table);
void RegisterMatmulLowerings(OpLowerings& table);
void RegisterNormLowerings(OpLowerings& table);
void RegisterPoolingLowerings(OpLowerings& table);
void RegisterConvLowerings(OpLowerings& table);
void RegisterAttentionLowerings(OpLowerings& table);
void RegisterGatherScatterLowerings(OpLowerings& table);
void RegisterRandomLowerings(OpLowerings& table);
void RegisterSortLowerings(OpLowerings& table);

}  // namespace kiln

#endif  // KILN_COMPILER_OP_LOWERING_H_
