// runtime/cublaslt_api.h against cublasLt.h where the CUDA toolkit's headers
// are installed (the library never includes it): every value Kiln passes and
// the layout of the structs it shares with cuBLASLt. Without the headers
// the test says so and skips.
#include "runtime/cublaslt_api.h"

#include <cstddef>

#include "gtest/gtest.h"

#if defined(KILN_HAVE_CUDA_H) && __has_include(<cublasLt.h>)
#include <cublasLt.h>
#define KILN_HAVE_CUBLASLT_H 1
#endif

namespace kiln::testing {
namespace {

#if defined(KILN_HAVE_CUBLASLT_H)
static_assert(cublaslt::kSuccess == CUBLAS_STATUS_SUCCESS);
static_assert(cublaslt::kComputeF32 == CUBLAS_COMPUTE_32F);
static_assert(cublaslt::kR32F == CUDA_R_32F);
static_assert(cublaslt::kR16F == CUDA_R_16F);
static_assert(cublaslt::kR16BF == CUDA_R_16BF);
static_assert(cublaslt::kOpN == CUBLAS_OP_N);
static_assert(cublaslt::kOpT == CUBLAS_OP_T);
static_assert(cublaslt::kDescTransA == CUBLASLT_MATMUL_DESC_TRANSA);
static_assert(cublaslt::kDescTransB == CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(cublaslt::kLayoutBatchCount == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
static_assert(cublaslt::kLayoutStridedBatchOffset ==
              CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
static_assert(cublaslt::kPrefMaxWorkspaceBytes ==
              CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
static_assert(cublaslt::kPrefMinAlignmentA ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
static_assert(cublaslt::kPrefMinAlignmentB ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES);
static_assert(cublaslt::kPrefMinAlignmentC ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES);
static_assert(cublaslt::kPrefMinAlignmentD ==
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
static_assert(cublaslt::kComputeF32FastTf32 == CUBLAS_COMPUTE_32F_FAST_TF32);
static_assert(cublaslt::kDescEpilogue == CUBLASLT_MATMUL_DESC_EPILOGUE);
static_assert(cublaslt::kDescBiasPointer == CUBLASLT_MATMUL_DESC_BIAS_POINTER);
static_assert(cublaslt::kEpilogueDefault == CUBLASLT_EPILOGUE_DEFAULT);
static_assert(cublaslt::kEpilogueRelu == CUBLASLT_EPILOGUE_RELU);
static_assert(cublaslt::kEpilogueBias == CUBLASLT_EPILOGUE_BIAS);
static_assert(cublaslt::kEpilogueReluBias == CUBLASLT_EPILOGUE_RELU_BIAS);
static_assert(cublaslt::kEpilogueGelu == CUBLASLT_EPILOGUE_GELU);
static_assert(cublaslt::kEpilogueGeluBias == CUBLASLT_EPILOGUE_GELU_BIAS);
static_assert(cublaslt::kEpilogueBgradA == CUBLASLT_EPILOGUE_BGRADA);
static_assert(cublaslt::kEpilogueBgradB == CUBLASLT_EPILOGUE_BGRADB);
static_assert(cublaslt::kPrefReductionSchemeMask ==
              CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK);
static_assert(cublaslt::kReductionSchemeComputeType ==
              CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
static_assert(sizeof(cublasLtEpilogue_t) == sizeof(uint32_t));
static_assert(sizeof(cublaslt::Algo) == sizeof(cublasLtMatmulAlgo_t));
static_assert(sizeof(cublaslt::HeuristicResult) ==
              sizeof(cublasLtMatmulHeuristicResult_t));
static_assert(offsetof(cublaslt::HeuristicResult, workspace_size) ==
              offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize));
static_assert(offsetof(cublaslt::HeuristicResult, state) ==
              offsetof(cublasLtMatmulHeuristicResult_t, state));
// The attribute value types Kiln passes: TRANS* are int32 (cublasOperation_t),
// BATCH_COUNT int32, STRIDED_BATCH_OFFSET int64, workspace uint64,
// alignments uint32.
static_assert(sizeof(cublasOperation_t) == sizeof(int));
#endif

TEST(CublasLtApi, MatchesTheToolkitsHeader) {
#if defined(KILN_HAVE_CUBLASLT_H)
  SUCCEED() << "checked at compile time against cublasLt.h";
#else
  GTEST_SKIP() << "cublasLt.h is not installed: the values are unchecked";
#endif
}

}  // namespace
}  // namespace kiln::testing
