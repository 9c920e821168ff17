// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "compiler/ops/reference_util.h"

#include "compiler/ops/legacy.h"  // TRANSITIONAL

namespace kiln {

void RegisterCompositeReferences(OpReferences& table) {
  OpRegistry legacy(nullptr, &table, nullptr);  // TRANSITIONAL
  RegisterCompositeOps(legacy);
}

}  // namespace kiln
