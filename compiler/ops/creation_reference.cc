// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "compiler/ops/reference_util.h"

namespace kiln {

void RegisterCreationReferences(OpReferences& table) {}

}  // namespace kiln
