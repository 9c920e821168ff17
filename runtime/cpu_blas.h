// The CPU's matrix products: a BLAS loaded at run time with dlopen, as the
// CUDA driver is (cuda_driver.h): the client library links no BLAS and
// builds without one; a machine without one fails the first extern call
// with a clear FAILED_PRECONDITION, and runs every other artifact.
//
//   absl::StatusOr<const CpuBlas*> blas = CpuBlas::Get();
//   if (!blas.ok()) ...  // FAILED_PRECONDITION: no BLAS found
//   (*blas)->Gemm(DType::kFloat32, dims, 1.0, 0.0, a, b, c);
//
// Which library: $KILN_BLAS when set (a path or soname), else PyTorch's MKL
// when the process has already loaded PyTorch (libtorch_cpu.so exporting
// MKL's SGEMM_64: the library eager PyTorch's own products call, so that a
// compiled product costs what eager's does; $KILN_TORCH_MKL=0 skips it),
// else the first that loads of oneDNN (libdnnl.so.2, or $KILN_ONEDNN;
// KILN_ONEDNN=0 skips it), libopenblas.so.0, libcblas.so.3 and libblas.so.3
// (Debian's alternatives point the last at OpenBLAS when it is installed).
// A library that exports dnnl_sgemm is called through it, one that exports
// SGEMM_64 (MKL) through that and its cblas_gemm_bf16bf16f32, any other
// through cblas_sgemm. In a PyTorch process MKL was 1.03-1.25x faster than
// oneDNN at the products of real models (bench/python/cpu_gemm.py --shapes;
// bench/README.md, session 37); outside one, oneDNN is the default: 3-9%
// faster than OpenBLAS on the 2-core dev machine (session 19).
//
// Unless OPENBLAS_CORETYPE is set, the first Get sets it from the CPU's
// features (AVX-512: SKYLAKEX, AVX2: HASWELL) before loading: OpenBLAS's own
// detection falls back to a slow generic kernel on CPUs whose model it does
// not know, as virtual machines often report.
//
// Thread-safety: Get loads once (the first caller does the work, the others
// wait) and the object is immutable afterwards; Gemm may be called from any
// thread (the BLAS manages its own threads).
#ifndef KILN_RUNTIME_CPU_BLAS_H_
#define KILN_RUNTIME_CPU_BLAS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/dtype.h"
#include "runtime/program_plan.h"
#include "runtime/thread_pool.h"

namespace kiln {

class CpuBlas {
 public:
  // The process-wide library, loaded on first call. Errors:
  // FAILED_PRECONDITION naming every library tried and why it failed.
  static absl::StatusOr<const CpuBlas*> Get();
  // Get, then one 8x8x8 float32 product, so that the library's one-time
  // start-up (CPU detection, code generation, threads: about 70 ms for
  // oneDNN on the 2-core dev machine) is paid by the caller, e.g. a thread
  // of its own while the process traces its model, rather than by the
  // first executable run. Errors: as Get and Gemm.
  static absl::Status Prepare();

  // C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] for i < dims.batch in
  // float32 (sgemm), at the offsets, strides and leading
  // dimensions of `dims` (from EvaluateGemm, which has checked them against
  // the buffers). A product over k = 0 scales C by beta (zeros for 0).
  // Threads: MKL threads each product itself over the process's OpenMP
  // threads, as eager PyTorch's calls do. A CBLAS runs single-threaded
  // calls, and with a `pool` C's
  // rows are split into blocks that its threads compute: Kiln's one pool
  // runs the cores, the BLAS starts no threads of its own (they fought the
  // pool and PyTorch's threads for the cores: 13 against 145 GFLOP/s at
  // 512^3 on 2 cores). oneDNN threads each call over the process's OpenMP
  // threads (PyTorch's, in a PyTorch process): one product is one call from
  // the calling thread; the products of a batch are spread over a pool
  // that runs on those OpenMP threads, else called one after the other.
  // Errors: UNIMPLEMENTED for another dtype; INTERNAL when oneDNN reports
  // a failure.
  absl::Status Gemm(DType dtype, const GemmDims& dims, double alpha,
                    double beta, const void* a, const void* b, void* c,
                    ThreadPool* pool = nullptr) const;

  // C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i] with A and B in
  // bfloat16 and C in float32, accumulated in float32, as Gemm otherwise:
  // MKL's or oneDNN's gemm_bf16bf16f32 where the library is one of them and
  // LibraryBf16Gemm(dims) (for oneDNN: and the CPU has it, AVX-512), else
  // the operands widened to float32 (exactly) and sgemm.
  // Errors: INTERNAL when oneDNN reports a failure other than
  // unimplemented; FAILED_PRECONDITION as Get.
  absl::Status GemmBf16(const GemmDims& dims, double alpha, double beta,
                        const void* a, const void* b, float* c,
                        ThreadPool* pool = nullptr) const;

  // Whether GemmBf16 calls the library's bfloat16 GEMM for a product of
  // `dims`: with $KILN_ONEDNN_BF16 set, unless it is 0; else where the CPU
  // has AMX-BF16, or the product is small (below 2^26 multiply-adds).
  // Without AMX, MKL's and oneDNN's bfloat16 GEMMs ran at half the rate of
  // float32 sgemm on the operands widened (AVX512-BF16 2-core dev machine:
  // 160 against 271 GFLOP/s at 1024^3; bench/README.md, session 37). The
  // setting is read once per process.
  static bool LibraryBf16Gemm(const GemmDims& dims);

  // Whether bfloat16 calls may use the library's bfloat16 primitives
  // (oneDNN's or MKL's GEMM here, oneDNN's convolutions in cpu_conv.h): false
  // with $KILN_ONEDNN_BF16=0, which widens the operands to float32 instead.
  // Read once per process.
  static bool OneDnnBf16Allowed();

  // One float32 product of row-major matrices, C = alpha * op(A) @ op(B) +
  // beta * C (C m x n, k summed; lda, ldb and ldc are the stored rows'
  // strides), for a caller that spreads its own tiles over a pool
  // (cpu_attention.h). Inside a region of a pool for which
  // TilesRunOnCaller is true it computes on the calling thread. m, n and
  // k are at least 1. Errors: INTERNAL when oneDNN reports a failure.
  absl::Status TileSgemm(bool trans_a, bool trans_b, int m, int n, int k,
                         float alpha, const float* a, int lda, const float* b,
                         int ldb, float beta, float* c, int ldc) const;

  // Whether TileSgemm, called inside a region of `pool`, computes on the
  // calling thread: always for a CBLAS (its calls are single-threaded);
  // for MKL and oneDNN where the pool runs on the process's OpenMP threads
  // (inside a parallel region they compute on one thread). Otherwise each
  // call would start threads of its own, and a caller should call its
  // tiles one after the other (each threaded by the library) instead.
  bool TilesRunOnCaller(const ThreadPool* pool) const;

  // The library that was loaded (its path or soname).
  const std::string& library() const { return library_; }

  ~CpuBlas();
  CpuBlas(const CpuBlas&) = delete;
  CpuBlas& operator=(const CpuBlas&) = delete;

 private:
  using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*,
                           int, const float*, int, float, float*, int);
  // MKL's column-major Fortran sgemm with 64-bit integers (SGEMM_64), and
  // its row-major CBLAS bfloat16 GEMM (MKL_INT = int).
  using MklSgemmFn = void (*)(const char*, const char*, const int64_t*,
                              const int64_t*, const int64_t*, const float*,
                              const float*, const int64_t*, const float*,
                              const int64_t*, const float*, float*,
                              const int64_t*);
  using MklGemmBf16Fn = void (*)(int, int, int, int, int, int, float,
                                 const uint16_t*, int, const uint16_t*, int,
                                 float, float*, int);
  // oneDNN's row-major sgemm (dnnl_dim_t = int64_t; returns dnnl_status_t).
  using DnnlSgemmFn = int (*)(char, char, int64_t, int64_t, int64_t, float,
                              const float*, int64_t, const float*, int64_t,
                              float, float*, int64_t);
  using DnnlGemmBf16Fn = int (*)(char, char, int64_t, int64_t, int64_t, float,
                                 const uint16_t*, int64_t, const uint16_t*,
                                 int64_t, float, float*, int64_t);
  CpuBlas() = default;
  static absl::StatusOr<std::unique_ptr<CpuBlas>> Open();

  void* handle_ = nullptr;
  std::string library_;
  SgemmFn sgemm_ = nullptr;           // a CBLAS, or
  DnnlSgemmFn dnnl_sgemm_ = nullptr;  // oneDNN, or
  MklSgemmFn mkl_sgemm_ = nullptr;    // MKL
  MklGemmBf16Fn mkl_gemm_bf16_ = nullptr;
  DnnlGemmBf16Fn dnnl_gemm_bf16_ = nullptr;  // oneDNN's, when it has one
  // Set when oneDNN answered unimplemented (no AVX-512): widen from then on.
  mutable std::atomic<bool> bf16_unimplemented_{false};
};

// `n` float16 or bfloat16 values (`dtype`; their bits at `p`) widened to
// float32 (exact), in chunks over `pool`'s threads when there is one: the
// operands of products and attention computed in float32.
std::vector<float> WidenToFloat32(DType dtype, const void* p, int64_t n,
                                  ThreadPool* pool);

}  // namespace kiln

#endif  // KILN_RUNTIME_CPU_BLAS_H_
