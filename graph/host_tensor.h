// A strided tensor in host memory: the reference evaluator's values and the
// way tests hand inputs to it. Views share storage.
//
// Thread-safety: a HostTensor may be read concurrently; writes need external
// synchronisation (storage is shared between views).
#ifndef KILN_GRAPH_HOST_TENSOR_H_
#define KILN_GRAPH_HOST_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "graph/dtype.h"

namespace kiln {

class HostTensor {
 public:
  HostTensor() = default;
  // A new contiguous tensor, zero-filled.
  static HostTensor Empty(DType dtype, std::vector<int64_t> sizes);
  // A new contiguous tensor whose elements are not initialised: for outputs
  // that a kernel overwrites (saves a memory pass over Empty).
  static HostTensor Uninitialized(DType dtype, std::vector<int64_t> sizes);
  // A view of `base`'s storage with other sizes/strides/offset (elements).
  static HostTensor View(const HostTensor& base, std::vector<int64_t> sizes,
                         std::vector<int64_t> strides, int64_t offset);
  // A tensor over a new storage of `storage_elements` elements with the
  // given strides, so tests can build non-contiguous inputs.
  static HostTensor Strided(DType dtype, std::vector<int64_t> sizes,
                            std::vector<int64_t> strides, int64_t offset,
                            int64_t storage_elements);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int rank() const { return static_cast<int>(sizes_.size()); }
  int64_t numel() const;
  bool IsContiguous() const;

  // Element access by multi-index. Floating dtypes read as double; integral
  // and bool as int64 (GetInt) — GetDouble converts either way.
  double GetDouble(absl::Span<const int64_t> index) const;
  int64_t GetInt(absl::Span<const int64_t> index) const;
  // Writes with the dtype's rounding (RNE for float16/bfloat16, wrap-around
  // for narrower ints, nonzero -> true for bool).
  void SetDouble(absl::Span<const int64_t> index, double v);
  void SetInt(absl::Span<const int64_t> index, int64_t v);

  // Element access by linear (row-major logical) position.
  double GetDoubleAt(int64_t linear) const;
  int64_t GetIntAt(int64_t linear) const;
  void SetDoubleAt(int64_t linear, double v);
  void SetIntAt(int64_t linear, int64_t v);

  // A contiguous copy.
  HostTensor Contiguous() const;
  // Raw storage, for tests and runtimes that pass pointers.
  uint8_t* data() {
    return storage_ ? storage_->data() + offset_ * DTypeSize(dtype_) : nullptr;
  }
  const uint8_t* data() const {
    return storage_ ? storage_->data() + offset_ * DTypeSize(dtype_) : nullptr;
  }

  std::string ToString(int max_elements = 32) const;

 private:
  int64_t ElementOffset(absl::Span<const int64_t> index) const;
  int64_t LinearToOffset(int64_t linear) const;
  double LoadDouble(int64_t element_offset) const;
  int64_t LoadInt(int64_t element_offset) const;
  void StoreDouble(int64_t element_offset, double v);
  void StoreInt(int64_t element_offset, int64_t v);

  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> sizes_, strides_;
  int64_t offset_ = 0;
  // Bytes shared between views, 64-byte aligned (vector loads, cache lines).
  class Storage {
   public:
    Storage(size_t bytes, bool zero);
    uint8_t* data() { return data_.get(); }

   private:
    struct Free {
      void operator()(uint8_t* p) const;
    };
    std::unique_ptr<uint8_t, Free> data_;
  };
  std::shared_ptr<Storage> storage_;
};

// Casts as PyTorch's .to(dtype) does on CPU: float -> int truncates toward
// zero (NaN -> 0, out of range saturates to the int64 limit then wraps to
// the narrower type), anything -> bool is `!= 0`.
int64_t CastDoubleToInt(double v, DType to);
// Rounds a double to what `to` can hold (float32/float16/bfloat16 RNE).
double RoundToDType(double v, DType to);
// Wraps an int64 to `to`'s width (int32 wraps, bool is != 0).
int64_t WrapInt(int64_t v, DType to);

}  // namespace kiln

#endif  // KILN_GRAPH_HOST_TENSOR_H_
