// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "graph/ops/signature_util.h"

namespace kiln {

void RegisterViewSignatures(OpSignatures& table) {}

}  // namespace kiln
