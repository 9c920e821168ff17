// cuDNN's types, values and entry points as Kiln declares them, so that the
// client builds without the CUDA toolkit: ABI-compatible with cuDNN 9's
// cudnn.h (its backend, or graph, API; tests/unit/cuda_cudnn_test.cc checks
// them against the header where the toolkit is installed). Enum parameters
// are declared as int (cuDNN's enums are 32-bit). Internal to
// runtime/cuda_cudnn.cc.
#ifndef KILN_RUNTIME_CUDNN_API_H_
#define KILN_RUNTIME_CUDNN_API_H_

#include <cstddef>
#include <cstdint>

#include "runtime/cuda_driver.h"

namespace kiln {

namespace cudnn {
using Status = int;        // cudnnStatus_t
using Handle = void*;      // cudnnHandle_t
using Descriptor = void*;  // cudnnBackendDescriptor_t

constexpr Status kSuccess = 0;  // CUDNN_STATUS_SUCCESS
// cudnnDataType_t
constexpr int kDataFloat = 0;         // CUDNN_DATA_FLOAT
constexpr int kDataHalf = 2;          // CUDNN_DATA_HALF
constexpr int kDataBFloat16 = 9;      // CUDNN_DATA_BFLOAT16
constexpr int kCrossCorrelation = 1;  // CUDNN_CROSS_CORRELATION
// cudnnBackendDescriptorType_t
constexpr int kConvolutionDescriptor = 1;    // ..._CONVOLUTION_DESCRIPTOR
constexpr int kEngineDescriptor = 2;         // ..._ENGINE_DESCRIPTOR
constexpr int kEngineCfgDescriptor = 3;      // ..._ENGINECFG_DESCRIPTOR
constexpr int kEngineHeurDescriptor = 4;     // ..._ENGINEHEUR_DESCRIPTOR
constexpr int kExecutionPlanDescriptor = 5;  // ..._EXECUTION_PLAN_DESCRIPTOR
constexpr int kConvForwardDescriptor =
    10;  // ..._OPERATION_CONVOLUTION_FORWARD_
constexpr int kConvBackwardFilterDescriptor = 11;  // ..._BACKWARD_FILTER_
constexpr int kConvBackwardDataDescriptor = 12;    // ..._BACKWARD_DATA_
constexpr int kOperationGraphDescriptor = 15;  // ..._OPERATIONGRAPH_DESCRIPTOR
constexpr int kVariantPackDescriptor = 16;     // ..._VARIANT_PACK_DESCRIPTOR
constexpr int kTensorDescriptor = 17;          // ..._TENSOR_DESCRIPTOR
// The descriptors of an attention graph (runtime/cuda_attention.cc).
constexpr int kPointwiseDescriptor = 0;            // ..._POINTWISE_DESCRIPTOR
constexpr int kOperationPointwiseDescriptor = 13;  // ..._OPERATION_POINTWISE_
constexpr int kMatmulDescriptor = 18;              // ..._MATMUL_DESCRIPTOR
constexpr int kOperationMatmulDescriptor = 19;     // ..._OPERATION_MATMUL_
constexpr int kReductionDescriptor = 21;           // ..._REDUCTION_DESCRIPTOR
constexpr int kOperationReductionDescriptor = 22;  // ..._OPERATION_REDUCTION_
constexpr int kOperationReshapeDescriptor = 31;    // ..._OPERATION_RESHAPE_
constexpr int kRngDescriptor = 32;                 // ..._RNG_DESCRIPTOR
constexpr int kOperationRngDescriptor = 33;        // ..._OPERATION_RNG_
// cudnnDataType_t, more
constexpr int kDataInt32 = 4;     // CUDNN_DATA_INT32
constexpr int kDataInt64 = 10;    // CUDNN_DATA_INT64
constexpr int kDataBoolean = 11;  // CUDNN_DATA_BOOLEAN
// cudnnRngDistribution_t
constexpr int kRngBernoulli = 0;
// cudnnPointwiseMode_t
constexpr int kPointwiseAdd = 0;
constexpr int kPointwiseMul = 1;
constexpr int kPointwiseDiv = 6;
constexpr int kPointwiseSub = 9;
constexpr int kPointwiseExp = 13;
constexpr int kPointwiseLog = 15;
constexpr int kPointwiseIdentity = 21;
constexpr int kPointwiseCmpGe = 303;
constexpr int kPointwiseGenIndex = 501;
constexpr int kPointwiseBinarySelect = 601;
// cudnnReduceTensorOp_t
constexpr int kReduceAdd = 0;
constexpr int kReduceMax = 3;
// cudnnBackendAttributeType_t
constexpr int kTypeHandle = 0;
constexpr int kTypeDataType = 1;
constexpr int kTypeInt64 = 3;
constexpr int kTypeFloat = 4;
constexpr int kTypeDouble = 5;
constexpr int kTypeVoidPtr = 6;
constexpr int kTypeConvolutionMode = 7;
constexpr int kTypeHeurMode = 8;
constexpr int kTypeNumericalNote = 11;
constexpr int kTypeBackendDescriptor = 15;
constexpr int kTypeBoolean = 2;
constexpr int kTypePointwiseMode = 14;
constexpr int kTypeReductionOperatorType = 18;
constexpr int kTypeRngDistribution = 29;
// cudnnBackendAttributeName_t
constexpr int kAttrConvCompType = 100;
constexpr int kAttrConvMode = 101;
constexpr int kAttrConvDilations = 102;
constexpr int kAttrConvFilterStrides = 103;
constexpr int kAttrConvPostPaddings = 104;
constexpr int kAttrConvPrePaddings = 105;
constexpr int kAttrConvSpatialDims = 106;
constexpr int kAttrEngineHeurMode = 200;
constexpr int kAttrEngineHeurOperationGraph = 201;
constexpr int kAttrEngineHeurResults = 202;
constexpr int kAttrEngineCfgEngine = 300;
constexpr int kAttrExecutionPlanHandle = 400;
constexpr int kAttrExecutionPlanEngineConfig = 401;
constexpr int kAttrExecutionPlanWorkspaceSize = 402;
// CUDNN_ATTR_OPERATION_CONVOLUTION_{FORWARD,BWD_DATA,BWD_FILTER}_*: the
// first of each group of six (ALPHA, BETA, CONV_DESC, then the tensors).
constexpr int kAttrConvForwardAlpha = 700;    // ALPHA BETA CONV_DESC W X Y
constexpr int kAttrConvBwdDataAlpha = 706;    // ALPHA BETA CONV_DESC W DX DY
constexpr int kAttrConvBwdFilterAlpha = 712;  // ALPHA BETA CONV_DESC DW X DY
constexpr int kAttrOperationGraphHandle = 800;
constexpr int kAttrOperationGraphOps = 801;
constexpr int kAttrTensorByteAlignment = 900;
constexpr int kAttrTensorDataType = 901;
constexpr int kAttrTensorDimensions = 902;
constexpr int kAttrTensorStrides = 903;
constexpr int kAttrTensorUniqueId = 906;
constexpr int kAttrTensorIsVirtual = 907;
constexpr int kAttrTensorIsByValue = 908;
constexpr int kAttrPointwiseMode = 0;
constexpr int kAttrPointwiseMathPrec = 1;
constexpr int kAttrPointwiseAxis = 9;
constexpr int kAttrOperationPointwisePwDescriptor = 750;
constexpr int kAttrOperationPointwiseX = 751;
constexpr int kAttrOperationPointwiseB = 752;
constexpr int kAttrOperationPointwiseY = 753;
constexpr int kAttrOperationPointwiseAlpha1 = 754;
constexpr int kAttrOperationPointwiseAlpha2 = 755;
constexpr int kAttrOperationPointwiseT = 758;
constexpr int kAttrMatmulCompType = 1500;
constexpr int kAttrOperationMatmulA = 1520;
constexpr int kAttrOperationMatmulB = 1521;
constexpr int kAttrOperationMatmulC = 1522;
constexpr int kAttrOperationMatmulDesc = 1523;
constexpr int kAttrReductionOperator = 1600;
constexpr int kAttrReductionCompType = 1601;
constexpr int kAttrOperationReductionX = 1610;
constexpr int kAttrOperationReductionY = 1611;
constexpr int kAttrOperationReductionDesc = 1612;
constexpr int kAttrOperationReshapeX = 2200;
constexpr int kAttrOperationReshapeY = 2201;
constexpr int kAttrRngDistribution = 2300;
constexpr int kAttrRngBernoulliProbability = 2305;
constexpr int kAttrOperationRngY = 2310;
constexpr int kAttrOperationRngSeed = 2311;
constexpr int kAttrOperationRngDesc = 2312;
constexpr int kAttrOperationRngOffset = 2313;
constexpr int kAttrVariantPackUniqueIds = 1000;
constexpr int kAttrVariantPackDataPointers = 1001;
constexpr int kAttrVariantPackWorkspace = 1003;
constexpr int kAttrEngineNumericalNote = 1303;
// cudnnBackendHeurMode_t
constexpr int kHeurModeInstant = 0;
constexpr int kHeurModeFallback = 2;
// cudnnBackendNumericalNote_t
constexpr int kNoteTensorCore = 0;
constexpr int kNoteDownConvertInputs = 1;
constexpr int kNoteNondeterministic = 4;
constexpr int kNoteTypeCount = 10;

struct Api {
  size_t (*cudnnGetVersion)();
  const char* (*cudnnGetErrorString)(Status);
  Status (*cudnnCreate)(Handle*);
  Status (*cudnnDestroy)(Handle);
  Status (*cudnnSetStream)(Handle, cuda::Stream);
  Status (*cudnnBackendCreateDescriptor)(int type, Descriptor*);
  Status (*cudnnBackendDestroyDescriptor)(Descriptor);
  Status (*cudnnBackendFinalize)(Descriptor);
  Status (*cudnnBackendSetAttribute)(Descriptor, int name, int type,
                                     int64_t count, const void* elements);
  Status (*cudnnBackendGetAttribute)(Descriptor, int name, int type,
                                     int64_t requested, int64_t* count,
                                     void* elements);
  Status (*cudnnBackendExecute)(Handle, Descriptor plan,
                                Descriptor variant_pack);
};
}  // namespace cudnn

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDNN_API_H_
