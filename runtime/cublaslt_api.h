// cuBLASLt's types, values and entry points as Kiln declares them, so that
// the client builds without the CUDA toolkit: ABI-compatible with
// cublasLt.h (tests/unit/cuda_blaslt_test.cc checks them against it where
// the toolkit's headers are installed). Enum parameters are declared as int
// (cuBLASLt's enums are 32-bit). Internal to runtime/cuda_blaslt.cc.
#ifndef KILN_RUNTIME_CUBLASLT_API_H_
#define KILN_RUNTIME_CUBLASLT_API_H_

#include <cstddef>
#include <cstdint>

#include "runtime/cuda_driver.h"

namespace kiln {

namespace cublaslt {
using Status = int;     // cublasStatus_t
using Handle = void*;   // cublasLtHandle_t
using Desc = void*;     // cublasLtMatmulDesc_t
using Layout = void*;   // cublasLtMatrixLayout_t
using Pref = void*;     // cublasLtMatmulPreference_t
struct Algo {           // cublasLtMatmulAlgo_t
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};

constexpr Status kSuccess = 0;
constexpr int kComputeF32 = 68;  // CUBLAS_COMPUTE_32F
constexpr int kComputeF32FastTf32 = 77;  // CUBLAS_COMPUTE_32F_FAST_TF32
constexpr int kR32F = 0;         // CUDA_R_32F
constexpr int kR16F = 2;         // CUDA_R_16F
constexpr int kR16BF = 14;       // CUDA_R_16BF
constexpr int kOpN = 0;          // CUBLAS_OP_N
constexpr int kOpT = 1;          // CUBLAS_OP_T
constexpr int kDescTransA = 3;   // CUBLASLT_MATMUL_DESC_TRANSA
constexpr int kDescTransB = 4;   // CUBLASLT_MATMUL_DESC_TRANSB
constexpr int kDescEpilogue = 7;     // CUBLASLT_MATMUL_DESC_EPILOGUE
constexpr int kDescBiasPointer = 8;  // CUBLASLT_MATMUL_DESC_BIAS_POINTER
// cublasLtEpilogue_t
constexpr uint32_t kEpilogueDefault = 1;
constexpr uint32_t kEpilogueRelu = 2;
constexpr uint32_t kEpilogueBias = 4;
constexpr uint32_t kEpilogueReluBias = 6;
constexpr uint32_t kEpilogueGelu = 32;  // tanh approximation
constexpr uint32_t kEpilogueGeluBias = 36;
// The column sums of its A (untransposed) / row sums of its B (transposed)
// into the bias pointer.
constexpr uint32_t kEpilogueBgradA = 256;
constexpr uint32_t kEpilogueBgradB = 512;
constexpr int kLayoutBatchCount = 5;          // ..._LAYOUT_BATCH_COUNT
constexpr int kLayoutStridedBatchOffset = 6;  // ..._STRIDED_BATCH_OFFSET
constexpr int kPrefMaxWorkspaceBytes = 1;     // ..._PREF_MAX_WORKSPACE_BYTES
constexpr int kPrefReductionSchemeMask = 3;   // ..._REDUCTION_SCHEME_MASK
// cublasLtReductionScheme_t: partial sums kept in the compute type.
constexpr uint32_t kReductionSchemeComputeType = 2;
constexpr int kPrefMinAlignmentA = 5;         // ..._MIN_ALIGNMENT_A_BYTES
constexpr int kPrefMinAlignmentB = 6;
constexpr int kPrefMinAlignmentC = 7;
constexpr int kPrefMinAlignmentD = 8;

struct Api {
  Status (*cublasLtCreate)(Handle* handle);
  Status (*cublasLtDestroy)(Handle handle);
  size_t (*cublasLtGetVersion)();
  const char* (*cublasLtGetStatusString)(Status status);
  Status (*cublasLtMatmulDescCreate)(Desc* desc, int compute_type,
                                     int scale_type);
  Status (*cublasLtMatmulDescDestroy)(Desc desc);
  Status (*cublasLtMatmulDescSetAttribute)(Desc desc, int attr,
                                           const void* value, size_t size);
  Status (*cublasLtMatrixLayoutCreate)(Layout* layout, int type, uint64_t rows,
                                       uint64_t cols, int64_t ld);
  Status (*cublasLtMatrixLayoutDestroy)(Layout layout);
  Status (*cublasLtMatrixLayoutSetAttribute)(Layout layout, int attr,
                                             const void* value, size_t size);
  Status (*cublasLtMatmulPreferenceCreate)(Pref* pref);
  Status (*cublasLtMatmulPreferenceDestroy)(Pref pref);
  Status (*cublasLtMatmulPreferenceSetAttribute)(Pref pref, int attr,
                                                 const void* value,
                                                 size_t size);
  Status (*cublasLtMatmulAlgoGetHeuristic)(Handle handle, Desc desc, Layout a,
                                           Layout b, Layout c, Layout d,
                                           Pref pref, int requested,
                                           HeuristicResult* results,
                                           int* returned);
  Status (*cublasLtMatmul)(Handle handle, Desc desc, const void* alpha,
                           const void* a, Layout a_desc, const void* b,
                           Layout b_desc, const void* beta, const void* c,
                           Layout c_desc, void* d, Layout d_desc,
                           const Algo* algo, void* workspace,
                           size_t workspace_bytes, cuda::Stream stream);
};
}  // namespace cublaslt

}  // namespace kiln

#endif  // KILN_RUNTIME_CUBLASLT_API_H_
