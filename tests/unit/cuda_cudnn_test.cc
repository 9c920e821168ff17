// runtime/cudnn_api.h against cudnn.h where the CUDA toolkit's headers are
// installed (the library never includes it): every value Kiln passes and
// each entry point's shape. Without the headers the test says so and
// skips.
#include <cstddef>
#include <type_traits>

#include "gtest/gtest.h"
#include "runtime/cudnn_api.h"

#if defined(KILN_HAVE_CUDA_H) && __has_include(<cudnn.h>)
// The handle attributes are deprecated in cuDNN 9 (and still honoured).
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
static_assert(cudnn::kCrossCorrelation == CUDNN_CROSS_CORRELATION);
static_assert(cudnn::kConvolutionDescriptor ==
              CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
static_assert(cudnn::kEngineDescriptor == CUDNN_BACKEND_ENGINE_DESCRIPTOR);
static_assert(cudnn::kEngineCfgDescriptor ==
              CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
static_assert(cudnn::kEngineHeurDescriptor ==
              CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
static_assert(cudnn::kExecutionPlanDescriptor ==
              CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
static_assert(cudnn::kConvForwardDescriptor ==
              CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
static_assert(cudnn::kConvBackwardFilterDescriptor ==
              CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
static_assert(cudnn::kConvBackwardDataDescriptor ==
              CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
static_assert(cudnn::kOperationGraphDescriptor ==
              CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
static_assert(cudnn::kVariantPackDescriptor ==
              CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
static_assert(cudnn::kTensorDescriptor == CUDNN_BACKEND_TENSOR_DESCRIPTOR);
static_assert(cudnn::kTypeHandle == CUDNN_TYPE_HANDLE);
static_assert(cudnn::kTypeDataType == CUDNN_TYPE_DATA_TYPE);
static_assert(cudnn::kTypeInt64 == CUDNN_TYPE_INT64);
static_assert(cudnn::kTypeFloat == CUDNN_TYPE_FLOAT);
static_assert(cudnn::kTypeVoidPtr == CUDNN_TYPE_VOID_PTR);
static_assert(cudnn::kTypeConvolutionMode == CUDNN_TYPE_CONVOLUTION_MODE);
static_assert(cudnn::kTypeHeurMode == CUDNN_TYPE_HEUR_MODE);
static_assert(cudnn::kTypeNumericalNote == CUDNN_TYPE_NUMERICAL_NOTE);
static_assert(cudnn::kTypeBackendDescriptor == CUDNN_TYPE_BACKEND_DESCRIPTOR);
static_assert(cudnn::kAttrConvCompType == CUDNN_ATTR_CONVOLUTION_COMP_TYPE);
static_assert(cudnn::kAttrConvMode == CUDNN_ATTR_CONVOLUTION_CONV_MODE);
static_assert(cudnn::kAttrConvDilations == CUDNN_ATTR_CONVOLUTION_DILATIONS);
static_assert(cudnn::kAttrConvFilterStrides ==
              CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES);
static_assert(cudnn::kAttrConvPostPaddings ==
              CUDNN_ATTR_CONVOLUTION_POST_PADDINGS);
static_assert(cudnn::kAttrConvPrePaddings ==
              CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS);
static_assert(cudnn::kAttrConvSpatialDims ==
              CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS);
static_assert(cudnn::kAttrEngineHeurMode == CUDNN_ATTR_ENGINEHEUR_MODE);
static_assert(cudnn::kAttrEngineHeurOperationGraph ==
              CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
static_assert(cudnn::kAttrEngineHeurResults == CUDNN_ATTR_ENGINEHEUR_RESULTS);
static_assert(cudnn::kAttrEngineCfgEngine == CUDNN_ATTR_ENGINECFG_ENGINE);
static_assert(cudnn::kAttrExecutionPlanHandle ==
              CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
static_assert(cudnn::kAttrExecutionPlanEngineConfig ==
              CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
static_assert(cudnn::kAttrExecutionPlanWorkspaceSize ==
              CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
// Each operation's six attributes follow its first in this order.
static_assert(cudnn::kAttrConvForwardAlpha ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA);
static_assert(cudnn::kAttrConvForwardAlpha + 1 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA);
static_assert(cudnn::kAttrConvForwardAlpha + 2 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC);
static_assert(cudnn::kAttrConvForwardAlpha + 3 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W);
static_assert(cudnn::kAttrConvForwardAlpha + 4 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X);
static_assert(cudnn::kAttrConvForwardAlpha + 5 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y);
static_assert(cudnn::kAttrConvBwdDataAlpha ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA);
static_assert(cudnn::kAttrConvBwdDataAlpha + 3 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W);
static_assert(cudnn::kAttrConvBwdDataAlpha + 4 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX);
static_assert(cudnn::kAttrConvBwdDataAlpha + 5 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY);
static_assert(cudnn::kAttrConvBwdFilterAlpha ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA);
static_assert(cudnn::kAttrConvBwdFilterAlpha + 3 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW);
static_assert(cudnn::kAttrConvBwdFilterAlpha + 4 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X);
static_assert(cudnn::kAttrConvBwdFilterAlpha + 5 ==
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY);
static_assert(cudnn::kAttrOperationGraphHandle ==
              CUDNN_ATTR_OPERATIONGRAPH_HANDLE);
static_assert(cudnn::kAttrOperationGraphOps == CUDNN_ATTR_OPERATIONGRAPH_OPS);
static_assert(cudnn::kAttrTensorByteAlignment ==
              CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
static_assert(cudnn::kAttrTensorDataType == CUDNN_ATTR_TENSOR_DATA_TYPE);
static_assert(cudnn::kAttrTensorDimensions == CUDNN_ATTR_TENSOR_DIMENSIONS);
static_assert(cudnn::kAttrTensorStrides == CUDNN_ATTR_TENSOR_STRIDES);
static_assert(cudnn::kAttrTensorUniqueId == CUDNN_ATTR_TENSOR_UNIQUE_ID);
static_assert(cudnn::kAttrVariantPackUniqueIds ==
              CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
static_assert(cudnn::kAttrVariantPackDataPointers ==
              CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
static_assert(cudnn::kAttrVariantPackWorkspace ==
              CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
static_assert(cudnn::kAttrEngineNumericalNote ==
              CUDNN_ATTR_ENGINE_NUMERICAL_NOTE);
static_assert(cudnn::kHeurModeInstant == CUDNN_HEUR_MODE_INSTANT);
static_assert(cudnn::kHeurModeFallback == CUDNN_HEUR_MODE_FALLBACK);
static_assert(cudnn::kNoteTensorCore == CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
static_assert(cudnn::kNoteDownConvertInputs ==
              CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
static_assert(cudnn::kNoteNondeterministic ==
              CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
static_assert(cudnn::kNoteTypeCount == CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
// The attention graph's descriptors, attributes and modes.
static_assert(cudnn::kPointwiseDescriptor ==
              CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
static_assert(cudnn::kOperationPointwiseDescriptor ==
              CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
static_assert(cudnn::kMatmulDescriptor == CUDNN_BACKEND_MATMUL_DESCRIPTOR);
static_assert(cudnn::kOperationMatmulDescriptor ==
              CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
static_assert(cudnn::kReductionDescriptor ==
              CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
static_assert(cudnn::kOperationReductionDescriptor ==
              CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
static_assert(cudnn::kOperationReshapeDescriptor ==
              CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
static_assert(cudnn::kDataInt32 == CUDNN_DATA_INT32);
static_assert(cudnn::kDataBoolean == CUDNN_DATA_BOOLEAN);
static_assert(cudnn::kPointwiseAdd == CUDNN_POINTWISE_ADD);
static_assert(cudnn::kPointwiseMul == CUDNN_POINTWISE_MUL);
static_assert(cudnn::kPointwiseDiv == CUDNN_POINTWISE_DIV);
static_assert(cudnn::kPointwiseSub == CUDNN_POINTWISE_SUB);
static_assert(cudnn::kPointwiseExp == CUDNN_POINTWISE_EXP);
static_assert(cudnn::kPointwiseLog == CUDNN_POINTWISE_LOG);
static_assert(cudnn::kPointwiseIdentity == CUDNN_POINTWISE_IDENTITY);
static_assert(cudnn::kPointwiseCmpGe == CUDNN_POINTWISE_CMP_GE);
static_assert(cudnn::kPointwiseGenIndex == CUDNN_POINTWISE_GEN_INDEX);
static_assert(cudnn::kPointwiseBinarySelect == CUDNN_POINTWISE_BINARY_SELECT);
static_assert(cudnn::kReduceAdd == CUDNN_REDUCE_TENSOR_ADD);
static_assert(cudnn::kReduceMax == CUDNN_REDUCE_TENSOR_MAX);
static_assert(cudnn::kTypeBoolean == CUDNN_TYPE_BOOLEAN);
static_assert(cudnn::kTypePointwiseMode == CUDNN_TYPE_POINTWISE_MODE);
static_assert(cudnn::kTypeReductionOperatorType ==
              CUDNN_TYPE_REDUCTION_OPERATOR_TYPE);
static_assert(cudnn::kAttrTensorIsVirtual == CUDNN_ATTR_TENSOR_IS_VIRTUAL);
static_assert(cudnn::kAttrTensorIsByValue == CUDNN_ATTR_TENSOR_IS_BY_VALUE);
static_assert(cudnn::kAttrPointwiseMode == CUDNN_ATTR_POINTWISE_MODE);
static_assert(cudnn::kAttrPointwiseMathPrec == CUDNN_ATTR_POINTWISE_MATH_PREC);
static_assert(cudnn::kAttrPointwiseAxis == CUDNN_ATTR_POINTWISE_AXIS);
static_assert(cudnn::kAttrOperationPointwisePwDescriptor ==
              CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
static_assert(cudnn::kAttrOperationPointwiseX ==
              CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
static_assert(cudnn::kAttrOperationPointwiseB ==
              CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
static_assert(cudnn::kAttrOperationPointwiseY ==
              CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
static_assert(cudnn::kAttrOperationPointwiseAlpha1 ==
              CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1);
static_assert(cudnn::kAttrOperationPointwiseAlpha2 ==
              CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2);
static_assert(cudnn::kAttrOperationPointwiseT ==
              CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
static_assert(cudnn::kAttrMatmulCompType == CUDNN_ATTR_MATMUL_COMP_TYPE);
static_assert(cudnn::kAttrOperationMatmulA ==
              CUDNN_ATTR_OPERATION_MATMUL_ADESC);
static_assert(cudnn::kAttrOperationMatmulB ==
              CUDNN_ATTR_OPERATION_MATMUL_BDESC);
static_assert(cudnn::kAttrOperationMatmulC ==
              CUDNN_ATTR_OPERATION_MATMUL_CDESC);
static_assert(cudnn::kAttrOperationMatmulDesc ==
              CUDNN_ATTR_OPERATION_MATMUL_DESC);
static_assert(cudnn::kAttrReductionOperator == CUDNN_ATTR_REDUCTION_OPERATOR);
static_assert(cudnn::kAttrReductionCompType == CUDNN_ATTR_REDUCTION_COMP_TYPE);
static_assert(cudnn::kAttrOperationReductionX ==
              CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
static_assert(cudnn::kAttrOperationReductionY ==
              CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
static_assert(cudnn::kAttrOperationReductionDesc ==
              CUDNN_ATTR_OPERATION_REDUCTION_DESC);
static_assert(cudnn::kAttrOperationReshapeX ==
              CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
static_assert(cudnn::kAttrOperationReshapeY ==
              CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
static_assert(sizeof(cudnnBackendAttributeName_t) == sizeof(int));
static_assert(sizeof(cudnnBackendNumericalNote_t) == sizeof(int));
static_assert(sizeof(cudnnDataType_t) == sizeof(int));

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
KILN_SAME(cudnnBackendCreateDescriptor);
KILN_SAME(cudnnBackendDestroyDescriptor);
KILN_SAME(cudnnBackendFinalize);
KILN_SAME(cudnnBackendSetAttribute);
KILN_SAME(cudnnBackendGetAttribute);
KILN_SAME(cudnnBackendExecute);
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
