// Element types and PyTorch's type-promotion lattice over Kiln's dtypes.
//
// Thread-safety: pure functions.
#ifndef KILN_GRAPH_DTYPE_H_
#define KILN_GRAPH_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace kiln {

// Numbering matches kiln.v1.DType on the wire.
enum class DType : uint8_t {
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kBool = 6,
};

inline constexpr DType kAllDTypes[] = {DType::kFloat32,  DType::kFloat16,
                                       DType::kBFloat16, DType::kInt32,
                                       DType::kInt64,    DType::kBool};

// torch's spelling: "float32", "float16", "bfloat16", "int32", "int64", "bool".
absl::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromWire(int wire_value);
int64_t DTypeSize(DType dtype);

inline bool IsFloating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
}
inline bool IsIntegral(DType d) {
  return d == DType::kInt32 || d == DType::kInt64;
}
// Integral including bool (torch.is_integral(include_bool=True)).
inline bool IsIntegralOrBool(DType d) {
  return IsIntegral(d) || d == DType::kBool;
}

// torch.promote_types restricted to Kiln's dtypes.
DType PromoteTypes(DType a, DType b);

// The default float dtype (torch.get_default_dtype()): int and bool inputs of
// floating ops (exp, div, mean ...) produce this.
inline constexpr DType kDefaultFloat = DType::kFloat32;

// PyTorch's result_type over a mix of operands. Dimensioned tensors take
// priority over zero-dim tensors, which take priority over Python scalars,
// unless a lower-priority operand is of a higher category
// (bool < integral < floating). Mirrors c10's ResultTypeState.
class ResultTypeState {
 public:
  void AddTensor(DType dtype, bool zero_dim);
  // A Python scalar: float scalars count as the default float dtype, int
  // scalars as int64, bool scalars as bool.
  void AddScalar(DType scalar_kind);
  // Returns the result dtype; requires at least one operand.
  DType Result() const;

 private:
  std::optional<DType> dim_, zero_dim_, wrapped_;
};

}  // namespace kiln

#endif  // KILN_GRAPH_DTYPE_H_
