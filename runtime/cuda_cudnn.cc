#include "runtime/cuda_cudnn.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/cudnn_api.h"
#include "runtime/cudnn_graph.h"
#include "runtime/gpu_timing.h"

namespace kiln {

// One call's execution plan and every descriptor it was made from (kept
// alive with it).
struct CudaConv::Plan {
  v1::Convolution::Direction direction = v1::Convolution::FORWARD;
  std::vector<CudnnDescriptor> descriptors;
  // The execution plan. Under cudnn.benchmark (Convolution.benchmark) it
  // is chosen on the first Run among `candidates` (the heuristic's first
  // engines that finalize, in its order): until then `plan` is empty.
  // Guarded by the handle's run_mu.
  mutable CudnnDescriptor plan;
  mutable std::vector<CudnnDescriptor> candidates;
  // The workspace a call needs: the largest candidate's.
  size_t workspace_bytes = 0;
  // The last call's variant pack (x, w, y, workspace), reused while its
  // addresses repeat. Guarded by the handle's run_mu.
  mutable CudnnVariantPack pack;
};

absl::StatusOr<std::unique_ptr<CudaConv>> CudaConv::Create(
    cuda::Context context) {
  absl::StatusOr<const CudnnLibrary*> lib = CudnnLibrary::Get();
  if (!lib.ok()) return lib.status();
  absl::StatusOr<std::shared_ptr<CudnnHandle>> handle =
      SharedCudnnHandle(*lib, context);
  if (!handle.ok()) return handle.status();
  return std::unique_ptr<CudaConv>(new CudaConv(*lib, *std::move(handle)));
}

CudaConv::~CudaConv() {
  // The plans (made with the handle) go before the handle, which goes with
  // the last CudaConv of its context.
  absl::MutexLock lock(&mu_);
  plans_.clear();
}

const std::string& CudaConv::library() const { return lib_->name(); }
size_t CudaConv::version() const { return lib_->version(); }

namespace {

// The unique ids of the three tensors in a variant pack.
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;
// Engines timed per convolution and shape under cudnn.benchmark.
constexpr size_t kBenchmarkCandidates = 8;

}  // namespace

absl::StatusOr<CudaConv::Prepared> CudaConv::Prepare(
    int step, const v1::Convolution& conv, DType dtype, const ConvDims& d,
    int64_t alignment) const {
  if (d.x_elements == 0 || d.w_elements == 0 || d.y_elements == 0) {
    return absl::InvalidArgumentError(
        "cuDNN convolutions take no empty tensor");
  }
  const int data_type = CudnnDataType(dtype);
  if (data_type < 0) {
    return absl::UnimplementedError(
        absl::StrCat("cuDNN convolutions in ", DTypeName(dtype)));
  }
  // 1-D convolutions as 2-D ones of height 1.
  const int spatial = d.spatial == 1 ? 2 : d.spatial;
  const int lead = spatial - d.spatial;
  std::vector<int64_t> xs{d.n, d.c}, ws{d.o, d.c / d.groups}, ys{d.n, d.o};
  std::vector<int64_t> stride, padding, dilation;
  for (int s = 0; s < spatial; ++s) {
    const bool unit = s < lead;
    xs.push_back(unit ? 1 : d.x[s - lead]);
    ws.push_back(unit ? 1 : d.kernel[s - lead]);
    ys.push_back(unit ? 1 : d.out[s - lead]);
    stride.push_back(unit ? 1 : d.stride[s - lead]);
    padding.push_back(unit ? 0 : d.padding[s - lead]);
    dilation.push_back(unit ? 1 : d.dilation[s - lead]);
  }
  const bool tf32 = conv.tf32() && dtype == DType::kFloat32;

  std::string key;
  {
    std::vector<int64_t> values = {
        step,      conv.direction(),     static_cast<int64_t>(dtype),
        tf32,      conv.deterministic(), d.groups,
        alignment, conv.benchmark()};
    for (const auto* v : {&xs, &ws, &ys, &stride, &padding, &dilation})
      values.insert(values.end(), v->begin(), v->end());
    key.assign(reinterpret_cast<const char*>(values.data()),
               values.size() * sizeof(int64_t));
  }
  {
    absl::MutexLock lock(&mu_);
    if (auto it = plans_.find(key); it != plans_.end())
      return Prepared{it->second, it->second->workspace_bytes};
  }
  // Under cudnn.benchmark the first engines that finalize are timed on the
  // first call (Run); otherwise the first is the plan.
  const size_t wanted = conv.benchmark() ? kBenchmarkCandidates : 1;

  // Plans use the handle, which Run binds to streams.
  absl::MutexLock run_lock(&handle_->run_mu);
  // The operation graph: three tensors, the convolution, its operation.
  CudnnGraphBuilder b(lib_);
  void* x = b.Tensor({.data_type = data_type,
                      .sizes = xs,
                      .uid = kUidX,
                      .alignment = alignment});
  void* w = b.Tensor({.data_type = data_type,
                      .sizes = ws,
                      .uid = kUidW,
                      .alignment = alignment});
  void* y = b.Tensor({.data_type = data_type,
                      .sizes = ys,
                      .uid = kUidY,
                      .alignment = alignment});
  void* c = b.Make(cudnn::kConvolutionDescriptor);
  const int compute = cudnn::kDataFloat;
  const int mode = cudnn::kCrossCorrelation;
  const int64_t dims = spatial;
  b.Set(c, cudnn::kAttrConvCompType, cudnn::kTypeDataType, 1, &compute);
  b.Set(c, cudnn::kAttrConvMode, cudnn::kTypeConvolutionMode, 1, &mode);
  b.SetInt64(c, cudnn::kAttrConvSpatialDims, dims);
  b.Set(c, cudnn::kAttrConvDilations, cudnn::kTypeInt64, dims, dilation.data());
  b.Set(c, cudnn::kAttrConvFilterStrides, cudnn::kTypeInt64, dims,
        stride.data());
  b.Set(c, cudnn::kAttrConvPrePaddings, cudnn::kTypeInt64, dims,
        padding.data());
  b.Set(c, cudnn::kAttrConvPostPaddings, cudnn::kTypeInt64, dims,
        padding.data());
  b.Finalize(c, "convolution");
  // Each operation's attributes: ALPHA, BETA, CONV_DESC, then its three
  // tensors in the order of cudnn_api.h.
  int op_type = cudnn::kConvForwardDescriptor;
  int first = cudnn::kAttrConvForwardAlpha;
  void* tensors[3] = {w, x, y};
  switch (conv.direction()) {
    case v1::Convolution::FORWARD:
      break;
    case v1::Convolution::BACKWARD_DATA:  // W DX DY
      op_type = cudnn::kConvBackwardDataDescriptor;
      first = cudnn::kAttrConvBwdDataAlpha;
      break;
    case v1::Convolution::BACKWARD_FILTER:  // DW X DY
      op_type = cudnn::kConvBackwardFilterDescriptor;
      first = cudnn::kAttrConvBwdFilterAlpha;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown convolution direction ", conv.direction()));
  }
  void* op = b.Make(op_type);
  const float one = 1.0f, zero = 0.0f;
  b.Set(op, first, cudnn::kTypeFloat, 1, &one);
  b.Set(op, first + 1, cudnn::kTypeFloat, 1, &zero);
  b.SetDesc(op, first + 2, c);
  for (int i = 0; i < 3; ++i) b.SetDesc(op, first + 3 + i, tensors[i]);
  b.Finalize(op, "convolution operation");
  void* graph = b.Make(cudnn::kOperationGraphDescriptor);
  cudnn::Handle handle = handle_->handle;
  b.Set(graph, cudnn::kAttrOperationGraphHandle, cudnn::kTypeHandle, 1,
        &handle);
  b.SetDesc(graph, cudnn::kAttrOperationGraphOps, op);
  b.Finalize(graph, "operation graph");
  if (!b.ok()) return b.status();

  // The engines cuDNN ranks, and the first that passes PyTorch's filters
  // and finalizes into a plan.
  absl::StatusOr<CudnnPlans> found = FinalizeCudnnPlans(
      *lib_, handle, graph,
      [&](absl::Span<const int> notes) {
        bool skip = false;
        for (int note : notes) {
          skip |= note == cudnn::kNoteDownConvertInputs;
          skip |= dtype == DType::kFloat32 && !tf32 &&
                  note == cudnn::kNoteTensorCore;
          skip |= conv.deterministic() && note == cudnn::kNoteNondeterministic;
        }
        return skip;
      },
      wanted);
  if (!found.ok()) return found.status();
  auto plan = std::make_shared<Plan>();
  plan->direction = conv.direction();
  plan->candidates = std::move(found->plans);
  plan->workspace_bytes = found->workspace_bytes;
  plan->descriptors = std::move(found->keep);
  const std::string& rejected = found->rejected;
  if (plan->candidates.size() == 1) {
    plan->plan = std::move(plan->candidates[0]);
    plan->candidates.clear();
  }
  if (plan->plan.get() == nullptr && plan->candidates.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "cuDNN has no ", conv.deterministic() ? "deterministic " : "",
        "engine for this ", DTypeName(dtype), " convolution (",
        v1::Convolution::Direction_Name(conv.direction()), ")",
        rejected.empty() ? "" : "; the first rejected: ", rejected));
  }
  for (CudnnDescriptor& keep : b.Release())
    plan->descriptors.push_back(std::move(keep));
  std::shared_ptr<const Plan> made = std::move(plan);
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = plans_.try_emplace(key, made);
  return Prepared{it->second, it->second->workspace_bytes};
}

absl::Status CudaConv::Run(const Prepared& prepared, cuda::DevicePtr input,
                           cuda::DevicePtr weight, cuda::DevicePtr output,
                           cuda::DevicePtr workspace,
                           cuda::Stream stream) const {
  const Plan& p = *prepared.plan;
  const cudnn::Api& api = lib_->api();
  // The step's operands in the variant pack's order x, w, y: forward reads
  // x and w; backward data reads y and w and writes x; backward filter
  // reads x and y and writes w (artifact.proto, Convolution).
  const v1::Convolution::Direction direction = p.direction;
  void* a = reinterpret_cast<void*>(input);
  void* b = reinterpret_cast<void*>(weight);
  void* out = reinterpret_cast<void*>(output);
  void* pointers[3] = {a, b, out};
  if (direction == v1::Convolution::BACKWARD_DATA) {
    pointers[0] = out, pointers[1] = b, pointers[2] = a;
  } else if (direction == v1::Convolution::BACKWARD_FILTER) {
    pointers[0] = a, pointers[1] = out, pointers[2] = b;
  }
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  void* ws = reinterpret_cast<void*>(workspace);
  absl::MutexLock lock(&handle_->run_mu);
  if (absl::Status s = p.pack.Bind(*lib_, uids, pointers, ws); !s.ok()) {
    return s;
  }
  if (absl::Status s = lib_->Check(api.cudnnSetStream(handle_->handle, stream),
                                   "cudnnSetStream");
      !s.ok()) {
    return s;
  }
  if (!p.candidates.empty()) {
    // cudnn.benchmark: the candidates run on this call's own buffers (the
    // convolution only writes its result, which the call itself then
    // overwrites) and the fastest becomes the plan. While the stream is
    // captured into a CUDA graph the first is taken untimed.
    absl::StatusOr<size_t> fastest =
        FastestCandidate(p.candidates.size(), stream, [&](size_t i) {
          return api.cudnnBackendExecute(handle_->handle, p.candidates[i].get(),
                                         p.pack.get()) == cudnn::kSuccess;
        });
    if (!fastest.ok()) return fastest.status();
    p.plan = std::move(p.candidates[*fastest]);
    p.candidates.clear();
  }
  return lib_->Check(
      api.cudnnBackendExecute(handle_->handle, p.plan.get(), p.pack.get()),
      "cudnnBackendExecute");
}

}  // namespace kiln
