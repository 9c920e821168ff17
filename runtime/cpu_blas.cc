#include "runtime/cpu_blas.h"

#include <cpuid.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/dl_error.h"
#include "support/half.h"

namespace kiln {
namespace {

// CBLAS's enum values (cblas.h).
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

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

// Rows of C per block when a GEMM is spread over a pool: enough work per
// call for the BLAS's kernels (at least ~2^18 multiply-adds: with 2^21,
// BERT's 512x64x64 products ran on one thread, and its two executables
// took 5.2-5.3 ms per step against 4.5-4.9 with 2^18; bench/README.md,
// session 18).
int64_t RowsPerBlock(const GemmDims& d, int64_t threads) {
  const int64_t min_rows = std::max<int64_t>(
      16, (int64_t{1} << 18) / std::max<int64_t>(1, d.n * d.k));
  const int64_t per_thread = (d.m + threads - 1) / threads;
  return std::max(min_rows, per_thread);
}

// With whole_products, a task is one product of the batch (no row blocks).
// In: A's and B's element type; T: C's (and alpha's and beta's).
template <typename T, typename Fn, typename In = T>
void BatchedGemm(Fn gemm, const GemmDims& d, double alpha, double beta,
                 const In* a, const In* b, T* c, ThreadPool* pool,
                 bool whole_products = false) {
  if (d.batch == 0 || d.m == 0 || d.n == 0) return;
  if (d.k == 0) {
    ScaleC(d, beta, c);
    return;
  }
  const int64_t threads = pool != nullptr ? pool->size() : 1;
  const int64_t rows = whole_products ? d.m : RowsPerBlock(d, threads);
  const int64_t row_blocks = (d.m + rows - 1) / rows;
  // Row r of A starts r * lda in (row-major) or r in (a transpose); of C,
  // r * ldc.
  const int64_t a_row_step = d.a.transposed ? 1 : d.a.ld;
  auto block = [&](int64_t task) {
    const int64_t i = task / row_blocks;
    const int64_t r0 = (task % row_blocks) * rows;
    const int64_t m = std::min(rows, d.m - r0);
    gemm(kRowMajor, d.a.transposed ? kTrans : kNoTrans,
         d.b.transposed ? kTrans : kNoTrans, static_cast<int>(m),
         static_cast<int>(d.n), static_cast<int>(d.k), static_cast<T>(alpha),
         a + d.a.offset + i * d.a.batch_stride + r0 * a_row_step,
         static_cast<int>(d.a.ld), b + d.b.offset + i * d.b.batch_stride,
         static_cast<int>(d.b.ld), static_cast<T>(beta),
         c + d.c.offset + i * d.c.batch_stride + r0 * d.c.ld,
         static_cast<int>(d.c.ld));
  };
  const int64_t tasks = d.batch * row_blocks;
  if (pool == nullptr || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) block(t);
  } else {
    pool->ParallelFor(tasks, block);
  }
}

// OpenBLAS picks its kernels from the CPUID model, which virtual machines
// often report as a generic "Intel Xeon Processor": it then runs a generic
// kernel at a fifth of the speed (bench/python/cpu_gemm.py: 16 against 80
// GFLOP/s at 1024^3 on the 2-core dev machine). Unless the user chose
// (OPENBLAS_CORETYPE set), the core type follows the CPU's features; it must
// be set before the library initialises.
void ChooseOpenBlasCoreType() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    core = "SKYLAKEX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "HASWELL";
  }
  if (core != nullptr) setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/0);
}

constexpr char kTorchLibrary[] = "libtorch_cpu.so";

// PyTorch's library, when this process has loaded it (RTLD_NOLOAD: never
// loads it), else null.
void* LoadedPyTorch() {
  const char* env = std::getenv("KILN_TORCH_MKL");
  if (env != nullptr && std::string(env) == "0") return nullptr;
  return dlopen(kTorchLibrary, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBlas>> CpuBlas::Open() {
  ChooseOpenBlasCoreType();
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KILN_BLAS"); env != nullptr && *env) {
    candidates.push_back(env);
  } else {
    if (void* torch = LoadedPyTorch()) {
      // A second reference to the loaded library: dlopen by name below
      // finds the same one.
      dlclose(torch);
      candidates.push_back(kTorchLibrary);
    }
    // oneDNN first (KILN_ONEDNN names another copy, 0 skips it), as the
    // CPU convolutions (cpu_conv.h).
    const char* onednn = std::getenv("KILN_ONEDNN");
    if (onednn == nullptr || !*onednn) {
      candidates.push_back("libdnnl.so.2");
    } else if (std::string(onednn) != "0") {
      candidates.push_back(onednn);
    }
    for (const char* name :
         {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"}) {
      candidates.push_back(name);
    }
  }
  std::vector<std::string> failures;
  for (const std::string& name : candidates) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      failures.push_back(DlError());
      continue;
    }
    std::unique_ptr<CpuBlas> blas(new CpuBlas());  // private constructor
    blas->handle_ = handle;
    blas->library_ = name;
    if (void* s = dlsym(handle, "dnnl_sgemm")) {
      blas->dnnl_sgemm_ = reinterpret_cast<DnnlSgemmFn>(s);
      // Exported by oneDNN since 1.x (its gemm tests declare it).
      void* bf = dlsym(handle, "dnnl_gemm_bf16bf16f32");
      if (bf != nullptr && OneDnnBf16Allowed())
        blas->dnnl_gemm_bf16_ = reinterpret_cast<DnnlGemmBf16Fn>(bf);
      return blas;
    }
    void* mkl = dlsym(handle, "SGEMM_64");
    if (mkl == nullptr && name == kTorchLibrary) {
      // A PyTorch without MKL (aarch64's wheels): its BLAS is PyTorch's own
      // business (threads included), so the next library is tried.
      failures.push_back(absl::StrCat(name, ": no SGEMM_64 (MKL)"));
      blas->handle_ = nullptr;
      dlclose(handle);
      continue;
    }
    if (void* s = mkl) {
      blas->mkl_sgemm_ = reinterpret_cast<MklSgemmFn>(s);
      void* bf = dlsym(handle, "cblas_gemm_bf16bf16f32");
      if (bf != nullptr && OneDnnBf16Allowed())
        blas->mkl_gemm_bf16_ = reinterpret_cast<MklGemmBf16Fn>(bf);
      return blas;
    }
    if (void* s = dlsym(handle, "cblas_sgemm")) {
      // Kiln's pool runs the cores (Gemm): the BLAS computes on the calling
      // thread.
      using SetThreadsFn = void (*)(int);
      if (void* set = dlsym(handle, "openblas_set_num_threads"))
        reinterpret_cast<SetThreadsFn>(set)(1);
      blas->sgemm_ = reinterpret_cast<SgemmFn>(s);
      return blas;
    }
    failures.push_back(absl::StrCat(name, ": no dnnl_sgemm or cblas_sgemm"));
    blas->handle_ = nullptr;
    dlclose(handle);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no BLAS to run matrix products on the CPU (install oneDNN or "
      "OpenBLAS, e.g. Debian's libdnnl2 or libopenblas0-pthread, or set "
      "KILN_BLAS): ",
      absl::StrJoin(failures, "; ")));
}

absl::StatusOr<const CpuBlas*> CpuBlas::Get() {
  // Process-wide, initialised once (a function-local static), immutable
  // afterwards.
  static const absl::StatusOr<std::unique_ptr<CpuBlas>> loaded = Open();
  if (!loaded.ok()) return loaded.status();
  return loaded->get();
}

absl::Status CpuBlas::Prepare() {
  absl::StatusOr<const CpuBlas*> blas = Get();
  if (!blas.ok()) return blas.status();
  constexpr int64_t kN = 8;
  std::vector<float> a(kN * kN, 1.0f), b(kN * kN, 1.0f), c(kN * kN, 0.0f);
  GemmDims dims;
  dims.batch = 1;
  dims.m = dims.n = dims.k = kN;
  dims.a.ld = dims.b.ld = dims.c.ld = kN;
  return (*blas)->Gemm(DType::kFloat32, dims, 1.0, 0.0, a.data(), b.data(),
                       c.data());
}

namespace {

// Whether the CPU multiplies bfloat16 tiles in hardware (AMX-BF16: CPUID
// leaf 7, EDX bit 22).
bool CpuHasAmxBf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx >> 22) & 1;
}

}  // namespace

bool CpuBlas::LibraryBf16Gemm(const GemmDims& dims) {
  // -1: never (KILN_ONEDNN_BF16=0); 1: always (set otherwise, or AMX); 0: by
  // size.
  static const int policy = [] {
    const char* env = std::getenv("KILN_ONEDNN_BF16");
    if (env != nullptr && *env) return std::string(env) != "0" ? 1 : -1;
    return CpuHasAmxBf16() ? 1 : 0;
  }();
  if (policy != 0) return policy > 0;
  // Below 2^26 multiply-adds the widening's passes cost more than the
  // library's slower products gain (cpu_gemm.py --shapes --dtype bfloat16,
  // session 37: 136x192x768 0.81x eager widened against 0.88-0.93x through
  // the libraries, 512x768x768 1.42x against 0.96-1.02x).
  return static_cast<double>(dims.m) * dims.n * dims.k < double{1 << 26};
}

bool CpuBlas::OneDnnBf16Allowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("KILN_ONEDNN_BF16");
    return env == nullptr || std::string(env) != "0";
  }();
  return allowed;
}

CpuBlas::~CpuBlas() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::Status CpuBlas::Gemm(DType dtype, const GemmDims& dims, double alpha,
                           double beta, const void* a, const void* b, void* c,
                           ThreadPool* pool) const {
  if (dtype != DType::kFloat32) {
    return absl::UnimplementedError(absl::StrCat(
        "CPU matrix products of ", DTypeName(dtype), " (float32 only)"));
  }
  const auto* fa = static_cast<const float*>(a);
  const auto* fb = static_cast<const float*>(b);
  auto* fc = static_cast<float*>(c);
  if (sgemm_ != nullptr) {
    BatchedGemm<float>(sgemm_, dims, alpha, beta, fa, fb, fc, pool);
    return absl::OkStatus();
  }
  if (mkl_sgemm_ != nullptr) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
    // operands swap, and so do m and n. MKL threads each call itself.
    auto mkl = [&](int, int ta, int tb, int m, int n, int k, float al,
                   const float* pa, int lda, const float* pb, int ldb, float be,
                   float* pc, int ldc) {
      const char ca = ta == kTrans ? 'T' : 'N', cb = tb == kTrans ? 'T' : 'N';
      const int64_t cm = n, cn = m, ck = k, la = ldb, lb = lda, lc = ldc;
      mkl_sgemm_(&cb, &ca, &cm, &cn, &ck, &al, pb, &la, pa, &lb, &be, pc, &lc);
    };
    BatchedGemm<float>(mkl, dims, alpha, beta, fa, fb, fc, nullptr,
                       /*whole_products=*/true);
    return absl::OkStatus();
  }
  // oneDNN threads a call itself over the process's OpenMP threads (a
  // PyTorch process's own) and runs it on one thread inside a parallel
  // region. Where the pool is those OpenMP threads, its row blocks are
  // single-threaded calls as a CBLAS's are (one call that oneDNN splits
  // itself was no faster overall: bench/README.md, session 19). On a pool of Kiln's own threads each call
  // would start a team of its own, so the products are called one after
  // the other from here, each threaded by oneDNN.
  std::atomic<int> failed{0};
  auto dnnl = [&](int, int ta, int tb, int m, int n, int k, float al,
                  const float* pa, int lda, const float* pb, int ldb, float be,
                  float* pc, int ldc) {
    const int status =
        dnnl_sgemm_(ta == kTrans ? 'T' : 'N', tb == kTrans ? 'T' : 'N', m, n, k,
                    al, pa, lda, pb, ldb, be, pc, ldc);
    if (status != 0) failed.store(status);
  };
  const bool spread = pool != nullptr && pool->uses_openmp();
  BatchedGemm<float>(dnnl, dims, alpha, beta, fa, fb, fc,
                     spread ? pool : nullptr, /*whole_products=*/!spread);
  if (const int status = failed.load(); status != 0) {
    return absl::InternalError(absl::StrCat("dnnl_sgemm failed with status ",
                                            status, " (", library_, ")"));
  }
  return absl::OkStatus();
}

namespace {

// The element count of `m`'s storage a product reads, from its offset:
// `rows` x `cols` as stored (a transposed operand's are swapped).
int64_t OperandSpan(const GemmMatrix& m, int64_t batch, int64_t rows,
                    int64_t cols) {
  if (m.transposed) std::swap(rows, cols);
  return (batch - 1) * m.batch_stride + (rows - 1) * m.ld + cols;
}

}  // namespace

absl::Status CpuBlas::GemmBf16(const GemmDims& dims, double alpha, double beta,
                               const void* a, const void* b, float* c,
                               ThreadPool* pool) const {
  const auto* ha = static_cast<const uint16_t*>(a);
  const auto* hb = static_cast<const uint16_t*>(b);
  const bool library = LibraryBf16Gemm(dims);
  if (mkl_gemm_bf16_ != nullptr && library) {
    BatchedGemm<float>(mkl_gemm_bf16_, dims, alpha, beta, ha, hb, c, nullptr,
                       /*whole_products=*/true);
    return absl::OkStatus();
  }
  if (dnnl_gemm_bf16_ != nullptr && library && !bf16_unimplemented_.load()) {
    std::atomic<int> failed{0};
    auto dnnl = [&](int, int ta, int tb, int m, int n, int k, float al,
                    const uint16_t* pa, int lda, const uint16_t* pb, int ldb,
                    float be, float* pc, int ldc) {
      const int status =
          dnnl_gemm_bf16_(ta == kTrans ? 'T' : 'N', tb == kTrans ? 'T' : 'N', m,
                          n, k, al, pa, lda, pb, ldb, be, pc, ldc);
      if (status != 0) failed.store(status);
    };
    const bool spread = pool != nullptr && pool->uses_openmp();
    BatchedGemm<float>(dnnl, dims, alpha, beta, ha, hb, c,
                       spread ? pool : nullptr, /*whole_products=*/!spread);
    const int status = failed.load();
    if (status == 0) return absl::OkStatus();
    // dnnl_unimplemented: this CPU has no bfloat16 GEMM in oneDNN (it needs
    // AVX-512); every later call widens the operands instead.
    constexpr int kDnnlUnimplemented = 3;
    if (status != kDnnlUnimplemented) {
      return absl::InternalError(
          absl::StrCat("dnnl_gemm_bf16bf16f32 failed with status ", status,
                       " (", library_, ")"));
    }
    bf16_unimplemented_.store(true);
  }
  // Without it: the operands widened to float32, then sgemm. Each operand's
  // span from its offset is converted; the product reads it from offset 0.
  if (dims.batch == 0 || dims.m == 0 || dims.n == 0 || dims.k == 0)
    return Gemm(DType::kFloat32, dims, alpha, beta, nullptr, nullptr, c, pool);
  GemmDims wide = dims;
  const std::vector<float> fa =
      WidenToFloat32(DType::kBFloat16, ha + dims.a.offset,
                     OperandSpan(dims.a, dims.batch, dims.m, dims.k), pool);
  const std::vector<float> fb =
      WidenToFloat32(DType::kBFloat16, hb + dims.b.offset,
                     OperandSpan(dims.b, dims.batch, dims.k, dims.n), pool);
  wide.a.offset = 0;
  wide.b.offset = 0;
  return Gemm(DType::kFloat32, wide, alpha, beta, fa.data(), fb.data(), c,
              pool);
}

absl::Status CpuBlas::TileSgemm(bool trans_a, bool trans_b, int m, int n, int k,
                                float alpha, const float* a, int lda,
                                const float* b, int ldb, float beta, float* c,
                                int ldc) const {
  if (sgemm_ != nullptr) {
    sgemm_(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans,
           m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return absl::OkStatus();
  }
  if (mkl_sgemm_ != nullptr) {
    // Column-major C^T = op(B)^T op(A)^T, as in Gemm.
    const char ca = trans_a ? 'T' : 'N', cb = trans_b ? 'T' : 'N';
    const int64_t cm = n, cn = m, ck = k, la = ldb, lb = lda, lc = ldc;
    mkl_sgemm_(&cb, &ca, &cm, &cn, &ck, &alpha, b, &la, a, &lb, &beta, c, &lc);
    return absl::OkStatus();
  }
  const int status = dnnl_sgemm_(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n,
                                 k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != 0) {
    return absl::InternalError(absl::StrCat("dnnl_sgemm failed with status ",
                                            status, " (", library_, ")"));
  }
  return absl::OkStatus();
}

bool CpuBlas::TilesRunOnCaller(const ThreadPool* pool) const {
  return sgemm_ != nullptr || (pool != nullptr && pool->uses_openmp());
}

std::vector<float> WidenToFloat32(DType dtype, const void* p, int64_t n,
                                  ThreadPool* pool) {
  std::vector<float> out(static_cast<size_t>(n));
  const auto* h = static_cast<const uint16_t*>(p);
  constexpr int64_t kChunk = int64_t{1} << 15;
  auto chunk = [&](int64_t c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    if (dtype == DType::kBFloat16) {
      BFloat16ToFloat(h + begin, end - begin, out.data() + begin);
    } else {
      for (int64_t i = begin; i < end; ++i) out[i] = HalfToFloat(h[i]);
    }
  };
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (pool == nullptr || chunks <= 1) {
    for (int64_t c = 0; c < chunks; ++c) chunk(c);
  } else {
    pool->ParallelFor(chunks, chunk);
  }
  return out;
}

}  // namespace kiln
