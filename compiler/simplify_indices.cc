#include "compiler/simplify_indices.h"

#include <optional>
#include <utility>
#include <vector>

namespace kiln {

FusedProgram SimplifyIndices(FusedProgram program) {
  for (Kernel& k : program.kernels) {
    if (k.is_extern()) continue;
    std::vector<std::optional<ir::IndexRange>> ranges(k.dims.size());
    bool empty = false;
    for (size_t d = 0; d < k.dims.size(); ++d) {
      const std::optional<int64_t> size = k.dims[d].AsConstant();
      if (!size) continue;
      if (*size <= 0) empty = true;
      ranges[d] = ir::IndexRange{0, *size - 1};
    }
    if (empty) continue;  // runs no element
    for (Stage& st : k.stages) {
      st.value = ir::SimplifyIndex(st.value, ranges);
      st.offset = ir::SimplifyIndex(st.offset, ranges);
      st.finalize = ir::SimplifyIndex(st.finalize, ranges);
    }
  }
  return program;
}

}  // namespace kiln
