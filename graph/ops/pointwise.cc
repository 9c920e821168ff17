// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "graph/ops/signature_util.h"

#include "compiler/ops/legacy.h"  // TRANSITIONAL

namespace kiln {

void RegisterPointwiseSignatures(OpSignatures& table) {
  OpRegistry legacy(&table, nullptr, nullptr);  // TRANSITIONAL
  RegisterPointwiseOps(legacy);
}

}  // namespace kiln
