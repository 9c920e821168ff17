#include "graph/host_tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "support/half.h"

namespace kiln {

namespace {
int64_t Product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}
std::vector<int64_t> ContiguousStridesOf(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}
}  // namespace

HostTensor HostTensor::Empty(DType dtype, std::vector<int64_t> sizes) {
  HostTensor t;
  t.dtype_ = dtype;
  t.strides_ = ContiguousStridesOf(sizes);
  t.storage_ = std::make_shared<Storage>(
      static_cast<size_t>(Product(sizes) * DTypeSize(dtype)),
      /*zero=*/true);
  t.sizes_ = std::move(sizes);
  return t;
}

HostTensor HostTensor::Uninitialized(DType dtype, std::vector<int64_t> sizes) {
  HostTensor t;
  t.dtype_ = dtype;
  t.strides_ = ContiguousStridesOf(sizes);
  t.storage_ = std::make_shared<Storage>(
      static_cast<size_t>(Product(sizes) * DTypeSize(dtype)),
      /*zero=*/false);
  t.sizes_ = std::move(sizes);
  return t;
}

HostTensor::Storage::Storage(size_t bytes, bool zero) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
  if (data_ == nullptr) throw std::bad_alloc();
  if (zero) std::memset(data_.get(), 0, rounded);
}

void HostTensor::Storage::Free::operator()(uint8_t* p) const { std::free(p); }

HostTensor HostTensor::View(const HostTensor& base, std::vector<int64_t> sizes,
                            std::vector<int64_t> strides, int64_t offset) {
  HostTensor t;
  t.dtype_ = base.dtype_;
  t.sizes_ = std::move(sizes);
  t.strides_ = std::move(strides);
  t.offset_ = offset;
  t.storage_ = base.storage_;
  return t;
}

HostTensor HostTensor::Strided(DType dtype, std::vector<int64_t> sizes,
                               std::vector<int64_t> strides, int64_t offset,
                               int64_t storage_elements) {
  HostTensor t;
  t.dtype_ = dtype;
  t.sizes_ = std::move(sizes);
  t.strides_ = std::move(strides);
  t.offset_ = offset;
  t.storage_ = std::make_shared<Storage>(
      static_cast<size_t>(storage_elements * DTypeSize(dtype)),
      /*zero=*/true);
  return t;
}

int64_t HostTensor::numel() const { return Product(sizes_); }

bool HostTensor::IsContiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (sizes_[i] != 1 && strides_[i] != expected) return false;
    expected *= sizes_[i];
  }
  return true;
}

int64_t HostTensor::ElementOffset(absl::Span<const int64_t> index) const {
  int64_t off = offset_;
  for (size_t d = 0; d < index.size(); ++d) off += index[d] * strides_[d];
  return off;
}

int64_t HostTensor::LinearToOffset(int64_t linear) const {
  int64_t off = offset_;
  for (int d = rank() - 1; d >= 0; --d) {
    const int64_t size = sizes_[d];
    off += (linear % size) * strides_[d];
    linear /= size;
  }
  return off;
}

double HostTensor::LoadDouble(int64_t eo) const {
  const uint8_t* p = storage_->data() + eo * DTypeSize(dtype_);
  switch (dtype_) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return HalfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return BFloat16ToFloat(h);
    }
    default:
      return static_cast<double>(LoadInt(eo));
  }
}

int64_t HostTensor::LoadInt(int64_t eo) const {
  const uint8_t* p = storage_->data() + eo * DTypeSize(dtype_);
  switch (dtype_) {
    case DType::kInt32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kInt64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::kBool:
      return *p != 0;
    default:
      return CastDoubleToInt(LoadDouble(eo), DType::kInt64);
  }
}

void HostTensor::StoreDouble(int64_t eo, double v) {
  uint8_t* p = storage_->data() + eo * DTypeSize(dtype_);
  switch (dtype_) {
    case DType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::kFloat16: {
      uint16_t h = FloatToHalf(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::kBFloat16: {
      uint16_t h = FloatToBFloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      return;
    }
    default:
      StoreInt(eo, CastDoubleToInt(v, dtype_));
      return;
  }
}

void HostTensor::StoreInt(int64_t eo, int64_t v) {
  uint8_t* p = storage_->data() + eo * DTypeSize(dtype_);
  switch (dtype_) {
    case DType::kInt32: {
      int32_t x = static_cast<int32_t>(WrapInt(v, dtype_));
      std::memcpy(p, &x, 4);
      return;
    }
    case DType::kInt64:
      std::memcpy(p, &v, 8);
      return;
    case DType::kBool:
      *p = v != 0;
      return;
    default:
      StoreDouble(eo, static_cast<double>(v));
      return;
  }
}

double HostTensor::GetDouble(absl::Span<const int64_t> i) const {
  return LoadDouble(ElementOffset(i));
}
int64_t HostTensor::GetInt(absl::Span<const int64_t> i) const {
  return LoadInt(ElementOffset(i));
}
void HostTensor::SetDouble(absl::Span<const int64_t> i, double v) {
  StoreDouble(ElementOffset(i), v);
}
void HostTensor::SetInt(absl::Span<const int64_t> i, int64_t v) {
  StoreInt(ElementOffset(i), v);
}
double HostTensor::GetDoubleAt(int64_t l) const {
  return LoadDouble(LinearToOffset(l));
}
int64_t HostTensor::GetIntAt(int64_t l) const {
  return LoadInt(LinearToOffset(l));
}
void HostTensor::SetDoubleAt(int64_t l, double v) {
  StoreDouble(LinearToOffset(l), v);
}
void HostTensor::SetIntAt(int64_t l, int64_t v) {
  StoreInt(LinearToOffset(l), v);
}

HostTensor HostTensor::Contiguous() const {
  HostTensor out = Empty(dtype_, sizes_);
  const int64_t n = numel();
  const int64_t es = DTypeSize(dtype_);
  for (int64_t l = 0; l < n; ++l) {
    std::memcpy(out.storage_->data() + l * es,
                storage_->data() + LinearToOffset(l) * es, es);
  }
  return out;
}

std::string HostTensor::ToString(int max_elements) const {
  std::string s = absl::StrCat(DTypeName(dtype_), "[");
  for (int d = 0; d < rank(); ++d) absl::StrAppend(&s, d ? "," : "", sizes_[d]);
  absl::StrAppend(&s, "] {");
  const int64_t n = numel();
  for (int64_t l = 0; l < n && l < max_elements; ++l) {
    if (l) absl::StrAppend(&s, ", ");
    if (IsFloating(dtype_))
      absl::StrAppend(&s, GetDoubleAt(l));
    else
      absl::StrAppend(&s, GetIntAt(l));
  }
  if (n > max_elements) absl::StrAppend(&s, ", ...");
  absl::StrAppend(&s, "}");
  return s;
}

int64_t CastDoubleToInt(double v, DType to) {
  if (to == DType::kBool) return v != 0;  // NaN != 0 is true
  int64_t i;
  if (std::isnan(v)) {
    i = 0;
  } else if (v >= 9223372036854775807.0 || v < -9223372036854775808.0) {
    i = std::numeric_limits<int64_t>::min();  // what x86 cvttsd2si yields
  } else {
    i = static_cast<int64_t>(v);
  }
  return WrapInt(i, to);
}

double RoundToDType(double v, DType to) {
  switch (to) {
    case DType::kFloat32:
      return static_cast<float>(v);
    case DType::kFloat16:
      return HalfToFloat(FloatToHalf(static_cast<float>(v)));
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(v)));
    default:
      return static_cast<double>(CastDoubleToInt(v, to));
  }
}

int64_t WrapInt(int64_t v, DType to) {
  switch (to) {
    case DType::kInt32:
      return static_cast<int32_t>(
          static_cast<uint32_t>(static_cast<uint64_t>(v)));
    case DType::kBool:
      return v != 0;
    default:
      return v;
  }
}

}  // namespace kiln
