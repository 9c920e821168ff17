#include "runtime/cudnn_graph.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/dl_error.h"
#include "runtime/per_context.h"

namespace kiln {

absl::Status CudnnLibrary::Check(cudnn::Status status,
                                 absl::string_view call) const {
  if (status == cudnn::kSuccess) return absl::OkStatus();
  const char* text = api_.cudnnGetErrorString(status);
  return absl::InternalError(absl::StrCat(
      call, ": ", text != nullptr ? text : "cuDNN error", " (", status, ")"));
}

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
      "convolutions and fused attention on CUDA need cuDNN 9, which could "
      "not be loaded (KILN_CUDNN names it): ",
      absl::StrJoin(tried, "; ")));
}

absl::StatusOr<const CudnnLibrary*> CudnnLibrary::Get() {
  // Process-wide, initialised once and thread-safely (a function-local
  // static), immutable afterwards; as CublasLtLibrary::Get.
  static const absl::StatusOr<std::unique_ptr<CudnnLibrary>> loaded = Load();
  if (!loaded.ok()) return loaded.status();
  return loaded->get();
}

absl::StatusOr<std::shared_ptr<CudnnHandle>> SharedCudnnHandle(
    const CudnnLibrary* lib, cuda::Context context) {
  auto make = [&]() -> absl::StatusOr<std::unique_ptr<CudnnHandle>> {
    auto h = std::make_unique<CudnnHandle>();
    h->lib = lib;
    if (absl::Status s =
            lib->Check(lib->api().cudnnCreate(&h->handle), "cudnnCreate");
        !s.ok()) {
      return s;
    }
    return h;
  };
  if (context != nullptr) return SharedPerContext<CudnnHandle>(context, make);
  absl::StatusOr<std::unique_ptr<CudnnHandle>> own = make();
  if (!own.ok()) return own.status();
  return std::shared_ptr<CudnnHandle>(*std::move(own));
}

int CudnnDataType(DType dtype) {
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

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;)
    strides[i - 1] = strides[i] * sizes[i];
  return strides;
}

bool CudnnGraphBuilder::Check(cudnn::Status s, absl::string_view call) {
  status_ = lib_->Check(s, call);
  return status_.ok();
}

void* CudnnGraphBuilder::Make(int type) {
  if (!status_.ok()) return nullptr;
  void* d = nullptr;
  if (!Check(lib_->api().cudnnBackendCreateDescriptor(type, &d),
             absl::StrCat("cudnnBackendCreateDescriptor(", type, ")"))) {
    return nullptr;
  }
  made_.emplace_back(d, lib_->api().cudnnBackendDestroyDescriptor);
  return d;
}

void CudnnGraphBuilder::Set(void* d, int name, int type, int64_t count,
                            const void* values) {
  if (!status_.ok()) return;
  Check(lib_->api().cudnnBackendSetAttribute(d, name, type, count, values),
        absl::StrCat("cudnnBackendSetAttribute(", name, ")"));
}

void CudnnGraphBuilder::Finalize(void* d, absl::string_view what) {
  if (!status_.ok()) return;
  Check(lib_->api().cudnnBackendFinalize(d),
        absl::StrCat("cudnnBackendFinalize(", what, ")"));
}

void* CudnnGraphBuilder::Tensor(const TensorSpec& spec) {
  void* t = Make(cudnn::kTensorDescriptor);
  const std::vector<int64_t> strides =
      spec.strides.empty() ? RowMajorStrides(spec.sizes) : spec.strides;
  Set(t, cudnn::kAttrTensorDataType, cudnn::kTypeDataType, 1, &spec.data_type);
  Set(t, cudnn::kAttrTensorDimensions, cudnn::kTypeInt64,
      static_cast<int64_t>(spec.sizes.size()), spec.sizes.data());
  Set(t, cudnn::kAttrTensorStrides, cudnn::kTypeInt64,
      static_cast<int64_t>(strides.size()), strides.data());
  SetInt64(t, cudnn::kAttrTensorUniqueId, spec.uid);
  SetInt64(t, cudnn::kAttrTensorByteAlignment, spec.alignment);
  if (spec.is_virtual) {
    const bool yes = true;
    Set(t, cudnn::kAttrTensorIsVirtual, cudnn::kTypeBoolean, 1, &yes);
  }
  if (spec.by_value) {
    const bool yes = true;
    Set(t, cudnn::kAttrTensorIsByValue, cudnn::kTypeBoolean, 1, &yes);
  }
  Finalize(t, absl::StrCat("tensor ", spec.uid));
  return t;
}

absl::StatusOr<CudnnPlans> FinalizeCudnnPlans(
    const CudnnLibrary& lib, cudnn::Handle handle, void* graph,
    absl::FunctionRef<bool(absl::Span<const int> notes)> skip, size_t wanted) {
  const cudnn::Api& api = lib.api();
  CudnnPlans out;
  for (int heur_mode : {cudnn::kHeurModeInstant, cudnn::kHeurModeFallback}) {
    CudnnGraphBuilder h(&lib);
    void* heur = h.Make(cudnn::kEngineHeurDescriptor);
    h.SetDesc(heur, cudnn::kAttrEngineHeurOperationGraph, graph);
    h.Set(heur, cudnn::kAttrEngineHeurMode, cudnn::kTypeHeurMode, 1,
          &heur_mode);
    h.Finalize(heur, "engine heuristics");
    if (!h.ok()) {
      if (out.rejected.empty()) out.rejected = h.status().ToString();
      continue;
    }
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
    if (absl::Status s = lib.Check(
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
      if (skip(absl::MakeConstSpan(
              notes, std::min<int64_t>(num_notes, cudnn::kNoteTypeCount)))) {
        continue;
      }
      void* candidate = nullptr;
      if (api.cudnnBackendCreateDescriptor(cudnn::kExecutionPlanDescriptor,
                                           &candidate) != cudnn::kSuccess) {
        continue;
      }
      CudnnDescriptor owned(candidate, api.cudnnBackendDestroyDescriptor);
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
        if (out.rejected.empty())
          out.rejected = lib.Check(fin, "plan").ToString();
        continue;
      }
      int64_t bytes = 0;
      if (api.cudnnBackendGetAttribute(
              candidate, cudnn::kAttrExecutionPlanWorkspaceSize,
              cudnn::kTypeInt64, 1, &got, &bytes) != cudnn::kSuccess ||
          bytes < 0) {
        continue;
      }
      out.plans.push_back(std::move(owned));
      out.workspace_bytes =
          std::max(out.workspace_bytes, static_cast<size_t>(bytes));
      if (out.plans.size() >= wanted) break;
    }
    for (CudnnDescriptor& keep : h.Release())
      out.keep.push_back(std::move(keep));
    if (!out.plans.empty()) break;
  }
  return out;
}

absl::Status CudnnVariantPack::Bind(const CudnnLibrary& lib,
                                    absl::Span<const int64_t> uids,
                                    absl::Span<void* const> pointers,
                                    void* workspace) {
  if (pack_.get() != nullptr && pointers_.size() == pointers.size() + 1 &&
      std::equal(pointers.begin(), pointers.end(), pointers_.begin()) &&
      pointers_.back() == workspace) {
    return absl::OkStatus();
  }
  pack_ = CudnnDescriptor();
  pointers_.clear();
  const cudnn::Api& api = lib.api();
  void* pack = nullptr;
  if (absl::Status s = lib.Check(api.cudnnBackendCreateDescriptor(
                                     cudnn::kVariantPackDescriptor, &pack),
                                 "cudnnBackendCreateDescriptor(variant pack)");
      !s.ok()) {
    return s;
  }
  CudnnDescriptor owned(pack, api.cudnnBackendDestroyDescriptor);
  const int64_t n = static_cast<int64_t>(uids.size());
  absl::Status s = lib.Check(
      api.cudnnBackendSetAttribute(pack, cudnn::kAttrVariantPackUniqueIds,
                                   cudnn::kTypeInt64, n, uids.data()),
      "cudnnBackendSetAttribute(unique ids)");
  if (s.ok()) {
    s = lib.Check(
        api.cudnnBackendSetAttribute(pack, cudnn::kAttrVariantPackDataPointers,
                                     cudnn::kTypeVoidPtr, n, pointers.data()),
        "cudnnBackendSetAttribute(data pointers)");
  }
  if (s.ok()) {
    s = lib.Check(
        api.cudnnBackendSetAttribute(pack, cudnn::kAttrVariantPackWorkspace,
                                     cudnn::kTypeVoidPtr, 1, &workspace),
        "cudnnBackendSetAttribute(workspace)");
  }
  if (s.ok()) {
    s = lib.Check(api.cudnnBackendFinalize(pack),
                  "cudnnBackendFinalize(variant pack)");
  }
  if (!s.ok()) return s;
  pack_ = std::move(owned);
  pointers_.assign(pointers.begin(), pointers.end());
  pointers_.push_back(workspace);
  return absl::OkStatus();
}

}  // namespace kiln
