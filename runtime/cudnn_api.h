// cuDNN's types, values and entry points as Kiln declares them, so that the
// client builds without the CUDA toolkit: ABI-compatible with cuDNN 9's
// cudnn.h (its legacy convolution API; tests/unit/cuda_cudnn_test.cc checks
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
using TensorDesc = void*;  // cudnnTensorDescriptor_t
using FilterDesc = void*;  // cudnnFilterDescriptor_t
using ConvDesc = void*;    // cudnnConvolutionDescriptor_t

// cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (one layout for all
// three).
struct AlgoPerf {
  int algo;
  Status status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
};

constexpr Status kSuccess = 0;        // CUDNN_STATUS_SUCCESS
constexpr int kDataFloat = 0;         // CUDNN_DATA_FLOAT
constexpr int kDataHalf = 2;          // CUDNN_DATA_HALF
constexpr int kDataBFloat16 = 9;      // CUDNN_DATA_BFLOAT16
constexpr int kTensorNchw = 0;        // CUDNN_TENSOR_NCHW
constexpr int kCrossCorrelation = 1;  // CUDNN_CROSS_CORRELATION
constexpr int kDefaultMath = 0;       // CUDNN_DEFAULT_MATH
constexpr int kTensorOpMath = 1;      // CUDNN_TENSOR_OP_MATH
constexpr int kFmaMath = 3;           // CUDNN_FMA_MATH
constexpr int kDeterministic = 1;     // CUDNN_DETERMINISTIC

struct Api {
  size_t (*cudnnGetVersion)();
  const char* (*cudnnGetErrorString)(Status);
  Status (*cudnnCreate)(Handle*);
  Status (*cudnnDestroy)(Handle);
  Status (*cudnnSetStream)(Handle, cuda::Stream);
  Status (*cudnnCreateTensorDescriptor)(TensorDesc*);
  Status (*cudnnSetTensorNdDescriptor)(TensorDesc, int data_type, int dims,
                                       const int* sizes, const int* strides);
  Status (*cudnnDestroyTensorDescriptor)(TensorDesc);
  Status (*cudnnCreateFilterDescriptor)(FilterDesc*);
  Status (*cudnnSetFilterNdDescriptor)(FilterDesc, int data_type, int format,
                                       int dims, const int* sizes);
  Status (*cudnnDestroyFilterDescriptor)(FilterDesc);
  Status (*cudnnCreateConvolutionDescriptor)(ConvDesc*);
  Status (*cudnnSetConvolutionNdDescriptor)(ConvDesc, int spatial,
                                            const int* padding,
                                            const int* stride,
                                            const int* dilation, int mode,
                                            int compute_type);
  Status (*cudnnSetConvolutionGroupCount)(ConvDesc, int groups);
  Status (*cudnnSetConvolutionMathType)(ConvDesc, int math_type);
  Status (*cudnnDestroyConvolutionDescriptor)(ConvDesc);
  Status (*cudnnGetConvolutionForwardAlgorithm_v7)(Handle, TensorDesc x,
                                                   FilterDesc w, ConvDesc,
                                                   TensorDesc y, int requested,
                                                   int* returned, AlgoPerf*);
  Status (*cudnnGetConvolutionBackwardDataAlgorithm_v7)(
      Handle, FilterDesc w, TensorDesc dy, ConvDesc, TensorDesc dx,
      int requested, int* returned, AlgoPerf*);
  Status (*cudnnGetConvolutionBackwardFilterAlgorithm_v7)(
      Handle, TensorDesc x, TensorDesc dy, ConvDesc, FilterDesc dw,
      int requested, int* returned, AlgoPerf*);
  Status (*cudnnGetConvolutionForwardWorkspaceSize)(Handle, TensorDesc x,
                                                    FilterDesc w, ConvDesc,
                                                    TensorDesc y, int algo,
                                                    size_t* bytes);
  Status (*cudnnGetConvolutionBackwardDataWorkspaceSize)(
      Handle, FilterDesc w, TensorDesc dy, ConvDesc, TensorDesc dx, int algo,
      size_t* bytes);
  Status (*cudnnGetConvolutionBackwardFilterWorkspaceSize)(
      Handle, TensorDesc x, TensorDesc dy, ConvDesc, FilterDesc dw, int algo,
      size_t* bytes);
  Status (*cudnnConvolutionForward)(Handle, const void* alpha, TensorDesc x,
                                    const void* x_data, FilterDesc w,
                                    const void* w_data, ConvDesc, int algo,
                                    void* workspace, size_t workspace_bytes,
                                    const void* beta, TensorDesc y,
                                    void* y_data);
  Status (*cudnnConvolutionBackwardData)(
      Handle, const void* alpha, FilterDesc w, const void* w_data,
      TensorDesc dy, const void* dy_data, ConvDesc, int algo, void* workspace,
      size_t workspace_bytes, const void* beta, TensorDesc dx, void* dx_data);
  Status (*cudnnConvolutionBackwardFilter)(
      Handle, const void* alpha, TensorDesc x, const void* x_data,
      TensorDesc dy, const void* dy_data, ConvDesc, int algo, void* workspace,
      size_t workspace_bytes, const void* beta, FilterDesc dw, void* dw_data);
};
}  // namespace cudnn

}  // namespace kiln

#endif  // KILN_RUNTIME_CUDNN_API_H_
