#include "compiler/ops/lowering_util.h"

namespace kiln::ops {

// PLACEHOLDER: LowerReductionOver and ReadKept move here from
// compiler/ops/reduction_old.cc.

}  // namespace kiln::ops
