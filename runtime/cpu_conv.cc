#include "runtime/cpu_conv.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/cpu_blas.h"
#include "runtime/dl_error.h"
#include "support/half.h"

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#if DNNL_VERSION_MAJOR == 2
#define KILN_HAVE_ONEDNN 1
#endif
#endif

namespace kiln {

#if KILN_HAVE_ONEDNN

namespace {

// The most plans (step and shape) one executable keeps.
constexpr size_t kMaxPlans = 256;

// The entry points Kiln calls, found with dlsym (types from oneDNN 2.x's
// header; the library is never linked).
struct DnnlApi {
  decltype(&dnnl_engine_create) engine_create = nullptr;
  decltype(&dnnl_stream_create) stream_create = nullptr;
  decltype(&dnnl_stream_wait) stream_wait = nullptr;
  decltype(&dnnl_stream_destroy) stream_destroy = nullptr;
  decltype(&dnnl_memory_desc_init_by_tag) md_init_by_tag = nullptr;
  decltype(&dnnl_memory_desc_init_by_strides) md_init_by_strides = nullptr;
  decltype(&dnnl_memory_desc_get_size) md_get_size = nullptr;
  decltype(&dnnl_memory_desc_equal) md_equal = nullptr;
  decltype(&dnnl_dilated_convolution_forward_desc_init) forward_init = nullptr;
  decltype(&dnnl_dilated_convolution_backward_data_desc_init) data_init =
      nullptr;
  decltype(&dnnl_dilated_convolution_backward_weights_desc_init) weights_init =
      nullptr;
  decltype(&dnnl_primitive_desc_create) pd_create = nullptr;
  decltype(&dnnl_primitive_desc_query_md) pd_query_md = nullptr;
  decltype(&dnnl_primitive_desc_destroy) pd_destroy = nullptr;
  decltype(&dnnl_reorder_primitive_desc_create) reorder_pd_create = nullptr;
  decltype(&dnnl_primitive_create) primitive_create = nullptr;
  decltype(&dnnl_primitive_execute) primitive_execute = nullptr;
  decltype(&dnnl_primitive_destroy) primitive_destroy = nullptr;
  decltype(&dnnl_memory_create) memory_create = nullptr;
  decltype(&dnnl_memory_destroy) memory_destroy = nullptr;
  decltype(&dnnl_primitive_attr_create) attr_create = nullptr;
  decltype(&dnnl_primitive_attr_destroy) attr_destroy = nullptr;
  decltype(&dnnl_primitive_attr_set_scratchpad_mode) attr_set_scratchpad =
      nullptr;
  decltype(&dnnl_version) version = nullptr;
};

// The process's oneDNN: its entry points and its CPU engine (never
// unloaded: primitives of executables may outlive any owner).
struct DnnlLibrary {
  void* handle = nullptr;
  std::string name;
  DnnlApi api;
  dnnl_engine_t engine = nullptr;
};

template <typename Fn>
bool Find(void* handle, const char* symbol, Fn* fn,
          std::vector<std::string>* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*fn == nullptr) missing->push_back(symbol);
  return *fn != nullptr;
}

absl::StatusOr<std::unique_ptr<DnnlLibrary>> OpenLibrary() {
  std::string name = "libdnnl.so.2";
  if (const char* env = std::getenv("KILN_ONEDNN"); env != nullptr && *env) {
    if (std::string(env) == "0") {
      return absl::FailedPreconditionError(
          "oneDNN is turned off (KILN_ONEDNN=0)");
    }
    name = env;
  }
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load oneDNN for CPU convolutions (install "
                     "Debian's libdnnl2, or set KILN_ONEDNN): ",
                     DlError()));
  }
  auto lib = std::make_unique<DnnlLibrary>();
  lib->handle = handle;
  lib->name = name;
  DnnlApi& a = lib->api;
  std::vector<std::string> missing;
  Find(handle, "dnnl_engine_create", &a.engine_create, &missing);
  Find(handle, "dnnl_stream_create", &a.stream_create, &missing);
  Find(handle, "dnnl_stream_wait", &a.stream_wait, &missing);
  Find(handle, "dnnl_stream_destroy", &a.stream_destroy, &missing);
  Find(handle, "dnnl_memory_desc_init_by_tag", &a.md_init_by_tag, &missing);
  Find(handle, "dnnl_memory_desc_init_by_strides", &a.md_init_by_strides,
       &missing);
  Find(handle, "dnnl_memory_desc_get_size", &a.md_get_size, &missing);
  Find(handle, "dnnl_memory_desc_equal", &a.md_equal, &missing);
  Find(handle, "dnnl_dilated_convolution_forward_desc_init", &a.forward_init,
       &missing);
  Find(handle, "dnnl_dilated_convolution_backward_data_desc_init", &a.data_init,
       &missing);
  Find(handle, "dnnl_dilated_convolution_backward_weights_desc_init",
       &a.weights_init, &missing);
  Find(handle, "dnnl_primitive_desc_create", &a.pd_create, &missing);
  Find(handle, "dnnl_primitive_desc_query_md", &a.pd_query_md, &missing);
  Find(handle, "dnnl_primitive_desc_destroy", &a.pd_destroy, &missing);
  Find(handle, "dnnl_reorder_primitive_desc_create", &a.reorder_pd_create,
       &missing);
  Find(handle, "dnnl_primitive_create", &a.primitive_create, &missing);
  Find(handle, "dnnl_primitive_execute", &a.primitive_execute, &missing);
  Find(handle, "dnnl_primitive_destroy", &a.primitive_destroy, &missing);
  Find(handle, "dnnl_memory_create", &a.memory_create, &missing);
  Find(handle, "dnnl_memory_destroy", &a.memory_destroy, &missing);
  Find(handle, "dnnl_primitive_attr_create", &a.attr_create, &missing);
  Find(handle, "dnnl_primitive_attr_destroy", &a.attr_destroy, &missing);
  Find(handle, "dnnl_primitive_attr_set_scratchpad_mode",
       &a.attr_set_scratchpad, &missing);
  Find(handle, "dnnl_version", &a.version, &missing);
  if (!missing.empty()) {
    dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is not oneDNN 2.x: no ", missing.front()));
  }
  const dnnl_version_t* v = a.version();
  if (v == nullptr || v->major != 2) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        name, " is oneDNN ", v ? v->major : 0, ".x; Kiln calls 2.x's API"));
  }
  lib->name = absl::StrCat(name, " (oneDNN ", v->major, ".", v->minor, ".",
                           v->patch, ")");
  if (dnnl_status_t s = a.engine_create(&lib->engine, dnnl_cpu, 0);
      s != dnnl_success) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": dnnl_engine_create failed with status ", static_cast<int>(s)));
  }
  return lib;
}

// The process-wide library, loaded on first use.
const absl::StatusOr<std::unique_ptr<DnnlLibrary>>& Library() {
  static const absl::StatusOr<std::unique_ptr<DnnlLibrary>> lib = OpenLibrary();
  return lib;
}

absl::Status Check(dnnl_status_t s, const char* call) {
  if (s == dnnl_success) return absl::OkStatus();
  const std::string message =
      absl::StrCat("oneDNN ", call, " failed with status ", static_cast<int>(s),
                   s == dnnl_unimplemented ? " (unimplemented)" : "");
  // Unimplemented: this library has no such primitive on this CPU (a
  // bfloat16 convolution without AVX-512): Run widens to float32 then.
  return s == dnnl_unimplemented ? absl::UnimplementedError(message)
                                 : absl::InternalError(message);
}

// Owners of oneDNN handles, destroyed through the loaded library.
template <typename T>
struct Destroy {
  dnnl_status_t (*fn)(T) = nullptr;
  void operator()(T h) const {
    if (h != nullptr && fn != nullptr) fn(h);
  }
};
template <typename T>
using Owned = std::unique_ptr<std::remove_pointer_t<T>, Destroy<T>>;

// 64-byte aligned scratch memory for one call.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Scratch = std::unique_ptr<void, FreeDeleter>;
absl::StatusOr<Scratch> AllocateScratch(size_t bytes) {
  if (bytes == 0) return Scratch();
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", rounded, " bytes for oneDNN"));
  }
  return Scratch(p);
}

// Contiguous (row-major) strides of `dims`.
void ContiguousStrides(int ndims, const dnnl_dims_t dims, dnnl_dims_t strides) {
  int64_t s = 1;
  for (int d = ndims - 1; d >= 0; --d) {
    strides[d] = s;
    s *= std::max<int64_t>(dims[d], 1);
  }
}

}  // namespace

// One operand of the convolution: how the program's buffer lays it out
// (`user`), how the primitive wants it (`inner`), and the reorder between
// them (null when they are the same layout).
struct ConvOperand {
  dnnl_memory_desc_t user{};
  dnnl_memory_desc_t inner{};
  size_t inner_bytes = 0;
  int arg = 0;  // DNNL_ARG_*
  Owned<dnnl_primitive_t> reorder;
  size_t reorder_scratch = 0;
};

struct CpuConv::Plan {
  Owned<dnnl_primitive_t> conv;
  size_t scratch_bytes = 0;
  ConvOperand operand[3];  // a, b, c of the step
  // The written tensor is x and the convolution reads only its leading
  // part (a right padding below zero): the rest is zeros.
  bool zero_written_first = false;
  // Some spatial dim reads no element of x at all: every product is zero.
  bool all_zero = false;
};

namespace {

absl::StatusOr<Owned<dnnl_primitive_t>> MakePrimitive(
    const DnnlApi& api, const_dnnl_primitive_desc_t pd) {
  dnnl_primitive_t p = nullptr;
  if (absl::Status s = Check(api.primitive_create(&p, pd), "primitive_create");
      !s.ok()) {
    return s;
  }
  return Owned<dnnl_primitive_t>(
      p, Destroy<dnnl_primitive_t>{api.primitive_destroy});
}

// A primitive attribute asking for user-managed scratchpad memory (each
// call brings its own, so concurrent calls never share one).
absl::StatusOr<Owned<dnnl_primitive_attr_t>> UserScratchpadAttr(
    const DnnlApi& api) {
  dnnl_primitive_attr_t attr = nullptr;
  if (absl::Status s = Check(api.attr_create(&attr), "primitive_attr_create");
      !s.ok()) {
    return s;
  }
  Owned<dnnl_primitive_attr_t> owned(
      attr, Destroy<dnnl_primitive_attr_t>{api.attr_destroy});
  if (absl::Status s =
          Check(api.attr_set_scratchpad(attr, dnnl_scratchpad_mode_user),
                "primitive_attr_set_scratchpad_mode");
      !s.ok()) {
    return s;
  }
  return owned;
}

size_t ScratchpadBytes(const DnnlApi& api, const_dnnl_primitive_desc_t pd) {
  const dnnl_memory_desc_t* md =
      api.pd_query_md(pd, dnnl_query_scratchpad_md, 0);
  return md != nullptr ? api.md_get_size(md) : 0;
}

// Fills in `op.inner` from the primitive and, where it differs from
// `op.user`, the reorder between them (user to inner for an operand, inner
// to user for the written tensor).
absl::Status PrepareOperand(const DnnlLibrary& lib,
                            const_dnnl_primitive_desc_t pd, dnnl_query_t query,
                            bool written, ConvOperand& op) {
  const DnnlApi& api = lib.api;
  const dnnl_memory_desc_t* inner = api.pd_query_md(pd, query, 0);
  if (inner == nullptr) return absl::InternalError("oneDNN: no operand desc");
  op.inner = *inner;
  op.inner_bytes = api.md_get_size(&op.inner);
  if (api.md_equal(&op.user, &op.inner)) return absl::OkStatus();
  absl::StatusOr<Owned<dnnl_primitive_attr_t>> attr = UserScratchpadAttr(api);
  if (!attr.ok()) return attr.status();
  dnnl_primitive_desc_t rpd = nullptr;
  const dnnl_memory_desc_t& from = written ? op.inner : op.user;
  const dnnl_memory_desc_t& to = written ? op.user : op.inner;
  if (absl::Status s = Check(api.reorder_pd_create(&rpd, &from, lib.engine, &to,
                                                   lib.engine, attr->get()),
                             "reorder_primitive_desc_create");
      !s.ok()) {
    return s;
  }
  Owned<dnnl_primitive_desc_t> owned_rpd(
      rpd, Destroy<dnnl_primitive_desc_t>{api.pd_destroy});
  op.reorder_scratch = ScratchpadBytes(api, rpd);
  absl::StatusOr<Owned<dnnl_primitive_t>> reorder = MakePrimitive(api, rpd);
  if (!reorder.ok()) return reorder.status();
  op.reorder = *std::move(reorder);
  return absl::OkStatus();
}

// `operands`: the data type of the two tensors the call reads (dnnl_f32,
// or dnnl_bf16 for a bfloat16 call); the tensor it writes is float32.
absl::StatusOr<std::unique_ptr<CpuConv::Plan>> MakePlan(
    const DnnlLibrary& lib, const v1::Convolution& conv, const ConvDims& d,
    dnnl_data_type_t operands) {
  const DnnlApi& api = lib.api;
  auto plan = std::make_unique<CpuConv::Plan>();
  const int sp = d.spatial;
  const int nd = 2 + sp;
  // x, as the convolution reads it: a spatial dim whose windows end before
  // x does (PyTorch floors the output size; oneDNN wants the right padding
  // to make it exact, and some of its kernels take none below zero) is
  // described up to the last element a window reads, with x's own strides.
  dnnl_dims_t x_dims{}, x_strides{}, w_dims{}, y_dims{};
  dnnl_dims_t strides{}, dilates{}, pad_l{}, pad_r{};
  x_dims[0] = d.n;
  x_dims[1] = d.c;
  y_dims[0] = d.n;
  y_dims[1] = d.o;
  for (int s = 0; s < sp; ++s) {
    x_dims[2 + s] = d.x[s];
    y_dims[2 + s] = d.out[s];
  }
  ContiguousStrides(nd, x_dims, x_strides);
  for (int s = 0; s < sp; ++s) {
    const int64_t extent =
        (d.out[s] - 1) * d.stride[s] + (d.kernel[s] - 1) * d.dilation[s] + 1;
    int64_t right = extent - d.x[s] - d.padding[s];
    if (right < 0) {
      x_dims[2 + s] = d.x[s] + right;
      right = 0;
      plan->zero_written_first = true;
    }
    if (x_dims[2 + s] <= 0) plan->all_zero = true;
    strides[s] = d.stride[s];
    dilates[s] = d.dilation[s] - 1;
    pad_l[s] = d.padding[s];
    pad_r[s] = right;
  }
  // The weight: [O, C/G, *K], or [G, O/G, C/G, *K] with groups (the same
  // contiguous memory).
  int w_nd = nd;
  if (d.groups > 1) {
    w_nd = nd + 1;
    w_dims[0] = d.groups;
    w_dims[1] = d.o / d.groups;
    w_dims[2] = d.c / d.groups;
    for (int s = 0; s < sp; ++s) w_dims[3 + s] = d.kernel[s];
  } else {
    w_dims[0] = d.o;
    w_dims[1] = d.c;
    for (int s = 0; s < sp; ++s) w_dims[2 + s] = d.kernel[s];
  }
  const v1::Convolution::Direction direction = conv.direction();
  plan->zero_written_first &= direction == v1::Convolution::BACKWARD_DATA;
  if (plan->all_zero) return plan;

  // Each tensor's data type: the written one float32, the others
  // `operands`.
  const dnnl_data_type_t x_type =
      direction == v1::Convolution::BACKWARD_DATA ? dnnl_f32 : operands;
  const dnnl_data_type_t w_type =
      direction == v1::Convolution::BACKWARD_FILTER ? dnnl_f32 : operands;
  const dnnl_data_type_t y_type =
      direction == v1::Convolution::FORWARD ? dnnl_f32 : operands;
  dnnl_memory_desc_t x_user, w_user, y_user, x_any, w_any, y_any;
  // The forward hint of a backward call: every tensor `operands`.
  dnnl_memory_desc_t x_hint, w_hint, y_hint;
  dnnl_dims_t w_strides{}, y_strides{};
  ContiguousStrides(w_nd, w_dims, w_strides);
  ContiguousStrides(nd, y_dims, y_strides);
  for (auto [md, n, dims, type, strides_of] :
       {std::tuple{&x_user, nd, &x_dims, x_type, &x_strides},
        std::tuple{&w_user, w_nd, &w_dims, w_type, &w_strides},
        std::tuple{&y_user, nd, &y_dims, y_type, &y_strides}}) {
    if (absl::Status s =
            Check(api.md_init_by_strides(md, n, *dims, type, *strides_of),
                  "memory_desc_init_by_strides");
        !s.ok()) {
      return s;
    }
  }
  for (auto [md, n, dims, type] :
       {std::tuple{&x_any, nd, &x_dims, x_type},
        std::tuple{&w_any, w_nd, &w_dims, w_type},
        std::tuple{&y_any, nd, &y_dims, y_type},
        std::tuple{&x_hint, nd, &x_dims, operands},
        std::tuple{&w_hint, w_nd, &w_dims, operands},
        std::tuple{&y_hint, nd, &y_dims, operands}}) {
    if (absl::Status s =
            Check(api.md_init_by_tag(md, n, *dims, type, dnnl_format_tag_any),
                  "memory_desc_init_by_tag");
        !s.ok()) {
      return s;
    }
  }

  // The forward description: the primitive of FORWARD, the hint of the
  // backward ones.
  const bool forward = direction == v1::Convolution::FORWARD;
  dnnl_convolution_desc_t fwd_desc;
  if (absl::Status s = Check(
          api.forward_init(
              &fwd_desc, dnnl_forward_training, dnnl_convolution_direct,
              forward ? &x_any : &x_hint, forward ? &w_any : &w_hint, nullptr,
              forward ? &y_any : &y_hint, strides, dilates, pad_l, pad_r),
          "dilated_convolution_forward_desc_init");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Owned<dnnl_primitive_attr_t>> attr = UserScratchpadAttr(api);
  if (!attr.ok()) return attr.status();
  dnnl_primitive_desc_t fwd_pd = nullptr;
  if (absl::Status s = Check(
          api.pd_create(&fwd_pd, &fwd_desc, attr->get(), lib.engine, nullptr),
          "primitive_desc_create (forward)");
      !s.ok()) {
    return s;
  }
  Owned<dnnl_primitive_desc_t> fwd(
      fwd_pd, Destroy<dnnl_primitive_desc_t>{api.pd_destroy});
  Owned<dnnl_primitive_desc_t> bwd;
  const_dnnl_primitive_desc_t pd = fwd.get();
  // Operands a, b, c in the step's order (artifact.proto, Convolution):
  // the program's layout of each, its argument and the query of its layout
  // in the primitive.
  struct Binding {
    const dnnl_memory_desc_t* user;
    int arg;
    dnnl_query_t query;
  };
  std::array<Binding, 3> bindings;
  if (direction == v1::Convolution::FORWARD) {
    bindings = {{{&x_user, DNNL_ARG_SRC, dnnl_query_src_md},
                 {&w_user, DNNL_ARG_WEIGHTS, dnnl_query_weights_md},
                 {&y_user, DNNL_ARG_DST, dnnl_query_dst_md}}};
  } else {
    dnnl_convolution_desc_t bwd_desc;
    const bool data = direction == v1::Convolution::BACKWARD_DATA;
    if (absl::Status s = Check(
            data ? api.data_init(&bwd_desc, dnnl_convolution_direct, &x_any,
                                 &w_any, &y_any, strides, dilates, pad_l, pad_r)
                 : api.weights_init(&bwd_desc, dnnl_convolution_direct, &x_any,
                                    &w_any, nullptr, &y_any, strides, dilates,
                                    pad_l, pad_r),
            data ? "dilated_convolution_backward_data_desc_init"
                 : "dilated_convolution_backward_weights_desc_init");
        !s.ok()) {
      return s;
    }
    dnnl_primitive_desc_t bwd_pd = nullptr;
    if (absl::Status s = Check(api.pd_create(&bwd_pd, &bwd_desc, attr->get(),
                                             lib.engine, fwd.get()),
                               "primitive_desc_create (backward)");
        !s.ok()) {
      return s;
    }
    bwd = Owned<dnnl_primitive_desc_t>(
        bwd_pd, Destroy<dnnl_primitive_desc_t>{api.pd_destroy});
    pd = bwd.get();
    if (data) {
      bindings = {{{&y_user, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md},
                   {&w_user, DNNL_ARG_WEIGHTS, dnnl_query_weights_md},
                   {&x_user, DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md}}};
    } else {
      bindings = {
          {{&x_user, DNNL_ARG_SRC, dnnl_query_src_md},
           {&y_user, DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md},
           {&w_user, DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md}}};
    }
  }
  for (int i = 0; i < 3; ++i) {
    ConvOperand& op = plan->operand[i];
    op.user = *bindings[i].user;
    op.arg = bindings[i].arg;
    if (absl::Status s = PrepareOperand(lib, pd, bindings[i].query, i == 2, op);
        !s.ok()) {
      return s;
    }
  }
  plan->scratch_bytes = ScratchpadBytes(api, pd);
  absl::StatusOr<Owned<dnnl_primitive_t>> prim = MakePrimitive(api, pd);
  if (!prim.ok()) return prim.status();
  plan->conv = *std::move(prim);
  return plan;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuConv>> CpuConv::Create() {
  const auto& lib = Library();
  if (!lib.ok()) return lib.status();
  return std::unique_ptr<CpuConv>(new CpuConv());  // private constructor
}

bool CpuConv::Available() { return Library().ok(); }

std::string CpuConv::Describe() {
  const auto& lib = Library();
  return lib.ok() ? (*lib)->name : std::string(lib.status().message());
}

CpuConv::~CpuConv() = default;

absl::StatusOr<std::shared_ptr<const CpuConv::Plan>> CpuConv::GetPlan(
    int step, const v1::Convolution& conv, const ConvDims& d,
    bool bf16_operands) const {
  std::vector<int64_t> key = {step, bf16_operands, d.spatial, d.n,
                              d.c,  d.o,           d.groups};
  for (int s = 0; s < d.spatial; ++s) {
    key.insert(key.end(), {d.x[s], d.kernel[s], d.out[s], d.stride[s],
                           d.padding[s], d.dilation[s]});
  }
  {
    absl::MutexLock lock(&mu_);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  }
  // Made outside the lock (oneDNN's kernel generation takes milliseconds);
  // two threads racing on one shape make it twice and keep the first.
  absl::StatusOr<std::unique_ptr<Plan>> made =
      MakePlan(**Library(), conv, d, bf16_operands ? dnnl_bf16 : dnnl_f32);
  if (!made.ok()) return made.status();
  std::shared_ptr<const Plan> plan = *std::move(made);
  absl::MutexLock lock(&mu_);
  // A dynamic batch makes a plan per size: bounded, the oldest dropped
  // all at once (running calls keep theirs).
  if (plans_.size() >= kMaxPlans) plans_.clear();
  return plans_.try_emplace(std::move(key), std::move(plan)).first->second;
}

absl::Status CpuConv::Run(int step, const v1::Convolution& conv,
                          const ConvDims& dims, const void* a, const void* b,
                          void* c) const {
  const bool bf16 =
      conv.dtype() == v1::BFLOAT16 && conv.result_dtype() == v1::FLOAT32;
  if (conv.dtype() != v1::FLOAT32 && !bf16) {
    return absl::InvalidArgumentError(
        "artifact: CPU library convolutions take float32, or bfloat16 "
        "operands written into float32");
  }
  const v1::Convolution::Direction direction = conv.direction();
  const int64_t written =
      direction == v1::Convolution::FORWARD         ? dims.y_elements
      : direction == v1::Convolution::BACKWARD_DATA ? dims.x_elements
                                                    : dims.w_elements;
  if (written == 0) return absl::OkStatus();
  if (dims.x_elements == 0 || dims.w_elements == 0 || dims.y_elements == 0) {
    // An empty sum: the written tensor is zeros.
    std::memset(c, 0, static_cast<size_t>(written) * sizeof(float));
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<const Plan>> got =
      bf16 && !CpuBlas::OneDnnBf16Allowed()
          ? absl::UnimplementedError("KILN_ONEDNN_BF16=0")
          : GetPlan(step, conv, dims, bf16);
  if (bf16 && !got.ok() && absl::IsUnimplemented(got.status())) {
    // No bfloat16 convolution in this oneDNN on this CPU (it needs
    // AVX-512): the operands widened to float32 (exactly), the float32
    // call.
    const int64_t a_elements = direction == v1::Convolution::BACKWARD_DATA
                                   ? dims.y_elements
                                   : dims.x_elements;
    const int64_t b_elements = direction == v1::Convolution::BACKWARD_FILTER
                                   ? dims.y_elements
                                   : dims.w_elements;
    std::vector<float> wa(static_cast<size_t>(a_elements));
    std::vector<float> wb(static_cast<size_t>(b_elements));
    BFloat16ToFloat(static_cast<const uint16_t*>(a), a_elements, wa.data());
    BFloat16ToFloat(static_cast<const uint16_t*>(b), b_elements, wb.data());
    v1::Convolution f32 = conv;
    f32.set_dtype(v1::FLOAT32);
    f32.clear_result_dtype();
    return Run(step, f32, dims, wa.data(), wb.data(), c);
  }
  if (!got.ok()) return got.status();
  const Plan& plan = **got;
  if (plan.all_zero || plan.zero_written_first) {
    std::memset(c, 0, static_cast<size_t>(written) * sizeof(float));
    if (plan.all_zero) return absl::OkStatus();
  }
  const DnnlLibrary& lib = **Library();
  const DnnlApi& api = lib.api;

  dnnl_stream_t raw_stream = nullptr;
  if (absl::Status s = Check(
          api.stream_create(&raw_stream, lib.engine, dnnl_stream_default_flags),
          "stream_create");
      !s.ok()) {
    return s;
  }
  Owned<dnnl_stream_t> stream(raw_stream,
                              Destroy<dnnl_stream_t>{api.stream_destroy});
  std::vector<Owned<dnnl_memory_t>> memories;
  std::vector<Scratch> scratch;
  auto memory = [&](const dnnl_memory_desc_t& md,
                    void* data) -> absl::StatusOr<dnnl_memory_t> {
    dnnl_memory_t m = nullptr;
    if (absl::Status s = Check(api.memory_create(&m, &md, lib.engine, data),
                               "memory_create");
        !s.ok()) {
      return s;
    }
    memories.emplace_back(m, Destroy<dnnl_memory_t>{api.memory_destroy});
    return m;
  };
  auto buffer = [&](size_t bytes) -> absl::StatusOr<void*> {
    absl::StatusOr<Scratch> s = AllocateScratch(bytes);
    if (!s.ok()) return s.status();
    scratch.push_back(*std::move(s));
    return scratch.back().get();
  };
  // Runs `prim` with `args` and a scratchpad of `bytes`.
  auto execute = [&](const Owned<dnnl_primitive_t>& prim,
                     std::vector<dnnl_exec_arg_t> args, size_t bytes,
                     const char* what) -> absl::Status {
    if (bytes > 0) {
      absl::StatusOr<void*> pad = buffer(bytes);
      if (!pad.ok()) return pad.status();
      dnnl_memory_desc_t pad_md;
      const dnnl_dims_t pad_dims = {static_cast<int64_t>(bytes)};
      if (absl::Status s =
              Check(api.md_init_by_tag(&pad_md, 1, pad_dims, dnnl_u8, dnnl_a),
                    "memory_desc_init_by_tag");
          !s.ok()) {
        return s;
      }
      absl::StatusOr<dnnl_memory_t> m = memory(pad_md, *pad);
      if (!m.ok()) return m.status();
      args.push_back({DNNL_ARG_SCRATCHPAD, *m});
    }
    return Check(
        api.primitive_execute(prim.get(), stream.get(),
                              static_cast<int>(args.size()), args.data()),
        what);
  };

  void* data[3] = {const_cast<void*>(a), const_cast<void*>(b), c};
  std::vector<dnnl_exec_arg_t> conv_args;
  dnnl_memory_t written_inner = nullptr, written_user = nullptr;
  for (int i = 0; i < 3; ++i) {
    const ConvOperand& op = plan.operand[i];
    absl::StatusOr<dnnl_memory_t> user = memory(op.user, data[i]);
    if (!user.ok()) return user.status();
    if (op.reorder == nullptr) {
      conv_args.push_back({op.arg, *user});
      continue;
    }
    absl::StatusOr<void*> inner_data = buffer(op.inner_bytes);
    if (!inner_data.ok()) return inner_data.status();
    absl::StatusOr<dnnl_memory_t> inner = memory(op.inner, *inner_data);
    if (!inner.ok()) return inner.status();
    conv_args.push_back({op.arg, *inner});
    if (i == 2) {
      written_inner = *inner;
      written_user = *user;
    } else if (absl::Status s = execute(
                   op.reorder, {{DNNL_ARG_FROM, *user}, {DNNL_ARG_TO, *inner}},
                   op.reorder_scratch, "reorder (operand)");
               !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = execute(plan.conv, std::move(conv_args),
                               plan.scratch_bytes, "convolution");
      !s.ok()) {
    return s;
  }
  if (written_inner != nullptr) {
    if (absl::Status s = execute(
            plan.operand[2].reorder,
            {{DNNL_ARG_FROM, written_inner}, {DNNL_ARG_TO, written_user}},
            plan.operand[2].reorder_scratch, "reorder (result)");
        !s.ok()) {
      return s;
    }
  }
  return Check(api.stream_wait(stream.get()), "stream_wait");
}

#else  // !KILN_HAVE_ONEDNN

struct CpuConv::Plan {};

absl::StatusOr<std::unique_ptr<CpuConv>> CpuConv::Create() {
  return absl::FailedPreconditionError(
      "this build of Kiln has no oneDNN (built without libdnnl-dev's 2.x "
      "header): CPU convolutions are Kiln's kernels");
}

bool CpuConv::Available() { return false; }

std::string CpuConv::Describe() {
  return "no oneDNN in this build (libdnnl-dev 2.x was not installed)";
}

CpuConv::~CpuConv() = default;

absl::StatusOr<std::shared_ptr<const CpuConv::Plan>> CpuConv::GetPlan(
    int, const v1::Convolution&, const ConvDims&, bool) const {
  return absl::FailedPreconditionError("no oneDNN in this build");
}

absl::Status CpuConv::Run(int, const v1::Convolution&, const ConvDims&,
                          const void*, const void*, void*) const {
  return absl::FailedPreconditionError("no oneDNN in this build");
}

#endif  // KILN_HAVE_ONEDNN

}  // namespace kiln
