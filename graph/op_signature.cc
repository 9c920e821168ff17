#include "graph/op_signature.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status OpContext::Invalid(absl::string_view message) const {
  return absl::InvalidArgumentError(
      absl::StrCat("node ", node_index_, " (", node_.op->name, "): ", message));
}

absl::StatusOr<int> OpContext::WrapDim(int64_t dim, int rank) const {
  const int64_t r = std::max(rank, 1);  // a 0-d tensor accepts dims -1 and 0
  if (dim < -r || dim >= r) {
    return Invalid(absl::StrCat("dim ", dim,
                                " is out of range for a tensor of rank ", rank,
                                " (expected [", -r, ", ", r - 1, "])"));
  }
  return static_cast<int>(dim < 0 ? dim + r : dim);
}

const OpSignatures& OpSignatures::Get() {
  // Built once at first use and never mutated afterwards: a registry built
  // at start-up, the one kind of global state the style guide allows.
  static const OpSignatures* const table = [] {
    auto table = std::make_unique<OpSignatures>();
    RegisterPointwiseSignatures(*table);
    RegisterReductionSignatures(*table);
    RegisterViewSignatures(*table);
    RegisterIndexingSignatures(*table);
    RegisterCreationSignatures(*table);
    RegisterCompositeSignatures(*table);
    RegisterMatmulSignatures(*table);
    RegisterNormSignatures(*table);
    RegisterPoolingSignatures(*table);
    RegisterConvSignatures(*table);
    RegisterAttentionSignatures(*table);
    RegisterGatherScatterSignatures(*table);
    RegisterRandomSignatures(*table);
    RegisterSortSignatures(*table);
    return table.release();  // lives for the process
  }();
  return *table;
}

}  // namespace kiln
