// What Kiln's two users of cuDNN's backend (graph) API share: the library
// loaded with dlopen, RAII descriptors, the per-context handle, a builder
// that reads as a list of attribute settings, the engine choice and the
// variant pack. Internal to the CUDA runtime: runtime/cuda_cudnn.cc
// (convolutions) and runtime/cuda_attention.cc (fused attention).
//
// Thread-safety: CudnnLibrary::Get and SharedCudnnHandle from any thread;
// a CudnnGraphBuilder, CudnnPlans and CudnnVariantPack belong to one thread
// at a time (their callers hold the handle's run_mu where they touch the
// handle).
#ifndef KILN_RUNTIME_CUDNN_GRAPH_H_
#define KILN_RUNTIME_CUDNN_GRAPH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "graph/dtype.h"
#include "runtime/cuda_driver.h"
#include "runtime/cudnn_api.h"

namespace kiln {

// The process-wide library: the handle from dlopen and the entry points.
// Which library: $KILN_CUDNN when set (a path or soname), else
// libcudnn.so.9 (a process that has loaded PyTorch's cuDNN finds it by
// soname, no second copy).
class CudnnLibrary {
 public:
  // Loaded once per process. Errors: FAILED_PRECONDITION naming every
  // library tried and why.
  static absl::StatusOr<const CudnnLibrary*> Get();
  const cudnn::Api& api() const { return api_; }
  const std::string& name() const { return name_; }
  size_t version() const { return version_; }

  // OK, or INTERNAL "`call`: <cuDNN's status string> (<code>)".
  absl::Status Check(cudnn::Status status, absl::string_view call) const;

 private:
  static absl::StatusOr<std::unique_ptr<CudnnLibrary>> Load();
  static absl::StatusOr<std::unique_ptr<CudnnLibrary>> Open(
      const char* library);
  cudnn::Api api_{};
  std::string name_;
  size_t version_ = 0;
};

// RAII for one backend descriptor.
class CudnnDescriptor {
 public:
  CudnnDescriptor() = default;
  CudnnDescriptor(void* d, cudnn::Status (*destroy)(void*))
      : d_(d), destroy_(destroy) {}
  CudnnDescriptor(CudnnDescriptor&& o) noexcept
      : d_(o.d_), destroy_(o.destroy_) {
    o.d_ = nullptr;
  }
  CudnnDescriptor& operator=(CudnnDescriptor&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(destroy_, o.destroy_);
    return *this;
  }
  ~CudnnDescriptor() {
    if (d_ != nullptr) destroy_(d_);
  }
  void* get() const { return d_; }

 private:
  void* d_ = nullptr;
  cudnn::Status (*destroy_)(void*) = nullptr;
};

// A cuDNN handle and the lock that serializes binding it to a stream,
// enqueueing on it and making plans with it: one per CUDA context, shared
// by every executable's convolutions and attention on it.
struct CudnnHandle {
  const CudnnLibrary* lib = nullptr;
  cudnn::Handle handle = nullptr;
  absl::Mutex run_mu;
  ~CudnnHandle() {
    if (handle != nullptr) lib->api().cudnnDestroy(handle);
  }
};

// `context`'s handle (made by the first caller, destroyed with the last;
// runtime/per_context.h), or with a null context a handle of its own.
// Call with that context current. Errors: INTERNAL for a failed
// cudnnCreate.
absl::StatusOr<std::shared_ptr<CudnnHandle>> SharedCudnnHandle(
    const CudnnLibrary* lib, cuda::Context context);

// cuDNN's data type for `dtype` (float32, float16, bfloat16), or -1.
int CudnnDataType(DType dtype);

// Builds backend descriptors, recording the first failure (later calls do
// nothing), so that a graph reads as a list of attribute settings. Owns
// what it made until Release.
class CudnnGraphBuilder {
 public:
  explicit CudnnGraphBuilder(const CudnnLibrary* lib) : lib_(lib) {}

  // A new descriptor of `type` (null after a failure).
  void* Make(int type);
  void Set(void* d, int name, int type, int64_t count, const void* values);
  void SetInt64(void* d, int name, int64_t v) {
    Set(d, name, cudnn::kTypeInt64, 1, &v);
  }
  void SetDesc(void* d, int name, void* value) {
    Set(d, name, cudnn::kTypeBackendDescriptor, 1, &value);
  }
  void Finalize(void* d, absl::string_view what);

  // A finalized tensor descriptor with `sizes` and `strides` (row-major
  // when strides is empty).
  struct TensorSpec {
    int data_type = cudnn::kDataFloat;
    std::vector<int64_t> sizes, strides;
    int64_t uid = 0;
    int64_t alignment = 16;
    bool is_virtual = false;
    bool by_value = false;  // a host scalar bound in the variant pack
  };
  void* Tensor(const TensorSpec& spec);

  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }
  std::vector<CudnnDescriptor> Release() { return std::move(made_); }

 private:
  bool Check(cudnn::Status s, absl::string_view call);
  const CudnnLibrary* lib_;
  absl::Status status_;
  std::vector<CudnnDescriptor> made_;
};

// Row-major strides of `sizes`.
std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& sizes);

// Execution plans for a finalized operation graph: the engines cuDNN's
// heuristics rank (mode INSTANT, then FALLBACK), skipping those for which
// `skip(numerical notes)` is true, the first `wanted` that finalize.
struct CudnnPlans {
  std::vector<CudnnDescriptor> plans;
  // The heuristics' descriptors (the configs the plans hold): kept alive
  // with the plans.
  std::vector<CudnnDescriptor> keep;
  size_t workspace_bytes = 0;  // the largest plan's
  std::string rejected;        // why the first engine that failed did
};
absl::StatusOr<CudnnPlans> FinalizeCudnnPlans(
    const CudnnLibrary& lib, cudnn::Handle handle, void* graph,
    absl::FunctionRef<bool(absl::Span<const int> notes)> skip, size_t wanted);

// A variant pack kept while its pointers repeat (a caching allocator hands
// the same addresses step after step). Rebuilt by Bind when any differs.
class CudnnVariantPack {
 public:
  // Binds `pointers` (one per uid) and `workspace`. Errors: INTERNAL for a
  // cuDNN failure.
  absl::Status Bind(const CudnnLibrary& lib, absl::Span<const int64_t> uids,
                    absl::Span<void* const> pointers, void* workspace);
  void* get() const { return pack_.get(); }

 private:
  CudnnDescriptor pack_;
  std::vector<void*> pointers_;
};

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDNN_GRAPH_H_
