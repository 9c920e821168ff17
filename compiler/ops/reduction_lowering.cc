// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "compiler/ops/lowering_util.h"
#include "compiler/op_lowering.h"

namespace kiln {

void RegisterReductionLowerings(OpLowerings& table) {}

}  // namespace kiln
