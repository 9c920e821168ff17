#include "runtime/cuda_cudnn.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/cudnn_api.h"

namespace kiln {

// The process-wide library: the handle from dlopen and the entry points.
class CudnnLibrary {
 public:
  static absl::StatusOr<const CudnnLibrary*> Get();
  const cudnn::Api& api() const { return api_; }
  const std::string& name() const { return name_; }
  size_t version() const { return version_; }

  // OK, or INTERNAL "`call`: <cuDNN's status string> (<code>)".
  absl::Status Check(cudnn::Status status, absl::string_view call) const {
    if (status == cudnn::kSuccess) return absl::OkStatus();
    const char* text = api_.cudnnGetErrorString(status);
    return absl::InternalError(absl::StrCat(
        call, ": ", text != nullptr ? text : "cuDNN error", " (", status, ")"));
  }

 private:
  static absl::StatusOr<std::unique_ptr<CudnnLibrary>> Load();
  static absl::StatusOr<std::unique_ptr<CudnnLibrary>> Open(
      const char* library);
  cudnn::Api api_{};
  std::string name_;
  size_t version_ = 0;
};

namespace {

std::string DlError() {
  const char* message = dlerror();
  return message != nullptr ? message : "unknown dlopen error";
}

// RAII for cuDNN's descriptors.
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(void* d, cudnn::Status (*destroy)(void*))
      : d_(d), destroy_(destroy) {}
  Descriptor(Descriptor&& o) noexcept : d_(o.d_), destroy_(o.destroy_) {
    o.d_ = nullptr;
  }
  Descriptor& operator=(Descriptor&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(destroy_, o.destroy_);
    return *this;
  }
  ~Descriptor() {
    if (d_ != nullptr) destroy_(d_);
  }
  void* get() const { return d_; }

 private:
  void* d_ = nullptr;
  cudnn::Status (*destroy_)(void*) = nullptr;
};

int DataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return cudnn::kDataFloat;
    case DType::kFloat16:
      return cudnn::kDataHalf;
    case DType::kBFloat16:
      return cudnn::kDataBFloat16;
    default:
      return -1;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudnnLibrary>> CudnnLibrary::Open(
    const char* library) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return absl::NotFoundError(DlError());
  // The library stays loaded for the process (like the driver): its
  // handles may be destroyed during static destruction.
  auto lib = std::unique_ptr<CudnnLibrary>(new CudnnLibrary());
  lib->name_ = library;
  std::vector<std::string> missing;
  auto resolve = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        dlsym(handle, name));
    if (fn == nullptr) missing.push_back(name);
  };
  cudnn::Api& api = lib->api_;
#define KILN_RESOLVE(name) resolve(api.name, #name)
  KILN_RESOLVE(cudnnGetVersion);
  KILN_RESOLVE(cudnnGetErrorString);
  KILN_RESOLVE(cudnnCreate);
  KILN_RESOLVE(cudnnDestroy);
  KILN_RESOLVE(cudnnSetStream);
  KILN_RESOLVE(cudnnCreateTensorDescriptor);
  KILN_RESOLVE(cudnnSetTensorNdDescriptor);
  KILN_RESOLVE(cudnnDestroyTensorDescriptor);
  KILN_RESOLVE(cudnnCreateFilterDescriptor);
  KILN_RESOLVE(cudnnSetFilterNdDescriptor);
  KILN_RESOLVE(cudnnDestroyFilterDescriptor);
  KILN_RESOLVE(cudnnCreateConvolutionDescriptor);
  KILN_RESOLVE(cudnnSetConvolutionNdDescriptor);
  KILN_RESOLVE(cudnnSetConvolutionGroupCount);
  KILN_RESOLVE(cudnnSetConvolutionMathType);
  KILN_RESOLVE(cudnnDestroyConvolutionDescriptor);
  KILN_RESOLVE(cudnnGetConvolutionForwardAlgorithm_v7);
  KILN_RESOLVE(cudnnGetConvolutionBackwardDataAlgorithm_v7);
  KILN_RESOLVE(cudnnGetConvolutionBackwardFilterAlgorithm_v7);
  KILN_RESOLVE(cudnnGetConvolutionForwardWorkspaceSize);
  KILN_RESOLVE(cudnnGetConvolutionBackwardDataWorkspaceSize);
  KILN_RESOLVE(cudnnGetConvolutionBackwardFilterWorkspaceSize);
  KILN_RESOLVE(cudnnConvolutionForward);
  KILN_RESOLVE(cudnnConvolutionBackwardData);
  KILN_RESOLVE(cudnnConvolutionBackwardFilter);
#undef KILN_RESOLVE
  if (!missing.empty()) {
    dlclose(handle);
    return absl::NotFoundError(
        absl::StrCat("missing ", absl::StrJoin(missing, ", ")));
  }
  lib->version_ = api.cudnnGetVersion();
  return lib;
}

absl::StatusOr<std::unique_ptr<CudnnLibrary>> CudnnLibrary::Load() {
  std::vector<std::string> candidates = {"libcudnn.so.9"};
  if (const char* env = std::getenv("KILN_CUDNN"); env && *env) {
    candidates = {env};
  }
  std::vector<std::string> tried;
  for (const std::string& c : candidates) {
    auto lib = Open(c.c_str());
    if (lib.ok()) return lib;
    tried.push_back(absl::StrCat(c, ": ", lib.status().message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "convolutions on CUDA need cuDNN 9, which could not be loaded "
      "(KILN_CUDNN names it): ",
      absl::StrJoin(tried, "; ")));
}

absl::StatusOr<const CudnnLibrary*> CudnnLibrary::Get() {
  // Process-wide, initialised once and thread-safely (a function-local
  // static), immutable afterwards; as CublasLtLibrary::Get.
  static const absl::StatusOr<std::unique_ptr<CudnnLibrary>> loaded = Load();
  if (!loaded.ok()) return loaded.status();
  return loaded->get();
}

// The descriptors of one call and the algorithm chosen for it.
struct CudaConv::Plan {
  v1::Convolution::Direction direction = v1::Convolution::FORWARD;
  Descriptor x, y, w, conv;
  int algo = 0;
  size_t workspace_bytes = 0;
};

absl::StatusOr<std::unique_ptr<CudaConv>> CudaConv::Create() {
  absl::StatusOr<const CudnnLibrary*> lib = CudnnLibrary::Get();
  if (!lib.ok()) return lib.status();
  cudnn::Handle handle = nullptr;
  if (absl::Status s =
          (*lib)->Check((*lib)->api().cudnnCreate(&handle), "cudnnCreate");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<CudaConv>(new CudaConv(*lib, handle));
}

CudaConv::~CudaConv() {
  if (handle_ != nullptr) lib_->api().cudnnDestroy(handle_);
}

const std::string& CudaConv::library() const { return lib_->name(); }
size_t CudaConv::version() const { return lib_->version(); }

absl::StatusOr<CudaConv::Prepared> CudaConv::Prepare(
    int step, const v1::Convolution& conv, DType dtype,
    const ConvDims& d) const {
  if (d.x_elements == 0 || d.w_elements == 0 || d.y_elements == 0) {
    return absl::InvalidArgumentError(
        "cuDNN convolutions take no empty tensor");
  }
  const int data_type = DataType(dtype);
  if (data_type < 0) {
    return absl::UnimplementedError(
        absl::StrCat("cuDNN convolutions in ", DTypeName(dtype)));
  }
  // 1-D convolutions as 2-D ones of height 1.
  const int spatial = d.spatial == 1 ? 2 : d.spatial;
  const int lead = spatial - d.spatial;
  int xs[5] = {static_cast<int>(d.n), static_cast<int>(d.c), 1, 1, 1};
  int ws[5] = {static_cast<int>(d.o), static_cast<int>(d.c / d.groups), 1, 1,
               1};
  int ys[5] = {static_cast<int>(d.n), static_cast<int>(d.o), 1, 1, 1};
  int stride[3] = {1, 1, 1}, padding[3] = {0, 0, 0}, dilation[3] = {1, 1, 1};
  for (int s = 0; s < d.spatial; ++s) {
    xs[2 + lead + s] = static_cast<int>(d.x[s]);
    ws[2 + lead + s] = static_cast<int>(d.kernel[s]);
    ys[2 + lead + s] = static_cast<int>(d.out[s]);
    stride[lead + s] = static_cast<int>(d.stride[s]);
    padding[lead + s] = static_cast<int>(d.padding[s]);
    dilation[lead + s] = static_cast<int>(d.dilation[s]);
  }
  const bool tf32 = conv.tf32() && dtype == DType::kFloat32;
  const int math = dtype != DType::kFloat32 ? cudnn::kTensorOpMath
                   : tf32                   ? cudnn::kDefaultMath
                                            : cudnn::kFmaMath;

  std::string key;
  {
    std::vector<int64_t> values = {
        step,   conv.direction(),     static_cast<int64_t>(dtype),
        tf32,   conv.deterministic(), d.groups,
        spatial};
    for (int i = 0; i < spatial + 2; ++i) {
      values.insert(values.end(), {xs[i], ws[i], ys[i]});
    }
    for (int s = 0; s < spatial; ++s) {
      values.insert(values.end(), {stride[s], padding[s], dilation[s]});
    }
    key.assign(reinterpret_cast<const char*>(values.data()),
               values.size() * sizeof(int64_t));
  }
  {
    absl::MutexLock lock(&mu_);
    if (auto it = plans_.find(key); it != plans_.end())
      return Prepared{it->second, it->second->workspace_bytes};
  }

  const cudnn::Api& api = lib_->api();
  auto plan = std::make_shared<Plan>();
  plan->direction = conv.direction();
  auto make = [&](Descriptor& out, cudnn::Status (*create)(void**),
                  cudnn::Status (*destroy)(void*),
                  const char* name) -> absl::Status {
    void* desc = nullptr;
    if (absl::Status s = lib_->Check(create(&desc), name); !s.ok()) return s;
    out = Descriptor(desc, destroy);
    return absl::OkStatus();
  };
  int x_strides[5], y_strides[5];
  x_strides[spatial + 1] = y_strides[spatial + 1] = 1;
  for (int i = spatial; i >= 0; --i) {
    x_strides[i] = x_strides[i + 1] * xs[i + 1];
    y_strides[i] = y_strides[i + 1] * ys[i + 1];
  }
  absl::Status s =
      make(plan->x, api.cudnnCreateTensorDescriptor,
           api.cudnnDestroyTensorDescriptor, "cudnnCreateTensorDescriptor");
  if (s.ok()) {
    s = make(plan->y, api.cudnnCreateTensorDescriptor,
             api.cudnnDestroyTensorDescriptor, "cudnnCreateTensorDescriptor");
  }
  if (s.ok()) {
    s = make(plan->w, api.cudnnCreateFilterDescriptor,
             api.cudnnDestroyFilterDescriptor, "cudnnCreateFilterDescriptor");
  }
  if (s.ok()) {
    s = make(plan->conv, api.cudnnCreateConvolutionDescriptor,
             api.cudnnDestroyConvolutionDescriptor,
             "cudnnCreateConvolutionDescriptor");
  }
  if (s.ok()) {
    s = lib_->Check(api.cudnnSetTensorNdDescriptor(plan->x.get(), data_type,
                                                   spatial + 2, xs, x_strides),
                    "cudnnSetTensorNdDescriptor(x)");
  }
  if (s.ok()) {
    s = lib_->Check(api.cudnnSetTensorNdDescriptor(plan->y.get(), data_type,
                                                   spatial + 2, ys, y_strides),
                    "cudnnSetTensorNdDescriptor(y)");
  }
  if (s.ok()) {
    s = lib_->Check(
        api.cudnnSetFilterNdDescriptor(plan->w.get(), data_type,
                                       cudnn::kTensorNchw, spatial + 2, ws),
        "cudnnSetFilterNdDescriptor");
  }
  if (s.ok()) {
    s = lib_->Check(api.cudnnSetConvolutionNdDescriptor(
                        plan->conv.get(), spatial, padding, stride, dilation,
                        cudnn::kCrossCorrelation, cudnn::kDataFloat),
                    "cudnnSetConvolutionNdDescriptor");
  }
  if (s.ok()) {
    s = lib_->Check(api.cudnnSetConvolutionGroupCount(
                        plan->conv.get(), static_cast<int>(d.groups)),
                    "cudnnSetConvolutionGroupCount");
  }
  if (s.ok()) {
    s = lib_->Check(api.cudnnSetConvolutionMathType(plan->conv.get(), math),
                    "cudnnSetConvolutionMathType");
  }
  if (!s.ok()) return s;

  // The heuristic's ranking; the first supported (and deterministic, when
  // asked) algorithm wins, as in PyTorch's getValidAlgorithms.
  constexpr int kMaxAlgos = 16;
  cudnn::AlgoPerf perf[kMaxAlgos] = {};
  int returned = 0;
  void* x = plan->x.get();
  void* y = plan->y.get();
  void* w = plan->w.get();
  void* c = plan->conv.get();
  switch (conv.direction()) {
    case v1::Convolution::FORWARD:
      s = lib_->Check(api.cudnnGetConvolutionForwardAlgorithm_v7(
                          handle_, x, w, c, y, kMaxAlgos, &returned, perf),
                      "cudnnGetConvolutionForwardAlgorithm_v7");
      break;
    case v1::Convolution::BACKWARD_DATA:
      s = lib_->Check(api.cudnnGetConvolutionBackwardDataAlgorithm_v7(
                          handle_, w, y, c, x, kMaxAlgos, &returned, perf),
                      "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      break;
    case v1::Convolution::BACKWARD_FILTER:
      s = lib_->Check(api.cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                          handle_, x, y, c, w, kMaxAlgos, &returned, perf),
                      "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown convolution direction ", conv.direction()));
  }
  if (!s.ok()) return s;
  const cudnn::AlgoPerf* chosen = nullptr;
  for (int i = 0; i < returned && i < kMaxAlgos; ++i) {
    if (perf[i].status != cudnn::kSuccess) continue;
    if (conv.deterministic() && perf[i].determinism != cudnn::kDeterministic)
      continue;
    // A float32 call without TF32 keeps FMA math whatever the ranking says.
    if (dtype == DType::kFloat32 && !tf32 &&
        perf[i].math_type != cudnn::kFmaMath &&
        perf[i].math_type != cudnn::kDefaultMath)
      continue;
    chosen = &perf[i];
    break;
  }
  if (chosen == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "cuDNN has no ", conv.deterministic() ? "deterministic " : "",
        "algorithm for this ", DTypeName(dtype), " convolution (",
        v1::Convolution::Direction_Name(conv.direction()), ")"));
  }
  plan->algo = chosen->algo;
  if (!(dtype == DType::kFloat32 && !tf32)) {
    s = lib_->Check(
        api.cudnnSetConvolutionMathType(plan->conv.get(), chosen->math_type),
        "cudnnSetConvolutionMathType");
    if (!s.ok()) return s;
  }
  size_t bytes = 0;
  switch (conv.direction()) {
    case v1::Convolution::FORWARD:
      s = lib_->Check(api.cudnnGetConvolutionForwardWorkspaceSize(
                          handle_, x, w, c, y, plan->algo, &bytes),
                      "cudnnGetConvolutionForwardWorkspaceSize");
      break;
    case v1::Convolution::BACKWARD_DATA:
      s = lib_->Check(api.cudnnGetConvolutionBackwardDataWorkspaceSize(
                          handle_, w, y, c, x, plan->algo, &bytes),
                      "cudnnGetConvolutionBackwardDataWorkspaceSize");
      break;
    default:
      s = lib_->Check(api.cudnnGetConvolutionBackwardFilterWorkspaceSize(
                          handle_, x, y, c, w, plan->algo, &bytes),
                      "cudnnGetConvolutionBackwardFilterWorkspaceSize");
      break;
  }
  if (!s.ok()) return s;
  plan->workspace_bytes = bytes;
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
  const float one = 1.0f, zero = 0.0f;
  void* ws = reinterpret_cast<void*>(workspace);
  const void* a = reinterpret_cast<const void*>(input);
  const void* b = reinterpret_cast<const void*>(weight);
  void* out = reinterpret_cast<void*>(output);
  absl::MutexLock lock(&run_mu_);
  if (absl::Status s =
          lib_->Check(api.cudnnSetStream(handle_, stream), "cudnnSetStream");
      !s.ok()) {
    return s;
  }
  switch (p.direction) {
    case v1::Convolution::FORWARD:  // y from (x, w)
      return lib_->Check(
          api.cudnnConvolutionForward(handle_, &one, p.x.get(), a, p.w.get(), b,
                                      p.conv.get(), p.algo, ws,
                                      p.workspace_bytes, &zero, p.y.get(), out),
          "cudnnConvolutionForward");
    case v1::Convolution::BACKWARD_DATA:  // x from (y, w)
      return lib_->Check(
          api.cudnnConvolutionBackwardData(
              handle_, &one, p.w.get(), b, p.y.get(), a, p.conv.get(), p.algo,
              ws, p.workspace_bytes, &zero, p.x.get(), out),
          "cudnnConvolutionBackwardData");
    default:  // w from (x, y)
      return lib_->Check(
          api.cudnnConvolutionBackwardFilter(
              handle_, &one, p.x.get(), a, p.y.get(), b, p.conv.get(), p.algo,
              ws, p.workspace_bytes, &zero, p.w.get(), out),
          "cudnnConvolutionBackwardFilter");
  }
}

}  // namespace kiln
