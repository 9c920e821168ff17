// Comparing compiled results with the reference evaluator (reference.h),
// with per-dtype tolerances; and seeded random inputs for a graph. Shared by
// the tests (tests/unit/numerics.h) and `kilnctl compile --run`.
//
// Thread-safety: pure functions (RandomInputs/FillRandom use the caller's
// generator).
#ifndef KILN_COMPILER_NUMERICS_H_
#define KILN_COMPILER_NUMERICS_H_

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"

namespace kiln::numerics {

struct Tolerance {
  double rtol, atol;
};
inline Tolerance ToleranceFor(DType d) {
  switch (d) {
    case DType::kFloat32:
      return {2e-3, 2e-4};
    case DType::kFloat16:
      return {2e-2, 2e-3};
    case DType::kBFloat16:
      return {8e-2, 1e-2};
    default:
      return {0, 0};
  }
}

// Max error of `got` against `want`; empty string when within tolerance,
// else a description of the first mismatch.
inline std::string Compare(const HostTensor& got, const HostTensor& want,
                           double* max_err = nullptr) {
  if (got.dtype() != want.dtype()) {
    return absl::StrCat("dtype ", DTypeName(got.dtype()), " vs ",
                        DTypeName(want.dtype()));
  }
  if (got.sizes() != want.sizes())
    return absl::StrCat("sizes differ: ", got.ToString(0), " vs ",
                        want.ToString(0));
  const Tolerance tol = ToleranceFor(want.dtype());
  double worst = 0;
  std::string first;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (IsFloating(want.dtype())) {
      const double g = got.GetDoubleAt(i), w = want.GetDoubleAt(i);
      if (std::isnan(w) || std::isnan(g)) {
        if (std::isnan(w) != std::isnan(g) && first.empty()) {
          first = absl::StrCat("element ", i, ": got ", g, ", want ", w);
        }
        continue;
      }
      if (std::isinf(w) || std::isinf(g)) {
        if (g != w && first.empty())
          first = absl::StrCat("element ", i, ": got ", g, ", want ", w);
        continue;
      }
      const double err = std::fabs(g - w);
      worst = std::max(worst, err);
      if (err > tol.atol + tol.rtol * std::fabs(w) && first.empty()) {
        first = absl::StrCat("element ", i, ": got ", g, ", want ", w, " (err ",
                             err, ")");
      }
    } else {
      const int64_t g = got.GetIntAt(i), w = want.GetIntAt(i);
      worst = std::max(
          worst, std::fabs(static_cast<double>(g) - static_cast<double>(w)));
      if (g != w && first.empty())
        first = absl::StrCat("element ", i, ": got ", g, ", want ", w);
    }
  }
  if (max_err) *max_err = worst;
  return first;
}

// Random values for one tensor: floats in [-lo, hi], ints in a small range,
// bools half true.
inline void FillRandom(HostTensor& t, std::mt19937_64& rng, double lo = -2,
                       double hi = 2) {
  std::uniform_real_distribution<double> real(lo, hi);
  std::uniform_int_distribution<int64_t> small(-8, 8);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::kBool:
        t.SetIntAt(i, rng() & 1);
        break;
      case DType::kInt32:
      case DType::kInt64:
        t.SetIntAt(i, small(rng));
        break;
      default:
        t.SetDoubleAt(i, real(rng));
        break;
    }
  }
}

// Inputs for `graph` with symbols bound to `symbols`, honouring the
// declared strides (non-contiguous inputs get a strided storage).
inline std::vector<HostTensor> RandomInputs(const Graph& graph,
                                            const std::vector<int64_t>& symbols,
                                            std::mt19937_64& rng) {
  std::vector<HostTensor> inputs;
  for (const GraphInput& in : graph.inputs) {
    const TensorType& t = graph.type(in.value);
    std::vector<int64_t> sizes, strides;
    int64_t extent = 1;
    bool empty = false;
    for (int d = 0; d < t.rank(); ++d) {
      sizes.push_back(t.sizes[d].Evaluate(symbols));
      strides.push_back(in.strides[d].Evaluate(symbols));
      empty |= sizes.back() == 0;
      extent += (sizes.back() - 1) * strides.back();
    }
    HostTensor h =
        HostTensor::Strided(t.dtype, sizes, strides, 0, empty ? 0 : extent);
    FillRandom(h, rng);
    inputs.push_back(std::move(h));
  }
  return inputs;
}

}  // namespace kiln::numerics

#endif  // KILN_COMPILER_NUMERICS_H_
