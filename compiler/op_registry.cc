#include "compiler/op_registry.h"

#include <algorithm>

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

const OpRegistry& OpRegistry::Get() {
  // Built once at first use and never mutated afterwards: the one registry
  // the style guide allows as global state.
  static const OpRegistry* const registry = [] {
    auto* r = new OpRegistry();  // intentionally leaked: lives for the process
    RegisterPointwiseOps(*r);
    RegisterReductionOps(*r);
    RegisterShapeOps(*r);
    RegisterCompositeOps(*r);
    return r;
  }();
  return *registry;
}

const OpDef* OpRegistry::Find(absl::string_view name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

std::vector<std::string> OpRegistry::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, def] : ops_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

void OpRegistry::Add(OpDef def) {
  std::string name = def.name;
  ops_[name] = std::make_unique<OpDef>(std::move(def));
}

}  // namespace kiln
