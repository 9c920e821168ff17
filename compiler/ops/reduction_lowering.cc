// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "compiler/ops/lowering_util.h"
#include "compiler/op_lowering.h"

#include "compiler/ops/legacy.h"  // TRANSITIONAL

namespace kiln {

void RegisterReductionLowerings(OpLowerings& table) {
  OpRegistry legacy(nullptr, nullptr, &table);  // TRANSITIONAL
  RegisterReductionOps(legacy);
}

}  // namespace kiln
