#include "runtime/guards.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {

int64_t EvaluateSymPoly(const v1::SymPoly& p,
                        absl::Span<const int64_t> symbols) {
  uint64_t sum = 0;
  for (const v1::SymPoly::Term& t : p.terms()) {
    uint64_t prod = static_cast<uint64_t>(t.coeff());
    for (int s : t.symbols()) prod *= static_cast<uint64_t>(symbols[s]);
    sum += prod;
  }
  return static_cast<int64_t>(sum);
}

absl::Status CheckInputGuards(const v1::Artifact& artifact, int num_inputs,
                              absl::FunctionRef<GuardedTensor(int)> input,
                              absl::Span<int64_t> symbols) {
  const auto& guards = artifact.inputs();
  if (num_inputs != guards.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the graph takes ", guards.size(), " inputs, got ", num_inputs));
  }
  for (int s = 0; s < artifact.symbols_size(); ++s) {
    const v1::SymbolGuard& g = artifact.symbols(s);
    if (g.input() < 0) {
      symbols[s] = g.min_value();
      continue;
    }
    if (g.input() >= num_inputs) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: symbol ", g.name(), " is read from input ",
                       g.input(), " of ", num_inputs));
    }
    const GuardedTensor t = input(g.input());
    const int rank = static_cast<int>(t.sizes.size());
    if (g.dim() >= rank || g.dim() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", g.input(), " has rank ", rank, ", symbol ",
                       g.name(), " is its dim ", g.dim()));
    }
    const int64_t v = t.sizes[g.dim()];
    if (v < g.min_value() || (g.max_value() > 0 && v > g.max_value()) ||
        (g.multiple_of() > 1 && v % g.multiple_of() != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", g.input(), " dim ", g.dim(), ": size ", v,
          " violates the guard of symbol ", g.name(), " (>= ", g.min_value(),
          g.max_value() > 0 ? absl::StrCat(", <= ", g.max_value()) : "",
          g.multiple_of() > 1 ? absl::StrCat(", multiple of ", g.multiple_of())
                              : "",
          ")"));
    }
    symbols[s] = v;
  }
  for (int i = 0; i < num_inputs; ++i) {
    const v1::InputGuard& g = guards[i];
    const GuardedTensor t = input(i);
    const int rank = static_cast<int>(t.sizes.size());
    if (static_cast<int>(t.dtype) != static_cast<int>(g.dtype())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", i, ": dtype ", DTypeName(t.dtype), ", compiled for ",
          DTypeName(static_cast<DType>(g.dtype()))));
    }
    if (rank != g.sizes_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", i, ": rank ", rank, ", compiled for rank ",
                       g.sizes_size()));
    }
    bool empty = false;
    for (int d = 0; d < rank; ++d) {
      const int64_t want = EvaluateSymPoly(g.sizes(d), symbols);
      if (t.sizes[d] != want) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", i, ": size ", t.sizes[d], " of dim ", d,
                         ", compiled for ", want));
      }
      empty |= want == 0;
    }
    if (empty) continue;
    if (static_cast<int>(t.strides.size()) != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", i, ": ", t.strides.size(), " strides for rank ", rank));
    }
    for (int d = 0; d < rank; ++d) {
      if (t.sizes[d] == 1) continue;  // its stride is never used
      const int64_t want =
          d < g.strides_size() ? EvaluateSymPoly(g.strides(d), symbols) : 0;
      if (t.strides[d] != want) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", i, ": stride ", t.strides[d], " of dim ", d,
                         ", compiled for ", want));
      }
    }
    if (g.alignment() > 1 &&
        t.address % static_cast<uint64_t>(g.alignment()) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", i, ": data is not ", g.alignment(), "-byte aligned"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOutputMemory(size_t index, const GuardedTensor& tensor,
                               DType dtype, absl::Span<const int64_t> sizes) {
  if (tensor.dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", index, ": dtype ", DTypeName(tensor.dtype),
                     ", the program writes ", DTypeName(dtype)));
  }
  if (tensor.sizes != sizes || tensor.strides.size() != sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output ", index, ": sizes [", absl::StrJoin(tensor.sizes, ", "),
        "], the program writes [", absl::StrJoin(sizes, ", "), "]"));
  }
  int64_t numel = 1;
  for (int64_t size : sizes) numel *= size;
  // An empty output has no element to place: any strides will do (PyTorch
  // gives (4, 0) the strides (1, 1), contiguity as counted here (0, 1)).
  int64_t expected = 1;
  for (size_t d = sizes.size(); numel > 0 && d-- > 0;) {
    if (sizes[d] != 1 && tensor.strides[d] != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "output ", index, ": stride ", tensor.strides[d], " of dim ", d,
          ", the program writes contiguous outputs (stride ", expected, ")"));
    }
    expected *= sizes[d];
  }
  if (numel > 0 && tensor.address == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", index, ": no data pointer"));
  }
  return absl::OkStatus();
}

}  // namespace kiln
