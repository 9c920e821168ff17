#include "runtime/cpu_blas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace {

// CBLAS's enum values (cblas.h).
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

std::string DlError() {
  const char* message = dlerror();
  return message != nullptr ? message : "unknown dlopen error";
}

// C[i] = beta * C[i] for a product with nothing to sum (k = 0).
template <typename T>
void ScaleC(const GemmDims& d, double beta, T* c) {
  for (int64_t i = 0; i < d.batch; ++i) {
    T* base = c + d.c.offset + i * d.c.batch_stride;
    for (int64_t r = 0; r < d.m; ++r) {
      T* row = base + r * d.c.ld;
      for (int64_t j = 0; j < d.n; ++j)
        row[j] = beta == 0 ? T(0) : static_cast<T>(beta * row[j]);
    }
  }
}

template <typename T, typename Fn>
void BatchedGemm(Fn gemm, const GemmDims& d, double alpha, double beta,
                 const T* a, const T* b, T* c) {
  if (d.batch == 0 || d.m == 0 || d.n == 0) return;
  if (d.k == 0) {
    ScaleC(d, beta, c);
    return;
  }
  for (int64_t i = 0; i < d.batch; ++i) {
    gemm(kRowMajor, d.a.transposed ? kTrans : kNoTrans,
         d.b.transposed ? kTrans : kNoTrans, static_cast<int>(d.m),
         static_cast<int>(d.n), static_cast<int>(d.k), static_cast<T>(alpha),
         a + d.a.offset + i * d.a.batch_stride, static_cast<int>(d.a.ld),
         b + d.b.offset + i * d.b.batch_stride, static_cast<int>(d.b.ld),
         static_cast<T>(beta), c + d.c.offset + i * d.c.batch_stride,
         static_cast<int>(d.c.ld));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBlas>> CpuBlas::Open() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KILN_BLAS"); env != nullptr && *env) {
    candidates.push_back(env);
  } else {
    candidates = {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"};
  }
  std::vector<std::string> failures;
  for (const std::string& name : candidates) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      failures.push_back(DlError());
      continue;
    }
    void* s = dlsym(handle, "cblas_sgemm");
    if (s == nullptr) {
      failures.push_back(absl::StrCat(name, ": no cblas_sgemm"));
      dlclose(handle);
      continue;
    }
    std::unique_ptr<CpuBlas> blas(new CpuBlas());  // private constructor
    blas->handle_ = handle;
    blas->library_ = name;
    blas->sgemm_ = reinterpret_cast<SgemmFn>(s);
    return blas;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no CBLAS to run matrix products on the CPU (install OpenBLAS, e.g. "
      "Debian's libopenblas0-pthread, or set KILN_BLAS): ",
      absl::StrJoin(failures, "; ")));
}

absl::StatusOr<const CpuBlas*> CpuBlas::Get() {
  // Process-wide, initialised once (a function-local static), immutable
  // afterwards.
  static const absl::StatusOr<std::unique_ptr<CpuBlas>> loaded = Open();
  if (!loaded.ok()) return loaded.status();
  return loaded->get();
}

CpuBlas::~CpuBlas() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::Status CpuBlas::Gemm(DType dtype, const GemmDims& dims, double alpha,
                           double beta, const void* a, const void* b,
                           void* c) const {
  if (dtype != DType::kFloat32) {
    return absl::UnimplementedError(absl::StrCat(
        "CPU matrix products of ", DTypeName(dtype), " (float32 only)"));
  }
  BatchedGemm<float>(sgemm_, dims, alpha, beta, static_cast<const float*>(a),
                     static_cast<const float*>(b), static_cast<float*>(c));
  return absl::OkStatus();
}

}  // namespace kiln
