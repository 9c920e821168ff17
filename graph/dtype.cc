#include "graph/dtype.h"

namespace kiln {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

std::optional<DType> DTypeFromWire(int wire_value) {
  if (wire_value < 1 || wire_value > 6) return std::nullopt;
  return static_cast<DType>(wire_value);
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 1;
}

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kBool) return b;
  if (b == DType::kBool) return a;
  const bool fa = IsFloating(a), fb = IsFloating(b);
  if (fa && fb) {
    // float16 with bfloat16 meets at float32; float32 wins over either.
    return DType::kFloat32;
  }
  if (fa) return a;
  if (fb) return b;
  return DType::kInt64;  // int32 with int64
}

namespace {
std::optional<DType> PromoteOpt(std::optional<DType> acc, DType d) {
  return acc ? PromoteTypes(*acc, d) : d;
}
// c10's combine_categories: `higher` (from a higher-priority class) wins
// unless `lower` is of a higher category.
std::optional<DType> CombineCategories(std::optional<DType> higher,
                                       std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (IsFloating(*higher)) return higher;
  if (*higher == DType::kBool || IsFloating(*lower)) {
    return PromoteTypes(*higher, *lower);
  }
  return higher;
}
}  // namespace

void ResultTypeState::AddTensor(DType dtype, bool zero_dim) {
  if (zero_dim) {
    zero_dim_ = PromoteOpt(zero_dim_, dtype);
  } else {
    dim_ = PromoteOpt(dim_, dtype);
  }
}

void ResultTypeState::AddScalar(DType scalar_kind) {
  wrapped_ = PromoteOpt(wrapped_,
                        IsFloating(scalar_kind) ? kDefaultFloat : scalar_kind);
}

DType ResultTypeState::Result() const {
  return CombineCategories(dim_, CombineCategories(zero_dim_, wrapped_))
      .value_or(kDefaultFloat);
}

}  // namespace kiln
