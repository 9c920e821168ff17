// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "graph/ops/signature_util.h"

#include "compiler/ops/legacy.h"  // TRANSITIONAL

namespace kiln {

void RegisterReductionSignatures(OpSignatures& table) {
  OpRegistry legacy(&table, nullptr, nullptr);  // TRANSITIONAL
  RegisterReductionOps(legacy);
}

}  // namespace kiln
