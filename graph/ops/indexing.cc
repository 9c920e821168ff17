// PLACEHOLDER: being converted from compiler/ops/*_old.cc.
#include "graph/ops/signature_util.h"

namespace kiln {

void RegisterIndexingSignatures(OpSignatures& table) {}

}  // namespace kiln
