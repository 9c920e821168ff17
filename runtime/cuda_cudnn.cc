#include "runtime/cuda_cudnn.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/cudnn_api.h"
#include "runtime/dl_error.h"
#include "runtime/gpu_timing.h"
#include "runtime/per_context.h"

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
  KILN_RESOLVE(cudnnBackendCreateDescriptor);
  KILN_RESOLVE(cudnnBackendDestroyDescriptor);
  KILN_RESOLVE(cudnnBackendFinalize);
  KILN_RESOLVE(cudnnBackendSetAttribute);
  KILN_RESOLVE(cudnnBackendGetAttribute);
  KILN_RESOLVE(cudnnBackendExecute);
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

// One call's execution plan and every descriptor it was made from (kept
// alive with it).
struct CudaConv::Plan {
  v1::Convolution::Direction direction = v1::Convolution::FORWARD;
  std::vector<Descriptor> descriptors;
  // The execution plan. Under cudnn.benchmark (Convolution.benchmark) it
  // is chosen on the first Run among `candidates` (the heuristic's first
  // engines that finalize, in its order): until then `plan` is empty.
  // Guarded by the handle's run_mu.
  mutable Descriptor plan;
  mutable std::vector<Descriptor> candidates;
  // The workspace a call needs: the largest candidate's.
  size_t workspace_bytes = 0;
  // The last call's variant pack and the addresses it binds (x, w, y,
  // workspace), reused while they repeat, as a caching allocator makes them
  // step after step. Guarded by the handle's run_mu.
  mutable Descriptor pack;
  mutable void* pack_pointers[4] = {};
};

// A cuDNN handle and the lock that serializes binding it to a stream,
// enqueueing on it and making plans with it: one per CUDA context, shared
// by the CudaConv of every executable on it (runtime/per_context.h).
struct CudaConv::Handle {
  const CudnnLibrary* lib = nullptr;
  cudnn::Handle handle = nullptr;
  absl::Mutex run_mu;
  ~Handle() {
    if (handle != nullptr) lib->api().cudnnDestroy(handle);
  }
};

absl::StatusOr<std::unique_ptr<CudaConv>> CudaConv::Create(
    cuda::Context context) {
  absl::StatusOr<const CudnnLibrary*> lib = CudnnLibrary::Get();
  if (!lib.ok()) return lib.status();
  auto make = [&]() -> absl::StatusOr<std::unique_ptr<Handle>> {
    auto h = std::make_unique<Handle>();
    h->lib = *lib;
    if (absl::Status s =
            (*lib)->Check((*lib)->api().cudnnCreate(&h->handle), "cudnnCreate");
        !s.ok()) {
      return s;
    }
    return h;
  };
  absl::StatusOr<std::shared_ptr<Handle>> handle;
  if (context != nullptr) {
    handle = SharedPerContext<Handle>(context, make);
  } else if (absl::StatusOr<std::unique_ptr<Handle>> own = make(); own.ok()) {
    handle = std::shared_ptr<Handle>(*std::move(own));
  } else {
    handle = own.status();
  }
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

// Builds backend descriptors, recording the first failure (later calls do
// nothing), so that a graph reads as a list of attribute settings.
class Builder {
 public:
  explicit Builder(const CudnnLibrary* lib) : lib_(lib) {}

  // A new descriptor of `type` (null after a failure).
  void* Make(int type) {
    if (!status_.ok()) return nullptr;
    void* d = nullptr;
    if (!Check(lib_->api().cudnnBackendCreateDescriptor(type, &d),
               "cudnnBackendCreateDescriptor")) {
      return nullptr;
    }
    made_.emplace_back(d, lib_->api().cudnnBackendDestroyDescriptor);
    return d;
  }
  void Set(void* d, int name, int type, int64_t count, const void* values) {
    if (!status_.ok()) return;
    Check(lib_->api().cudnnBackendSetAttribute(d, name, type, count, values),
          absl::StrCat("cudnnBackendSetAttribute(", name, ")"));
  }
  void SetInt64(void* d, int name, int64_t v) {
    Set(d, name, cudnn::kTypeInt64, 1, &v);
  }
  void SetDesc(void* d, int name, void* value) {
    Set(d, name, cudnn::kTypeBackendDescriptor, 1, &value);
  }
  void Finalize(void* d, const char* what) {
    if (!status_.ok()) return;
    Check(lib_->api().cudnnBackendFinalize(d),
          absl::StrCat("cudnnBackendFinalize(", what, ")"));
  }
  // A finalized tensor descriptor: NCHW-contiguous `sizes`.
  void* Tensor(int data_type, const std::vector<int64_t>& sizes, int64_t uid,
               int64_t alignment) {
    void* t = Make(cudnn::kTensorDescriptor);
    std::vector<int64_t> strides(sizes.size(), 1);
    for (size_t i = sizes.size() - 1; i-- > 0;)
      strides[i] = strides[i + 1] * sizes[i + 1];
    Set(t, cudnn::kAttrTensorDataType, cudnn::kTypeDataType, 1, &data_type);
    Set(t, cudnn::kAttrTensorDimensions, cudnn::kTypeInt64,
        static_cast<int64_t>(sizes.size()), sizes.data());
    Set(t, cudnn::kAttrTensorStrides, cudnn::kTypeInt64,
        static_cast<int64_t>(strides.size()), strides.data());
    SetInt64(t, cudnn::kAttrTensorUniqueId, uid);
    SetInt64(t, cudnn::kAttrTensorByteAlignment, alignment);
    Finalize(t, "tensor");
    return t;
  }

  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }
  std::vector<Descriptor> Release() { return std::move(made_); }

 private:
  bool Check(cudnn::Status s, absl::string_view call) {
    status_ = lib_->Check(s, call);
    return status_.ok();
  }
  const CudnnLibrary* lib_;
  absl::Status status_;
  std::vector<Descriptor> made_;
};

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
  const int data_type = DataType(dtype);
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
  Builder b(lib_);
  void* x = b.Tensor(data_type, xs, kUidX, alignment);
  void* w = b.Tensor(data_type, ws, kUidW, alignment);
  void* y = b.Tensor(data_type, ys, kUidY, alignment);
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
  const cudnn::Api& api = lib_->api();
  auto plan = std::make_shared<Plan>();
  plan->direction = conv.direction();
  std::string rejected;
  for (int heur_mode : {cudnn::kHeurModeInstant, cudnn::kHeurModeFallback}) {
    Builder h(lib_);
    void* heur = h.Make(cudnn::kEngineHeurDescriptor);
    h.SetDesc(heur, cudnn::kAttrEngineHeurOperationGraph, graph);
    h.Set(heur, cudnn::kAttrEngineHeurMode, cudnn::kTypeHeurMode, 1,
          &heur_mode);
    h.Finalize(heur, "engine heuristics");
    if (!h.ok()) continue;
    int64_t count = 0;
    if (api.cudnnBackendGetAttribute(heur, cudnn::kAttrEngineHeurResults,
                                     cudnn::kTypeBackendDescriptor, 0, &count,
                                     nullptr) != cudnn::kSuccess ||
        count <= 0) {
      continue;
    }
    count = std::min<int64_t>(count, 64);
    std::vector<void*> configs;
    for (int64_t i = 0; i < count; ++i)
      configs.push_back(h.Make(cudnn::kEngineCfgDescriptor));
    if (!h.ok()) return h.status();
    int64_t returned = 0;
    if (absl::Status s = lib_->Check(
            api.cudnnBackendGetAttribute(heur, cudnn::kAttrEngineHeurResults,
                                         cudnn::kTypeBackendDescriptor, count,
                                         &returned, configs.data()),
            "cudnnBackendGetAttribute(heuristic results)");
        !s.ok()) {
      return s;
    }
    for (int64_t i = 0; i < returned && i < count; ++i) {
      // The engine's numerical notes.
      void* engine = h.Make(cudnn::kEngineDescriptor);
      int64_t got = 0;
      int notes[cudnn::kNoteTypeCount] = {};
      int64_t num_notes = 0;
      if (!h.ok() ||
          api.cudnnBackendGetAttribute(configs[i], cudnn::kAttrEngineCfgEngine,
                                       cudnn::kTypeBackendDescriptor, 1, &got,
                                       &engine) != cudnn::kSuccess ||
          api.cudnnBackendGetAttribute(engine, cudnn::kAttrEngineNumericalNote,
                                       cudnn::kTypeNumericalNote,
                                       cudnn::kNoteTypeCount, &num_notes,
                                       notes) != cudnn::kSuccess) {
        continue;
      }
      bool skip = false;
      for (int64_t n = 0; n < num_notes && n < cudnn::kNoteTypeCount; ++n) {
        skip |= notes[n] == cudnn::kNoteDownConvertInputs;
        skip |= dtype == DType::kFloat32 && !tf32 &&
                notes[n] == cudnn::kNoteTensorCore;
        skip |=
            conv.deterministic() && notes[n] == cudnn::kNoteNondeterministic;
      }
      if (skip) continue;
      void* candidate = nullptr;
      if (api.cudnnBackendCreateDescriptor(cudnn::kExecutionPlanDescriptor,
                                           &candidate) != cudnn::kSuccess) {
        continue;
      }
      Descriptor owned(candidate, api.cudnnBackendDestroyDescriptor);
      if (api.cudnnBackendSetAttribute(
              candidate, cudnn::kAttrExecutionPlanHandle, cudnn::kTypeHandle, 1,
              &handle) != cudnn::kSuccess ||
          api.cudnnBackendSetAttribute(candidate,
                                       cudnn::kAttrExecutionPlanEngineConfig,
                                       cudnn::kTypeBackendDescriptor, 1,
                                       &configs[i]) != cudnn::kSuccess) {
        continue;
      }
      const cudnn::Status fin = api.cudnnBackendFinalize(candidate);
      if (fin != cudnn::kSuccess) {
        if (rejected.empty()) rejected = lib_->Check(fin, "plan").ToString();
        continue;
      }
      int64_t bytes = 0;
      if (api.cudnnBackendGetAttribute(
              candidate, cudnn::kAttrExecutionPlanWorkspaceSize,
              cudnn::kTypeInt64, 1, &got, &bytes) != cudnn::kSuccess ||
          bytes < 0) {
        continue;
      }
      plan->candidates.push_back(std::move(owned));
      plan->workspace_bytes =
          std::max(plan->workspace_bytes, static_cast<size_t>(bytes));
      if (plan->candidates.size() >= wanted) break;
    }
    // The heuristics' descriptors stay alive with the plan (the configs the
    // candidates hold).
    for (Descriptor& keep : h.Release())
      plan->descriptors.push_back(std::move(keep));
    if (!plan->candidates.empty()) break;
  }
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
  for (Descriptor& keep : b.Release())
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
  const bool same =
      p.pack.get() != nullptr && p.pack_pointers[0] == pointers[0] &&
      p.pack_pointers[1] == pointers[1] && p.pack_pointers[2] == pointers[2] &&
      p.pack_pointers[3] == ws;
  if (!same) {
    p.pack = Descriptor();
    void* pack = nullptr;
    if (absl::Status s =
            lib_->Check(api.cudnnBackendCreateDescriptor(
                            cudnn::kVariantPackDescriptor, &pack),
                        "cudnnBackendCreateDescriptor(variant pack)");
        !s.ok()) {
      return s;
    }
    Descriptor owned(pack, api.cudnnBackendDestroyDescriptor);
    absl::Status s = lib_->Check(
        api.cudnnBackendSetAttribute(pack, cudnn::kAttrVariantPackUniqueIds,
                                     cudnn::kTypeInt64, 3, uids),
        "cudnnBackendSetAttribute(unique ids)");
    if (s.ok()) {
      s = lib_->Check(api.cudnnBackendSetAttribute(
                          pack, cudnn::kAttrVariantPackDataPointers,
                          cudnn::kTypeVoidPtr, 3, pointers),
                      "cudnnBackendSetAttribute(data pointers)");
    }
    if (s.ok()) {
      s = lib_->Check(
          api.cudnnBackendSetAttribute(pack, cudnn::kAttrVariantPackWorkspace,
                                       cudnn::kTypeVoidPtr, 1, &ws),
          "cudnnBackendSetAttribute(workspace)");
    }
    if (s.ok()) {
      s = lib_->Check(api.cudnnBackendFinalize(pack),
                      "cudnnBackendFinalize(variant pack)");
    }
    if (!s.ok()) return s;
    p.pack = std::move(owned);
    for (int i = 0; i < 3; ++i) p.pack_pointers[i] = pointers[i];
    p.pack_pointers[3] = ws;
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
