#include "runtime/cuda_blaslt.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "runtime/cublaslt_api.h"
#include "runtime/dl_error.h"
#include "runtime/gpu_timing.h"

namespace kiln {


// The process-wide library: the handle from dlopen and the entry points.
class CublasLtLibrary {
 public:
  static absl::StatusOr<const CublasLtLibrary*> Get();
  const cublaslt::Api& api() const { return api_; }
  const std::string& name() const { return name_; }
  size_t version() const { return version_; }

  // OK, or INTERNAL "`call`: <cuBLASLt's status string> (<code>)".
  absl::Status Check(cublaslt::Status status, absl::string_view call) const {
    if (status == cublaslt::kSuccess) return absl::OkStatus();
    const char* text = api_.cublasLtGetStatusString != nullptr
                           ? api_.cublasLtGetStatusString(status)
                           : nullptr;
    return absl::InternalError(absl::StrCat(
        call, ": ", text != nullptr ? text : "cuBLASLt error", " (", status,
        ")"));
  }

 private:
  static absl::StatusOr<std::unique_ptr<CublasLtLibrary>> Load();
  static absl::StatusOr<std::unique_ptr<CublasLtLibrary>> Open(
      const char* library);
  cublaslt::Api api_{};
  std::string name_;
  size_t version_ = 0;
};

namespace {

// RAII for cuBLASLt's descriptor objects.
template <typename Handle>
class LtObject {
 public:
  LtObject() = default;
  LtObject(Handle h, cublaslt::Status (*destroy)(Handle))
      : h_(h), destroy_(destroy) {}
  LtObject(LtObject&& o) noexcept : h_(o.h_), destroy_(o.destroy_) {
    o.h_ = nullptr;
  }
  LtObject& operator=(LtObject&& o) noexcept {
    std::swap(h_, o.h_);
    std::swap(destroy_, o.destroy_);
    return *this;
  }
  ~LtObject() {
    if (h_ != nullptr) destroy_(h_);
  }
  Handle get() const { return h_; }

 private:
  Handle h_ = nullptr;
  cublaslt::Status (*destroy_)(Handle) = nullptr;
};

int DataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return cublaslt::kR32F;
    case DType::kFloat16:
      return cublaslt::kR16F;
    case DType::kBFloat16:
      return cublaslt::kR16BF;
    default:
      return -1;
  }
}

// Algorithms a plan's first call times: $KILN_GEMM_AUTOTUNE (0 or 1: the
// heuristic's first choice, untimed), else kDefaultAutotuneCandidates; at
// most kMaxAutotuneCandidates.
constexpr int kDefaultAutotuneCandidates = 8;
constexpr int kMaxAutotuneCandidates = 16;

int AutotuneCandidates() {
  const char* env = std::getenv("KILN_GEMM_AUTOTUNE");
  if (env == nullptr || *env == '\0') return kDefaultAutotuneCandidates;
  return std::clamp(std::atoi(env), 0, kMaxAutotuneCandidates);
}

// The largest power of two up to 256 that divides `address`.
uint32_t Alignment(cuda::DevicePtr address) {
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CublasLtLibrary>> CublasLtLibrary::Open(
    const char* library) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return absl::NotFoundError(DlError());
  // The library stays loaded for the process (like the driver): its
  // handles may be destroyed during static destruction.
  auto lib = std::unique_ptr<CublasLtLibrary>(new CublasLtLibrary());
  lib->name_ = library;
  std::vector<std::string> missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        dlsym(handle, name));
    if (fn == nullptr) missing.push_back(name);
  };
  cublaslt::Api& api = lib->api_;
#define KILN_RESOLVE(name) resolve(api.name, #name)
  KILN_RESOLVE(cublasLtCreate);
  KILN_RESOLVE(cublasLtDestroy);
  KILN_RESOLVE(cublasLtGetVersion);
  KILN_RESOLVE(cublasLtGetStatusString);
  KILN_RESOLVE(cublasLtMatmulDescCreate);
  KILN_RESOLVE(cublasLtMatmulDescDestroy);
  KILN_RESOLVE(cublasLtMatmulDescSetAttribute);
  KILN_RESOLVE(cublasLtMatrixLayoutCreate);
  KILN_RESOLVE(cublasLtMatrixLayoutDestroy);
  KILN_RESOLVE(cublasLtMatrixLayoutSetAttribute);
  KILN_RESOLVE(cublasLtMatmulPreferenceCreate);
  KILN_RESOLVE(cublasLtMatmulPreferenceDestroy);
  KILN_RESOLVE(cublasLtMatmulPreferenceSetAttribute);
  KILN_RESOLVE(cublasLtMatmulAlgoGetHeuristic);
  KILN_RESOLVE(cublasLtMatmul);
#undef KILN_RESOLVE
  if (!missing.empty()) {
    dlclose(handle);
    return absl::NotFoundError(
        absl::StrCat("missing ", absl::StrJoin(missing, ", ")));
  }
  lib->version_ = api.cublasLtGetVersion();
  return lib;
}

absl::StatusOr<std::unique_ptr<CublasLtLibrary>> CublasLtLibrary::Load() {
  std::vector<std::string> candidates = {"libcublasLt.so.13",
                                         "libcublasLt.so.12"};
  if (const char* env = std::getenv("KILN_CUBLASLT"); env && *env) {
    candidates = {env};
  }
  std::vector<std::string> tried;
  for (const std::string& c : candidates) {
    auto lib = Open(c.c_str());
    if (lib.ok()) return lib;
    tried.push_back(absl::StrCat(c, ": ", lib.status().message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "matrix products on CUDA need cuBLASLt, which could not be loaded "
      "(KILN_CUBLASLT names it): ",
      absl::StrJoin(tried, "; ")));
}

absl::StatusOr<const CublasLtLibrary*> CublasLtLibrary::Get() {
  // Process-wide, initialised once and thread-safely (a function-local
  // static), immutable afterwards; as cuda::Driver::Get.
  static const absl::StatusOr<std::unique_ptr<CublasLtLibrary>> loaded =
      Load();
  if (!loaded.ok()) return loaded.status();
  return loaded->get();
}

// cuBLASLt's epilogue for Kiln's, or 0 for an unknown one.
uint32_t LtEpilogue(v1::Gemm::Epilogue e) {
  switch (e) {
    case v1::Gemm::EPILOGUE_NONE:
      return cublaslt::kEpilogueDefault;
    case v1::Gemm::BIAS:
      return cublaslt::kEpilogueBias;
    case v1::Gemm::RELU:
      return cublaslt::kEpilogueRelu;
    case v1::Gemm::RELU_BIAS:
      return cublaslt::kEpilogueReluBias;
    case v1::Gemm::GELU_TANH:
      return cublaslt::kEpilogueGelu;
    case v1::Gemm::GELU_TANH_BIAS:
      return cublaslt::kEpilogueGeluBias;
    case v1::Gemm::BGRAD_B:  // the library's A is Kiln's B
      return cublaslt::kEpilogueBgradA;
    case v1::Gemm::BGRAD_A:  // and its B Kiln's A
      return cublaslt::kEpilogueBgradB;
    default:
      return 0;
  }
}

// The cache key of one call: step, dtype, sizes, layouts, options and the
// operands' address alignment (the heuristic's choice depends on each).
// shape() is all of it but the step: the steps of one shape share a timed
// algorithm choice.
struct CudaGemm::Key {
  std::string bytes;
  absl::string_view shape() const {
    return absl::string_view(bytes).substr(sizeof(int64_t));
  }
  Key(int step, DType dtype, const GemmDims& d, const Options& o,
      uint32_t align_a, uint32_t align_b, uint32_t align_c,
      uint32_t align_bias) {
    const int64_t values[] = {step,
                              o.epilogue,
                              o.deterministic,
                              o.tf32,
                              o.strict_reduction,
                              align_bias,
                              static_cast<int64_t>(dtype),
                              d.batch,
                              d.m,
                              d.n,
                              d.k,
                              d.a.ld,
                              d.a.batch_stride,
                              d.a.transposed,
                              d.b.ld,
                              d.b.batch_stride,
                              d.b.transposed,
                              d.c.ld,
                              d.c.batch_stride,
                              align_a,
                              align_b,
                              align_c};
    bytes.assign(reinterpret_cast<const char*>(values), sizeof(values));
  }
};

// What one key's calls use: the descriptors and the chosen algorithm.
struct CudaGemm::Plan {
  LtObject<cublaslt::Desc> desc;
  LtObject<cublaslt::Layout> a, b, c;  // the library's A, B and C/D
  cublaslt::Algo algo{};
  // The bias pointer is an attribute of `desc`: calls with a bias set it
  // and enqueue under this lock.
  mutable absl::Mutex bias_mu;
};

absl::StatusOr<std::unique_ptr<CudaGemm>> CudaGemm::Create() {
  absl::StatusOr<const CublasLtLibrary*> lib = CublasLtLibrary::Get();
  if (!lib.ok()) return lib.status();
  cublaslt::Handle handle = nullptr;
  if (absl::Status s =
          (*lib)->Check((*lib)->api().cublasLtCreate(&handle), "cublasLtCreate");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<CudaGemm>(
      new CudaGemm(*lib, handle, AutotuneCandidates()));
}

CudaGemm::~CudaGemm() {
  if (handle_ != nullptr) lib_->api().cublasLtDestroy(handle_);
}

const std::string& CudaGemm::library() const { return lib_->name(); }
size_t CudaGemm::version() const { return lib_->version(); }

const CudaGemm::Plan* CudaGemm::PlanFor(const Key& key) const {
  absl::MutexLock lock(&mu_);
  auto it = plans_.find(key.bytes);
  return it != plans_.end() ? it->second.get() : nullptr;
}

absl::Status CudaGemm::Run(int step, DType dtype, const GemmDims& d,
                           double alpha, double beta, cuda::DevicePtr a,
                           cuda::DevicePtr b, cuda::DevicePtr c,
                           cuda::DevicePtr workspace, size_t workspace_bytes,
                           cuda::Stream stream, const Options& options) const {
  const int type = DataType(dtype);
  if (type < 0) {
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt GEMM in ", DTypeName(dtype),
        ": Kiln calls it in float32, float16 and bfloat16"));
  }
  const uint32_t epilogue = LtEpilogue(options.epilogue);
  const bool has_bias = GemmEpilogueHasBias(options.epilogue);
  if (epilogue == 0 || has_bias != (options.bias != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuBLASLt GEMM: epilogue ", options.epilogue,
        has_bias ? " without a bias" : " is unknown or takes no bias"));
  }
  const bool bgrad_a = options.epilogue == v1::Gemm::BGRAD_A;
  if (GemmEpilogueWritesBias(options.epilogue) &&
      (d.batch != 1 || alpha != 1 || beta != 0 ||
       (bgrad_a ? !d.a.transposed : d.b.transposed))) {
    return absl::UnimplementedError(
        "cuBLASLt's bias gradients need batch 1, alpha 1, beta 0 and a "
        "row-major B (BGRAD_B) or a column-major A (BGRAD_A)");
  }
  const cuda::DevicePtr bias_ptr =
      has_bias ? options.bias + d.bias_offset * DTypeSize(dtype) : 0;
  if (d.batch == 0 || d.m == 0 || d.n == 0) return absl::OkStatus();
  const int64_t size = DTypeSize(dtype);
  const cuda::DevicePtr a_ptr = a + d.a.offset * size;
  const cuda::DevicePtr b_ptr = b + d.b.offset * size;
  const cuda::DevicePtr c_ptr = c + d.c.offset * size;
  if (d.k == 0) {
    // Nothing to sum: C = beta * C, which Kiln only asks for with beta 0
    // on a contiguous C (compiler/gemm_epilogue.h folds the other
    // epilogues only into products over a static k > 0); a bias gradient
    // is zeros too.
    const bool writes_bias = GemmEpilogueWritesBias(options.epilogue);
    if (beta != 0 ||
        (options.epilogue != v1::Gemm::EPILOGUE_NONE && !writes_bias) ||
        d.c.ld != d.n || (d.batch > 1 && d.c.batch_stride != d.m * d.n)) {
      return absl::UnimplementedError(
          "a cuBLASLt GEMM over k = 0 with beta != 0, an epilogue or a "
          "strided C");
    }
    absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
    if (!driver.ok()) return driver.status();
    if (writes_bias) {
      if (absl::Status s = (*driver)->Check(
              (*driver)->api().cuMemsetD8Async(
                  bias_ptr, 0,
                  static_cast<size_t>((bgrad_a ? d.m : d.n) * size), stream),
              "cuMemsetD8Async");
          !s.ok()) {
        return s;
      }
    }
    return (*driver)->Check(
        (*driver)->api().cuMemsetD8Async(
            c_ptr, 0, static_cast<size_t>(d.batch * d.m * d.n * size), stream),
        "cuMemsetD8Async");
  }
  const Key key(step, dtype, d, options, Alignment(a_ptr), Alignment(b_ptr),
                Alignment(c_ptr), has_bias ? Alignment(bias_ptr) : 0);
  const Plan* plan = PlanFor(key);
  const cublaslt::Api& api = lib_->api();
  if (plan == nullptr) {
    auto fresh = std::make_unique<Plan>();
    auto check = [&](cublaslt::Status s, const char* call) {
      return lib_->Check(s, call);
    };
    cublaslt::Desc desc = nullptr;
    const int compute = options.tf32 && dtype == DType::kFloat32
                            ? cublaslt::kComputeF32FastTf32
                            : cublaslt::kComputeF32;
    if (auto s = check(
            api.cublasLtMatmulDescCreate(&desc, compute, cublaslt::kR32F),
            "cublasLtMatmulDescCreate");
        !s.ok()) {
      return s;
    }
    fresh->desc = LtObject<cublaslt::Desc>(desc, api.cublasLtMatmulDescDestroy);
    if (options.epilogue != v1::Gemm::EPILOGUE_NONE) {
      if (auto s = check(
              api.cublasLtMatmulDescSetAttribute(desc, cublaslt::kDescEpilogue,
                                                 &epilogue, sizeof(epilogue)),
              "cublasLtMatmulDescSetAttribute(EPILOGUE)");
          !s.ok()) {
        return s;
      }
    }
    if (has_bias) {
      // Present for the heuristic; set again (under the plan's lock) for
      // every call.
      const void* bias = reinterpret_cast<const void*>(bias_ptr);
      if (auto s = check(api.cublasLtMatmulDescSetAttribute(
                             desc, cublaslt::kDescBiasPointer, &bias,
                             sizeof(bias)),
                         "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
          !s.ok()) {
        return s;
      }
    }
    // C^T = B^T A^T, column-major: the library's A is Kiln's B, read as
    // n x k (B row-major is B^T column-major; a transposed B needs op T).
    const int op_a = d.b.transposed ? cublaslt::kOpT : cublaslt::kOpN;
    const int op_b = d.a.transposed ? cublaslt::kOpT : cublaslt::kOpN;
    if (auto s = check(api.cublasLtMatmulDescSetAttribute(
                           desc, cublaslt::kDescTransA, &op_a, sizeof(op_a)),
                       "cublasLtMatmulDescSetAttribute(TRANSA)");
        !s.ok()) {
      return s;
    }
    if (auto s = check(api.cublasLtMatmulDescSetAttribute(
                           desc, cublaslt::kDescTransB, &op_b, sizeof(op_b)),
                       "cublasLtMatmulDescSetAttribute(TRANSB)");
        !s.ok()) {
      return s;
    }
    struct Shape {
      uint64_t rows, cols;
      int64_t ld, batch_stride;
      LtObject<cublaslt::Layout>* out;
    };
    const Shape shapes[] = {
        // Library A: Kiln's B (k x n), stored as n x k column-major, or as
        // k x n column-major when transposed.
        {d.b.transposed ? uint64_t(d.k) : uint64_t(d.n),
         d.b.transposed ? uint64_t(d.n) : uint64_t(d.k), d.b.ld,
         d.b.batch_stride, &fresh->a},
        // Library B: Kiln's A (m x k), as k x m, or m x k when transposed.
        {d.a.transposed ? uint64_t(d.m) : uint64_t(d.k),
         d.a.transposed ? uint64_t(d.k) : uint64_t(d.m), d.a.ld,
         d.a.batch_stride, &fresh->b},
        // C and D: C^T, n x m column-major.
        {uint64_t(d.n), uint64_t(d.m), d.c.ld, d.c.batch_stride, &fresh->c},
    };
    const int32_t batch = static_cast<int32_t>(d.batch);
    for (const Shape& sh : shapes) {
      cublaslt::Layout layout = nullptr;
      if (auto s = check(api.cublasLtMatrixLayoutCreate(&layout, type, sh.rows,
                                                        sh.cols, sh.ld),
                         "cublasLtMatrixLayoutCreate");
          !s.ok()) {
        return s;
      }
      *sh.out =
          LtObject<cublaslt::Layout>(layout, api.cublasLtMatrixLayoutDestroy);
      if (d.batch > 1) {
        if (auto s = check(api.cublasLtMatrixLayoutSetAttribute(
                               layout, cublaslt::kLayoutBatchCount, &batch,
                               sizeof(batch)),
                           "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
            !s.ok()) {
          return s;
        }
        if (auto s = check(
                api.cublasLtMatrixLayoutSetAttribute(
                    layout, cublaslt::kLayoutStridedBatchOffset,
                    &sh.batch_stride, sizeof(sh.batch_stride)),
                "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
            !s.ok()) {
          return s;
        }
      }
    }
    cublaslt::Pref pref_handle = nullptr;
    if (auto s = check(api.cublasLtMatmulPreferenceCreate(&pref_handle),
                       "cublasLtMatmulPreferenceCreate");
        !s.ok()) {
      return s;
    }
    LtObject<cublaslt::Pref> pref(pref_handle,
                                  api.cublasLtMatmulPreferenceDestroy);
    const uint64_t max_workspace = workspace_bytes;
    const uint32_t aligns[] = {Alignment(b_ptr), Alignment(a_ptr),
                               Alignment(c_ptr), Alignment(c_ptr)};
    const int align_attrs[] = {
        cublaslt::kPrefMinAlignmentA, cublaslt::kPrefMinAlignmentB,
        cublaslt::kPrefMinAlignmentC, cublaslt::kPrefMinAlignmentD};
    if (auto s = check(api.cublasLtMatmulPreferenceSetAttribute(
                           pref.get(), cublaslt::kPrefMaxWorkspaceBytes,
                           &max_workspace, sizeof(max_workspace)),
                       "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE)");
        !s.ok()) {
      return s;
    }
    if (options.strict_reduction) {
      // Split-K partial sums only in the compute type (float32); algorithms
      // without split-K (scheme NONE) stay allowed.
      const uint32_t mask = cublaslt::kReductionSchemeComputeType;
      if (auto s = check(
              api.cublasLtMatmulPreferenceSetAttribute(
                  pref.get(), cublaslt::kPrefReductionSchemeMask, &mask,
                  sizeof(mask)),
              "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
          !s.ok()) {
        return s;
      }
    }
    for (int i = 0; i < 4; ++i) {
      if (auto s = check(api.cublasLtMatmulPreferenceSetAttribute(
                             pref.get(), align_attrs[i], &aligns[i],
                             sizeof(aligns[i])),
                         "cublasLtMatmulPreferenceSetAttribute(ALIGNMENT)");
          !s.ok()) {
        return s;
      }
    }
    cublaslt::HeuristicResult results[kMaxAutotuneCandidates]{};
    int returned = 0;
    if (auto s = check(
            api.cublasLtMatmulAlgoGetHeuristic(
                handle_, desc, fresh->a.get(), fresh->b.get(), fresh->c.get(),
                fresh->c.get(), pref.get(),
                options.deterministic ? 1 : std::max(1, autotune_candidates_),
                results, &returned),
            "cublasLtMatmulAlgoGetHeuristic");
        !s.ok()) {
      return s;
    }
    std::vector<cublaslt::Algo> algos;
    for (int i = 0; i < returned; ++i) {
      if (results[i].state == cublaslt::kSuccess)
        algos.push_back(results[i].algo);
    }
    if (algos.empty()) {
      return absl::UnimplementedError(absl::StrCat(
          "cuBLASLt has no algorithm for this ", DTypeName(dtype),
          " GEMM (batch ", d.batch, ", m ", d.m, ", n ", d.n, ", k ", d.k,
          ", lda ", d.a.ld, ", ldb ", d.b.ld, ", ldc ", d.c.ld, ")"));
    }
    fresh->algo = algos[0];
    // (A deterministic call asked for the heuristic's first alone: nothing
    // to choose from.)
    std::optional<size_t> timed;
    if (!options.deterministic) {
      absl::MutexLock lock(&mu_);
      if (auto it = timed_.find(key.shape()); it != timed_.end())
        timed = it->second;
    }
    if (timed && *timed < algos.size()) {
      // Another step of this shape timed the same candidates.
      fresh->algo = algos[*timed];
    } else if (algos.size() > 1 && beta == 0) {
      // C is only written, so the candidates may run on the call's own
      // buffers before the call itself overwrites C.
      const float alpha_f = static_cast<float>(alpha), zero = 0;
      absl::StatusOr<size_t> fastest =
          FastestCandidate(algos.size(), stream, [&](size_t i) {
            const cublaslt::Algo& algo = algos[i];
            return cublaslt::kSuccess ==
                   api.cublasLtMatmul(
                       handle_, desc, &alpha_f,
                       reinterpret_cast<const void*>(b_ptr), fresh->a.get(),
                       reinterpret_cast<const void*>(a_ptr), fresh->b.get(),
                       &zero, reinterpret_cast<const void*>(c_ptr),
                       fresh->c.get(), reinterpret_cast<void*>(c_ptr),
                       fresh->c.get(), &algo,
                       reinterpret_cast<void*>(workspace), workspace_bytes,
                       stream);
          });
      if (!fastest.ok()) return fastest.status();
      fresh->algo = algos[*fastest];
      absl::MutexLock lock(&mu_);
      timed_.try_emplace(std::string(key.shape()), *fastest);
    }
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = plans_.try_emplace(key.bytes, std::move(fresh));  // NOLINT
    plan = it->second.get();
  }
  const float alpha_f = static_cast<float>(alpha);
  const float beta_f = static_cast<float>(beta);
  std::optional<absl::MutexLock> bias_lock;
  if (has_bias) {
    bias_lock.emplace(&plan->bias_mu);
    const void* bias = reinterpret_cast<const void*>(bias_ptr);
    if (absl::Status s = lib_->Check(
            api.cublasLtMatmulDescSetAttribute(
                plan->desc.get(), cublaslt::kDescBiasPointer, &bias,
                sizeof(bias)),
            "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
        !s.ok()) {
      return s;
    }
  }
  return lib_->Check(
      api.cublasLtMatmul(handle_, plan->desc.get(), &alpha_f,
                         reinterpret_cast<const void*>(b_ptr), plan->a.get(),
                         reinterpret_cast<const void*>(a_ptr), plan->b.get(),
                         &beta_f, reinterpret_cast<const void*>(c_ptr),
                         plan->c.get(), reinterpret_cast<void*>(c_ptr),
                         plan->c.get(), &plan->algo,
                         reinterpret_cast<void*>(workspace), workspace_bytes,
                         stream),
      "cublasLtMatmul");
}

}  // namespace kiln
