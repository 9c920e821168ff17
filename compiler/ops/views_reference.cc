// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "compiler/ops/reference_util.h"

#include "compiler/ops/legacy.h"  // TRANSITIONAL

namespace kiln {

void RegisterViewReferences(OpReferences& table) {
  OpRegistry legacy(nullptr, &table, nullptr);  // TRANSITIONAL
  RegisterShapeOps(legacy);
}

}  // namespace kiln
