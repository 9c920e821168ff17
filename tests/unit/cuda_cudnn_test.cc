// runtime/cudnn_api.h against cudnn.h where the CUDA toolkit's headers are
// installed (the library never includes it): every value Kiln passes, the
// layout of the algorithm-performance structs it reads, and each entry
// point's type. Without the headers the test says so and skips.
#include <cstddef>
#include <type_traits>

#include "gtest/gtest.h"
#include "runtime/cudnn_api.h"

#if defined(KILN_HAVE_CUDA_H) && __has_include(<cudnn.h>)
// The legacy convolution API is deprecated in cuDNN 9 (and still there).
#define CUDNN_WARN_DEPRECATED 0
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cudnn.h>
#define KILN_HAVE_CUDNN_H 1
#endif

namespace kiln::testing {
namespace {

#if defined(KILN_HAVE_CUDNN_H)
static_assert(CUDNN_MAJOR == 9);
static_assert(cudnn::kSuccess == CUDNN_STATUS_SUCCESS);
static_assert(cudnn::kDataFloat == CUDNN_DATA_FLOAT);
static_assert(cudnn::kDataHalf == CUDNN_DATA_HALF);
static_assert(cudnn::kDataBFloat16 == CUDNN_DATA_BFLOAT16);
static_assert(cudnn::kTensorNchw == CUDNN_TENSOR_NCHW);
static_assert(cudnn::kCrossCorrelation == CUDNN_CROSS_CORRELATION);
static_assert(cudnn::kDefaultMath == CUDNN_DEFAULT_MATH);
static_assert(cudnn::kTensorOpMath == CUDNN_TENSOR_OP_MATH);
static_assert(cudnn::kFmaMath == CUDNN_FMA_MATH);
static_assert(cudnn::kDeterministic == CUDNN_DETERMINISTIC);
static_assert(sizeof(cudnnDataType_t) == sizeof(int));
static_assert(sizeof(cudnnMathType_t) == sizeof(int));
static_assert(sizeof(cudnnConvolutionFwdAlgo_t) == sizeof(int));

// One Kiln struct serves the three perf structs: same size and offsets.
template <typename Perf>
constexpr bool SameLayout() {
  return sizeof(Perf) == sizeof(cudnn::AlgoPerf) &&
         offsetof(Perf, algo) == offsetof(cudnn::AlgoPerf, algo) &&
         offsetof(Perf, status) == offsetof(cudnn::AlgoPerf, status) &&
         offsetof(Perf, memory) == offsetof(cudnn::AlgoPerf, memory) &&
         offsetof(Perf, determinism) ==
             offsetof(cudnn::AlgoPerf, determinism) &&
         offsetof(Perf, mathType) == offsetof(cudnn::AlgoPerf, math_type);
}
static_assert(SameLayout<cudnnConvolutionFwdAlgoPerf_t>());
static_assert(SameLayout<cudnnConvolutionBwdDataAlgoPerf_t>());
static_assert(SameLayout<cudnnConvolutionBwdFilterAlgoPerf_t>());

// Each entry point takes the same number of arguments of the same sizes.
template <typename R1, typename... A1, typename R2, typename... A2>
constexpr bool SameShape(R1 (*)(A1...), R2 (*)(A2...)) {
  if constexpr (sizeof...(A1) != sizeof...(A2)) {
    return false;
  } else {
    return sizeof(R1) == sizeof(R2) && ((sizeof(A1) == sizeof(A2)) && ...);
  }
}
#define KILN_SAME(name) \
  static_assert(SameShape(decltype(cudnn::Api::name){}, &::name), #name)
KILN_SAME(cudnnGetVersion);
KILN_SAME(cudnnGetErrorString);
KILN_SAME(cudnnCreate);
KILN_SAME(cudnnDestroy);
KILN_SAME(cudnnSetStream);
KILN_SAME(cudnnCreateTensorDescriptor);
KILN_SAME(cudnnSetTensorNdDescriptor);
KILN_SAME(cudnnDestroyTensorDescriptor);
KILN_SAME(cudnnCreateFilterDescriptor);
KILN_SAME(cudnnSetFilterNdDescriptor);
KILN_SAME(cudnnDestroyFilterDescriptor);
KILN_SAME(cudnnCreateConvolutionDescriptor);
KILN_SAME(cudnnSetConvolutionNdDescriptor);
KILN_SAME(cudnnSetConvolutionGroupCount);
KILN_SAME(cudnnSetConvolutionMathType);
KILN_SAME(cudnnDestroyConvolutionDescriptor);
KILN_SAME(cudnnGetConvolutionForwardAlgorithm_v7);
KILN_SAME(cudnnGetConvolutionBackwardDataAlgorithm_v7);
KILN_SAME(cudnnGetConvolutionBackwardFilterAlgorithm_v7);
KILN_SAME(cudnnGetConvolutionForwardWorkspaceSize);
KILN_SAME(cudnnGetConvolutionBackwardDataWorkspaceSize);
KILN_SAME(cudnnGetConvolutionBackwardFilterWorkspaceSize);
KILN_SAME(cudnnConvolutionForward);
KILN_SAME(cudnnConvolutionBackwardData);
KILN_SAME(cudnnConvolutionBackwardFilter);
#undef KILN_SAME
#pragma GCC diagnostic pop
#endif

TEST(CudnnApi, MatchesTheToolkitsHeader) {
#if defined(KILN_HAVE_CUDNN_H)
  SUCCEED() << "checked at compile time against cudnn.h";
#else
  GTEST_SKIP() << "cudnn.h is not installed: the values are unchecked";
#endif
}

}  // namespace
}  // namespace kiln::testing
