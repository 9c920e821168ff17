// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "compiler/ops/reference_util.h"

namespace kiln {

void RegisterCompositeReferences(OpReferences& table) {}

}  // namespace kiln
