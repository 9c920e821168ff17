// The C API (kiln_c.h) over kiln::Client and the CPU and CUDA runtimes. Each
// handle is a struct that holds the C++ object (by value, unique_ptr or
// shared_ptr); the C ABI hands out raw pointers to them, so handles are
// created with std::make_unique and released to the caller, and taken back
// into a unique_ptr by the matching *_destroy.
#include "client/kiln_c.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/kiln_client.h"
#include "client/request_json.h"
#include "graph/op_signature.h"
#include "runtime/cpu_blas.h"
#include "runtime/cpu_executable.h"
#include "runtime/cuda_executable.h"
#include "runtime/device_allocator.h"
#include "support/sha256.h"

struct kiln_status {
  int code = 0;
  std::string message;
};

struct kiln_client {
  std::unique_ptr<kiln::Client> client;
};

struct kiln_allocator {
  std::shared_ptr<kiln::DeviceAllocator> allocator;
};

struct kiln_cuda_executable {
  std::shared_ptr<const kiln::CudaExecutable> exe;
};

struct kiln_cuda_tensor {
  explicit kiln_cuda_tensor(kiln::DeviceTensor t) : tensor(std::move(t)) {}
  kiln::DeviceTensor tensor;
};

struct kiln_cpu_executable {
  std::shared_ptr<const kiln::Executable> exe;
};

struct kiln_cpu_tensor {
  explicit kiln_cpu_tensor(kiln::HostTensor t) : tensor(std::move(t)) {}
  kiln::HostTensor tensor;
};

namespace kiln {
namespace {

// NULL for OK, else a new status the caller owns.
kiln_status* ToC(const absl::Status& status) {
  if (status.ok()) return nullptr;
  auto s = std::make_unique<kiln_status>();
  s->code = static_cast<int>(status.code());
  s->message = std::string(status.message());
  return s.release();
}

kiln_status* NullArgument(const char* function, const char* argument) {
  return ToC(absl::InvalidArgumentError(
      absl::StrCat(function, ": ", argument, " is NULL")));
}

// The CompileOptions of KILN_OPTION_* flags; INVALID_ARGUMENT naming any
// other bit.
absl::StatusOr<v1::CompileOptions> CompileOptionsFromFlags(int flags) {
  constexpr int kKnown =
      KILN_OPTION_FAST_MATH | KILN_OPTION_ALLOW_TF32 |
      KILN_OPTION_STRICT_FP16_REDUCTION | KILN_OPTION_STRICT_BF16_REDUCTION |
      KILN_OPTION_UNFUSED_GEMM_EPILOGUES | KILN_OPTION_ALLOW_TF32_CONVOLUTION |
      KILN_OPTION_DETERMINISTIC_CONVOLUTIONS |
      KILN_OPTION_DETERMINISTIC_ALGORITHMS | KILN_OPTION_CUDNN_BENCHMARK;
  if ((flags & ~kKnown) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options: unknown bits 0x", absl::Hex(flags & ~kKnown),
        " (KILN_OPTION_* flags, kiln_c.h)"));
  }
  v1::CompileOptions o;
  o.set_fast_math(flags & KILN_OPTION_FAST_MATH);
  o.set_allow_tf32(flags & KILN_OPTION_ALLOW_TF32);
  o.set_strict_fp16_reduction(flags & KILN_OPTION_STRICT_FP16_REDUCTION);
  o.set_strict_bf16_reduction(flags & KILN_OPTION_STRICT_BF16_REDUCTION);
  o.set_unfused_gemm_epilogues(flags & KILN_OPTION_UNFUSED_GEMM_EPILOGUES);
  o.set_allow_tf32_convolution(flags & KILN_OPTION_ALLOW_TF32_CONVOLUTION);
  o.set_deterministic_convolutions(flags &
                                   KILN_OPTION_DETERMINISTIC_CONVOLUTIONS);
  o.set_deterministic_algorithms(flags & KILN_OPTION_DETERMINISTIC_ALGORITHMS);
  o.set_cudnn_benchmark(flags & KILN_OPTION_CUDNN_BENCHMARK);
  return o;
}

bool ValidDType(int32_t dtype) {
  return dtype >= static_cast<int>(DType::kFloat32) &&
         dtype <= static_cast<int>(DType::kBool);
}

// Host views of C tensor views (the spans point into `inputs`); `what` is
// "input" or "output". Contiguous strides for NULL strides go into
// `contiguous` (one vector per view, kept alive by the caller).
absl::Status ToHostViews(const kiln_tensor_view* views, size_t n,
                         const char* what,
                         std::vector<std::vector<int64_t>>& contiguous,
                         std::vector<HostBufferView>& out) {
  out.resize(n);
  contiguous.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const kiln_tensor_view& in = views[i];
    if (!ValidDType(in.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", i, ": dtype ", in.dtype, " is not a KILN_*"));
    }
    if (in.rank < 0 || (in.rank > 0 && !in.sizes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", i, ": rank ", in.rank, in.sizes ? "" : " with no sizes"));
    }
    out[i].data = reinterpret_cast<void*>(static_cast<uintptr_t>(in.data));
    out[i].dtype = static_cast<DType>(in.dtype);
    out[i].sizes = absl::MakeConstSpan(in.sizes, in.rank);
    if (in.strides || in.rank == 0) {
      out[i].strides = absl::MakeConstSpan(in.strides, in.rank);
    } else {
      std::vector<int64_t>& strides = contiguous[i];
      strides.assign(in.rank, 1);
      for (int d = in.rank - 1; d > 0; --d)
        strides[d - 1] = strides[d] * std::max<int64_t>(in.sizes[d], 1);
      out[i].strides = strides;
    }
  }
  return absl::OkStatus();
}

// As ToHostViews, for device memory.
absl::Status ToDeviceViews(const kiln_tensor_view* views, size_t n,
                           const char* what,
                           std::vector<std::vector<int64_t>>& contiguous,
                           std::vector<DeviceTensorView>& out) {
  std::vector<HostBufferView> host;
  if (absl::Status s = ToHostViews(views, n, what, contiguous, host); !s.ok())
    return s;
  out.resize(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = DeviceTensorView{views[i].data, host[i].dtype, host[i].sizes,
                              host[i].strides};
  return absl::OkStatus();
}

// DLPack's unversioned ABI (dlpack.h v0.8), declared here so that no header
// is needed: the structs a "dltensor" capsule holds.
struct DLDevice {
  int32_t device_type;  // kDLCUDA = 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

DLDataType ToDlpack(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return {2, 32, 1};
    case DType::kFloat16:
      return {2, 16, 1};
    case DType::kBFloat16:
      return {4, 16, 1};
    case DType::kInt32:
      return {0, 32, 1};
    case DType::kInt64:
      return {0, 64, 1};
    case DType::kBool:
      return {6, 8, 1};
  }
  return {0, 0, 0};
}

// What a DLManagedTensor from kiln_cuda_tensor_to_dlpack owns; its
// manager_ctx, deleted by its deleter.
struct DlpackOwner {
  DLManagedTensor managed{};
  std::unique_ptr<kiln_cuda_tensor> tensor;
  std::vector<int64_t> shape, strides;
};

void DeleteDlpack(DLManagedTensor* self) {
  std::unique_ptr<DlpackOwner> owner(
      static_cast<DlpackOwner*>(self->manager_ctx));
}

// DeviceAllocator over two C callbacks (kiln_allocator_create).
class CallbackDeviceAllocator final : public DeviceAllocator {
 public:
  CallbackDeviceAllocator(kiln_alloc_fn alloc, kiln_free_fn free,
                          void* user_data)
      : alloc_(alloc), free_(free), user_data_(user_data) {}

  absl::StatusOr<cuda::DevicePtr> Allocate(size_t bytes,
                                           cuda::Stream stream) override {
    if (bytes == 0) return cuda::DevicePtr{0};
    const uint64_t ptr = alloc_(bytes, stream, user_data_);
    if (ptr == 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the allocator callback gave no memory for ", bytes, " bytes"));
    }
    if (ptr % 256 != 0) {
      // The runtime relies on it (vector stores); give it back at once.
      free_(ptr, bytes, stream, user_data_);
      return absl::InternalError(
          absl::StrCat("the allocator callback returned 0x", absl::Hex(ptr),
                       ", not 256-byte aligned"));
    }
    return cuda::DevicePtr{ptr};
  }

  void Free(cuda::DevicePtr ptr, size_t bytes,
            cuda::Stream last_use_stream) override {
    if (ptr == 0) return;
    free_(ptr, bytes, last_use_stream, user_data_);
  }

 private:
  const kiln_alloc_fn alloc_;
  const kiln_free_fn free_;
  void* const user_data_;
};

}  // namespace
}  // namespace kiln

extern "C" {

int kiln_c_api_version(void) { return KILN_C_API_VERSION; }

int kiln_status_code(const kiln_status* status) {
  return status ? status->code : KILN_OK;
}

const char* kiln_status_message(const kiln_status* status) {
  return status ? status->message.c_str() : "";
}

void kiln_status_free(kiln_status* status) {
  std::unique_ptr<kiln_status> owned(status);
}

kiln_status* kiln_client_create(const char* server, double rpc_deadline_seconds,
                                int max_retries, kiln_client** out) {
  if (!out) return kiln::NullArgument("kiln_client_create", "out");
  return kiln_client_create_with_auth(server, rpc_deadline_seconds,
                                      max_retries, nullptr, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, out);
}

kiln_status* kiln_client_create_with_auth(
    const char* server, double rpc_deadline_seconds, int max_retries,
    const char* token, const char* token_file, const char* tls_ca,
    const char* tls_cert, const char* tls_key, const char* tls_server_name,
    kiln_client** out) {
  if (!out) return kiln::NullArgument("kiln_client_create_with_auth", "out");
  return kiln_client_create_with_trust(
      server, rpc_deadline_seconds, max_retries, token, token_file, tls_ca,
      tls_cert, tls_key, tls_server_name, nullptr, out);
}

kiln_status* kiln_client_create_with_trust(
    const char* server, double rpc_deadline_seconds, int max_retries,
    const char* token, const char* token_file, const char* tls_ca,
    const char* tls_cert, const char* tls_key, const char* tls_server_name,
    const char* trusted_keys, kiln_client** out) {
  if (!out) return kiln::NullArgument("kiln_client_create_with_trust", "out");
  *out = nullptr;
  kiln::ClientOptions options;
  auto set = [](std::string* field, const char* value) {
    if (value) *field = value;
  };
  set(&options.connection.token, token);
  set(&options.connection.token_file, token_file);
  set(&options.connection.tls_ca, tls_ca);
  set(&options.connection.tls_cert, tls_cert);
  set(&options.connection.tls_key, tls_key);
  set(&options.connection.tls_server_name, tls_server_name);
  set(&options.trusted_keys, trusted_keys);
  if (server) options.server = server;
  if (rpc_deadline_seconds > 0) {
    options.rpc_deadline = absl::Seconds(rpc_deadline_seconds);
  }
  if (max_retries >= 0) options.max_retries = max_retries;
  absl::StatusOr<std::unique_ptr<kiln::Client>> client =
      kiln::Client::Connect(options);
  if (!client.ok()) return kiln::ToC(client.status());
  auto handle = std::make_unique<kiln_client>();
  handle->client = *std::move(client);
  *out = handle.release();
  return nullptr;
}

void kiln_client_destroy(kiln_client* client) {
  std::unique_ptr<kiln_client> owned(client);
}

void kiln_client_counters(const kiln_client* client, uint64_t* local_hits,
                          uint64_t* lookup_hits, uint64_t* compiles) {
  kiln::Client::Counters c;
  if (client) c = client->client->counters();
  if (local_hits) *local_hits = c.local_hits;
  if (lookup_hits) *lookup_hits = c.lookup_hits;
  if (compiles) *compiles = c.compiles;
}

kiln_status* kiln_allocator_create(kiln_alloc_fn alloc, kiln_free_fn free,
                                   void* user_data, kiln_allocator** out) {
  if (!out) return kiln::NullArgument("kiln_allocator_create", "out");
  *out = nullptr;
  if (!alloc) return kiln::NullArgument("kiln_allocator_create", "alloc");
  if (!free) return kiln::NullArgument("kiln_allocator_create", "free");
  auto handle = std::make_unique<kiln_allocator>();
  handle->allocator =
      std::make_shared<kiln::CallbackDeviceAllocator>(alloc, free, user_data);
  *out = handle.release();
  return nullptr;
}

kiln_status* kiln_allocator_create_caching(int device_ordinal,
                                           kiln_allocator** out) {
  if (!out) return kiln::NullArgument("kiln_allocator_create_caching", "out");
  *out = nullptr;
  auto allocator = kiln::CachingDeviceAllocator::Create(device_ordinal);
  if (!allocator.ok()) return kiln::ToC(allocator.status());
  auto handle = std::make_unique<kiln_allocator>();
  handle->allocator = *std::move(allocator);
  *out = handle.release();
  return nullptr;
}

void kiln_allocator_destroy(kiln_allocator* allocator) {
  std::unique_ptr<kiln_allocator> owned(allocator);
}

kiln_status* kiln_client_get_cuda_executable(
    kiln_client* client, const char* graph_json, size_t graph_json_len,
    const char* target, int options, int device_ordinal,
    kiln_allocator* allocator, kiln_cuda_executable** out) {
  constexpr char kFn[] = "kiln_client_get_cuda_executable";
  if (!out) return kiln::NullArgument(kFn, "out");
  *out = nullptr;
  if (!client) return kiln::NullArgument(kFn, "client");
  if (!graph_json) return kiln::NullArgument(kFn, "graph_json");
  if (!target) return kiln::NullArgument(kFn, "target");
  absl::StatusOr<kiln::v1::Target> parsed_target = kiln::TargetFromName(target);
  if (!parsed_target.ok()) return kiln::ToC(parsed_target.status());
  if (!parsed_target->has_cuda()) {
    return kiln::ToC(absl::InvalidArgumentError(absl::StrCat(
        "target '", target, "' is not a CUDA target (sm_XX, e.g. sm_90)")));
  }
  absl::StatusOr<kiln::v1::CompileOptions> compile_options =
      kiln::CompileOptionsFromFlags(options);
  if (!compile_options.ok()) return kiln::ToC(compile_options.status());
  absl::StatusOr<kiln::v1::CompileRequest> request =
      kiln::RequestFromGraphJson(absl::string_view(graph_json, graph_json_len),
                                 *parsed_target, *compile_options);
  if (!request.ok()) return kiln::ToC(request.status());
  kiln::CudaLoadOptions load_options;
  load_options.device_ordinal = device_ordinal;
  if (allocator) load_options.allocator = allocator->allocator;
  absl::StatusOr<std::shared_ptr<const kiln::CudaExecutable>> exe =
      client->client->GetCudaExecutable(*request, load_options);
  if (!exe.ok()) return kiln::ToC(exe.status());
  auto handle = std::make_unique<kiln_cuda_executable>();
  handle->exe = *std::move(exe);
  *out = handle.release();
  return nullptr;
}

void kiln_cuda_executable_destroy(kiln_cuda_executable* exe) {
  std::unique_ptr<kiln_cuda_executable> owned(exe);
}

size_t kiln_cuda_executable_num_inputs(const kiln_cuda_executable* exe) {
  return exe ? exe->exe->artifact().inputs_size() : 0;
}

size_t kiln_cuda_executable_num_outputs(const kiln_cuda_executable* exe) {
  return exe ? exe->exe->artifact().outputs_size() : 0;
}

int kiln_cuda_executable_output_dtype(const kiln_cuda_executable* exe,
                                      size_t index) {
  if (!exe || index >= kiln_cuda_executable_num_outputs(exe)) return -1;
  return exe->exe->artifact().outputs(static_cast<int>(index)).dtype();
}

int kiln_cuda_executable_output_rank(const kiln_cuda_executable* exe,
                                     size_t index) {
  if (!exe || index >= kiln_cuda_executable_num_outputs(exe)) return -1;
  return exe->exe->artifact().outputs(static_cast<int>(index)).sizes_size();
}

namespace {
int InputWrite(const kiln::v1::Artifact& artifact, size_t index, int* output,
               int* input) {
  if (!output || !input ||
      index >= static_cast<size_t>(artifact.input_writes_size()))
    return -1;
  const kiln::v1::InputWrite& w =
      artifact.input_writes(static_cast<int>(index));
  *output = w.output();
  *input = w.input();
  return 0;
}
}  // namespace

size_t kiln_cuda_executable_num_input_writes(const kiln_cuda_executable* exe) {
  return exe ? exe->exe->artifact().input_writes_size() : 0;
}

int kiln_cuda_executable_input_write(const kiln_cuda_executable* exe,
                                     size_t index, int* output, int* input) {
  return exe ? InputWrite(exe->exe->artifact(), index, output, input) : -1;
}

void kiln_cuda_executable_guard_key(const kiln_cuda_executable* exe,
                                    char hex[65]) {
  if (!hex) return;
  hex[0] = '\0';
  if (!exe) return;
  const std::string& key = exe->exe->artifact().guard_key();
  kiln::Sha256Digest digest{};
  if (key.size() != digest.size()) return;
  std::memcpy(digest.data(), key.data(), digest.size());
  const std::string text = kiln::DigestToHex(digest);
  std::memcpy(hex, text.c_str(), std::min<size_t>(text.size(), 64) + 1);
  hex[64] = '\0';
}

int kiln_cuda_executable_device_ordinal(const kiln_cuda_executable* exe) {
  return exe ? exe->exe->device_ordinal() : -1;
}

kiln_status* kiln_cuda_executable_run(const kiln_cuda_executable* exe,
                                      const kiln_tensor_view* inputs,
                                      size_t num_inputs, void* stream,
                                      kiln_cuda_tensor** outputs,
                                      size_t num_outputs) {
  constexpr char kFn[] = "kiln_cuda_executable_run";
  if (!exe) return kiln::NullArgument(kFn, "exe");
  if (num_inputs > 0 && !inputs) return kiln::NullArgument(kFn, "inputs");
  if (num_outputs > 0 && !outputs) return kiln::NullArgument(kFn, "outputs");
  const size_t expected_outputs = kiln_cuda_executable_num_outputs(exe);
  if (num_outputs != expected_outputs) {
    return kiln::ToC(absl::InvalidArgumentError(
        absl::StrCat(kFn, ": room for ", num_outputs,
                     " outputs, the graph has ", expected_outputs)));
  }
  std::vector<std::vector<int64_t>> contiguous;
  std::vector<kiln::DeviceTensorView> views;
  if (absl::Status s =
          kiln::ToDeviceViews(inputs, num_inputs, "input", contiguous, views);
      !s.ok()) {
    return kiln::ToC(s);
  }
  absl::StatusOr<std::vector<kiln::DeviceTensor>> result =
      exe->exe->Run(views, static_cast<kiln::cuda::Stream>(stream));
  if (!result.ok()) return kiln::ToC(result.status());
  if (result->size() != num_outputs) {
    return kiln::ToC(
        absl::InternalError(absl::StrCat(kFn, ": the run gave ", result->size(),
                                         " outputs, expected ", num_outputs)));
  }
  for (size_t o = 0; o < num_outputs; ++o) {
    outputs[o] =
        std::make_unique<kiln_cuda_tensor>(std::move((*result)[o])).release();
  }
  return nullptr;
}

kiln_status* kiln_cuda_executable_run_into(const kiln_cuda_executable* exe,
                                           const kiln_tensor_view* inputs,
                                           size_t num_inputs, void* stream,
                                           const kiln_tensor_view* outputs,
                                           size_t num_outputs) {
  constexpr char kFn[] = "kiln_cuda_executable_run_into";
  if (!exe) return kiln::NullArgument(kFn, "exe");
  if (num_inputs > 0 && !inputs) return kiln::NullArgument(kFn, "inputs");
  if (num_outputs > 0 && !outputs) return kiln::NullArgument(kFn, "outputs");
  std::vector<std::vector<int64_t>> in_contiguous, out_contiguous;
  std::vector<kiln::DeviceTensorView> in_views, out_views;
  if (absl::Status s = kiln::ToDeviceViews(inputs, num_inputs, "input",
                                           in_contiguous, in_views);
      !s.ok()) {
    return kiln::ToC(s);
  }
  if (absl::Status s = kiln::ToDeviceViews(outputs, num_outputs, "output",
                                           out_contiguous, out_views);
      !s.ok()) {
    return kiln::ToC(s);
  }
  return kiln::ToC(exe->exe->RunInto(in_views, out_views,
                                     static_cast<kiln::cuda::Stream>(stream)));
}

kiln_status* kiln_cuda_executable_check_index_errors(
    const kiln_cuda_executable* exe, void* stream, int wait) {
  if (!exe) {
    return kiln::NullArgument("kiln_cuda_executable_check_index_errors", "exe");
  }
  return kiln::ToC(exe->exe->CheckIndexErrors(
      static_cast<kiln::cuda::Stream>(stream), wait != 0));
}

uint64_t kiln_cuda_tensor_data(const kiln_cuda_tensor* tensor) {
  return tensor ? tensor->tensor.data() : 0;
}

int kiln_cuda_tensor_dtype(const kiln_cuda_tensor* tensor) {
  return tensor ? static_cast<int>(tensor->tensor.dtype()) : -1;
}

int kiln_cuda_tensor_rank(const kiln_cuda_tensor* tensor) {
  return tensor ? static_cast<int>(tensor->tensor.sizes().size()) : -1;
}

const int64_t* kiln_cuda_tensor_sizes(const kiln_cuda_tensor* tensor) {
  return tensor ? tensor->tensor.sizes().data() : nullptr;
}

const int64_t* kiln_cuda_tensor_strides(const kiln_cuda_tensor* tensor) {
  return tensor ? tensor->tensor.strides().data() : nullptr;
}

size_t kiln_cuda_tensor_nbytes(const kiln_cuda_tensor* tensor) {
  return tensor ? tensor->tensor.nbytes() : 0;
}

void kiln_cuda_tensor_set_last_use_stream(kiln_cuda_tensor* tensor,
                                          void* stream) {
  if (tensor) {
    tensor->tensor.storage().set_last_use_stream(
        static_cast<kiln::cuda::Stream>(stream));
  }
}

void kiln_cuda_tensor_destroy(kiln_cuda_tensor* tensor) {
  std::unique_ptr<kiln_cuda_tensor> owned(tensor);
}

void* kiln_cuda_tensor_to_dlpack(kiln_cuda_tensor* tensor, int device_ordinal) {
  if (!tensor) return nullptr;
  auto owner = std::make_unique<kiln::DlpackOwner>();
  owner->tensor.reset(tensor);
  const kiln::DeviceTensor& t = owner->tensor->tensor;
  owner->shape.assign(t.sizes().begin(), t.sizes().end());
  owner->strides.assign(t.strides().begin(), t.strides().end());
  kiln::DLTensor& dl = owner->managed.dl_tensor;
  dl.data = reinterpret_cast<void*>(static_cast<uintptr_t>(t.data()));
  dl.device = {/*kDLCUDA=*/2, device_ordinal};
  dl.ndim = static_cast<int32_t>(owner->shape.size());
  dl.dtype = kiln::ToDlpack(t.dtype());
  dl.shape = owner->shape.data();
  dl.strides = owner->strides.data();
  dl.byte_offset = 0;
  owner->managed.deleter = kiln::DeleteDlpack;
  owner->managed.manager_ctx = owner.get();
  return &owner.release()->managed;
}

void kiln_dlpack_delete(void* managed_tensor) {
  if (!managed_tensor) return;
  auto* managed = static_cast<kiln::DLManagedTensor*>(managed_tensor);
  if (managed->deleter) managed->deleter(managed);
}

kiln_status* kiln_client_get_cpu_executable(kiln_client* client,
                                            const char* graph_json,
                                            size_t graph_json_len,
                                            const char* target, int options,
                                            kiln_cpu_executable** out) {
  constexpr char kFn[] = "kiln_client_get_cpu_executable";
  if (!out) return kiln::NullArgument(kFn, "out");
  *out = nullptr;
  if (!client) return kiln::NullArgument(kFn, "client");
  if (!graph_json) return kiln::NullArgument(kFn, "graph_json");
  absl::StatusOr<kiln::v1::Target> parsed_target =
      kiln::TargetFromName(target ? target : "cpu");
  if (!parsed_target.ok()) return kiln::ToC(parsed_target.status());
  if (!parsed_target->has_cpu()) {
    return kiln::ToC(absl::InvalidArgumentError(absl::StrCat(
        "target '", target, "' is not a CPU target (use \"cpu\")")));
  }
  absl::StatusOr<kiln::v1::CompileOptions> compile_options =
      kiln::CompileOptionsFromFlags(options);
  if (!compile_options.ok()) return kiln::ToC(compile_options.status());
  absl::StatusOr<kiln::v1::CompileRequest> request =
      kiln::RequestFromGraphJson(absl::string_view(graph_json, graph_json_len),
                                 *parsed_target, *compile_options);
  if (!request.ok()) return kiln::ToC(request.status());
  absl::StatusOr<std::shared_ptr<const kiln::Executable>> exe =
      client->client->GetExecutable(*request);
  if (!exe.ok()) return kiln::ToC(exe.status());
  auto handle = std::make_unique<kiln_cpu_executable>();
  handle->exe = *std::move(exe);
  *out = handle.release();
  return nullptr;
}

void kiln_cpu_executable_destroy(kiln_cpu_executable* exe) {
  std::unique_ptr<kiln_cpu_executable> owned(exe);
}

kiln_status* kiln_cpu_runtime_prepare(void) {
  absl::Status status = kiln::CpuBlas::Prepare();
  if (!status.ok()) return kiln::ToC(status);
  return nullptr;
}

size_t kiln_cpu_executable_num_inputs(const kiln_cpu_executable* exe) {
  return exe ? exe->exe->cpu_executable().artifact().inputs_size() : 0;
}

size_t kiln_cpu_executable_num_outputs(const kiln_cpu_executable* exe) {
  return exe ? exe->exe->cpu_executable().artifact().outputs_size() : 0;
}

size_t kiln_cpu_executable_num_input_writes(const kiln_cpu_executable* exe) {
  return exe ? exe->exe->cpu_executable().artifact().input_writes_size() : 0;
}

int kiln_cpu_executable_input_write(const kiln_cpu_executable* exe,
                                    size_t index, int* output, int* input) {
  return exe ? InputWrite(exe->exe->cpu_executable().artifact(), index, output,
                          input)
             : -1;
}

int kiln_cpu_executable_output_dtype(const kiln_cpu_executable* exe,
                                     size_t index) {
  if (!exe || index >= kiln_cpu_executable_num_outputs(exe)) return -1;
  return exe->exe->cpu_executable()
      .artifact()
      .outputs(static_cast<int>(index))
      .dtype();
}

int kiln_cpu_executable_output_rank(const kiln_cpu_executable* exe,
                                    size_t index) {
  if (!exe || index >= kiln_cpu_executable_num_outputs(exe)) return -1;
  return exe->exe->cpu_executable()
      .artifact()
      .outputs(static_cast<int>(index))
      .sizes_size();
}

void kiln_cpu_executable_guard_key(const kiln_cpu_executable* exe,
                                   char hex[65]) {
  if (!hex) return;
  hex[0] = '\0';
  if (!exe) return;
  const std::string& key = exe->exe->guard_key();
  kiln::Sha256Digest digest{};
  if (key.size() != digest.size()) return;
  std::memcpy(digest.data(), key.data(), digest.size());
  const std::string text = kiln::DigestToHex(digest);
  std::memcpy(hex, text.c_str(), std::min<size_t>(text.size(), 64) + 1);
  hex[64] = '\0';
}

kiln_status* kiln_cpu_executable_output_sizes(const kiln_cpu_executable* exe,
                                              const kiln_tensor_view* inputs,
                                              size_t num_inputs, int64_t* sizes,
                                              size_t num_sizes) {
  constexpr char kFn[] = "kiln_cpu_executable_output_sizes";
  if (!exe) return kiln::NullArgument(kFn, "exe");
  if (num_inputs > 0 && !inputs) return kiln::NullArgument(kFn, "inputs");
  if (num_sizes > 0 && !sizes) return kiln::NullArgument(kFn, "sizes");
  std::vector<std::vector<int64_t>> contiguous;
  std::vector<kiln::HostBufferView> views;
  if (absl::Status s =
          kiln::ToHostViews(inputs, num_inputs, "input", contiguous, views);
      !s.ok()) {
    return kiln::ToC(s);
  }
  auto all = exe->exe->cpu_executable().OutputSizes(views);
  if (!all.ok()) return kiln::ToC(all.status());
  size_t total = 0;
  for (const auto& v : *all) total += v.size();
  if (total != num_sizes) {
    return kiln::ToC(absl::InvalidArgumentError(absl::StrCat(
        kFn, ": room for ", num_sizes, " sizes, the outputs have ", total)));
  }
  for (const auto& v : *all) sizes = std::copy(v.begin(), v.end(), sizes);
  return nullptr;
}

kiln_status* kiln_cpu_executable_run(const kiln_cpu_executable* exe,
                                     const kiln_tensor_view* inputs,
                                     size_t num_inputs,
                                     const kiln_tensor_view* outputs,
                                     size_t num_outputs) {
  constexpr char kFn[] = "kiln_cpu_executable_run";
  if (!exe) return kiln::NullArgument(kFn, "exe");
  if (num_inputs > 0 && !inputs) return kiln::NullArgument(kFn, "inputs");
  if (num_outputs > 0 && !outputs) return kiln::NullArgument(kFn, "outputs");
  std::vector<std::vector<int64_t>> in_contiguous, out_contiguous;
  std::vector<kiln::HostBufferView> in_views, out_views;
  if (absl::Status s = kiln::ToHostViews(inputs, num_inputs, "input",
                                         in_contiguous, in_views);
      !s.ok()) {
    return kiln::ToC(s);
  }
  if (absl::Status s = kiln::ToHostViews(outputs, num_outputs, "output",
                                         out_contiguous, out_views);
      !s.ok()) {
    return kiln::ToC(s);
  }
  return kiln::ToC(exe->exe->cpu_executable().RunInto(in_views, out_views,
                                                      exe->exe->thread_pool()));
}

kiln_status* kiln_cpu_executable_run_alloc(const kiln_cpu_executable* exe,
                                           const kiln_tensor_view* inputs,
                                           size_t num_inputs,
                                           kiln_cpu_tensor** outputs,
                                           size_t num_outputs) {
  constexpr char kFn[] = "kiln_cpu_executable_run_alloc";
  if (!exe) return kiln::NullArgument(kFn, "exe");
  if (num_inputs > 0 && !inputs) return kiln::NullArgument(kFn, "inputs");
  if (num_outputs > 0 && !outputs) return kiln::NullArgument(kFn, "outputs");
  std::vector<std::vector<int64_t>> contiguous;
  std::vector<kiln::HostBufferView> in_views;
  if (absl::Status s =
          kiln::ToHostViews(inputs, num_inputs, "input", contiguous, in_views);
      !s.ok()) {
    return kiln::ToC(s);
  }
  const kiln::CpuExecutable& cpu = exe->exe->cpu_executable();
  auto sizes = cpu.OutputSizes(in_views);
  if (!sizes.ok()) return kiln::ToC(sizes.status());
  if (sizes->size() != num_outputs) {
    return kiln::ToC(absl::InvalidArgumentError(
        absl::StrCat(kFn, ": room for ", num_outputs,
                     " outputs, the graph has ", sizes->size())));
  }
  std::vector<kiln::HostTensor> tensors;
  std::vector<kiln::HostBufferView> out_views(num_outputs);
  tensors.reserve(num_outputs);
  for (size_t o = 0; o < num_outputs; ++o) {
    const auto dtype = static_cast<kiln::DType>(
        cpu.artifact().outputs(static_cast<int>(o)).dtype());
    tensors.push_back(kiln::HostTensor::Uninitialized(dtype, (*sizes)[o]));
    out_views[o] = {tensors.back().data(), dtype, tensors.back().sizes(),
                    tensors.back().strides()};
  }
  if (absl::Status s =
          cpu.RunInto(in_views, out_views, exe->exe->thread_pool());
      !s.ok()) {
    return kiln::ToC(s);
  }
  for (size_t o = 0; o < num_outputs; ++o) {
    outputs[o] =
        std::make_unique<kiln_cpu_tensor>(std::move(tensors[o])).release();
  }
  return nullptr;
}

void* kiln_cpu_tensor_data(kiln_cpu_tensor* tensor) {
  return tensor ? tensor->tensor.data() : nullptr;
}

int kiln_cpu_tensor_dtype(const kiln_cpu_tensor* tensor) {
  return tensor ? static_cast<int>(tensor->tensor.dtype()) : -1;
}

int kiln_cpu_tensor_rank(const kiln_cpu_tensor* tensor) {
  return tensor ? tensor->tensor.rank() : -1;
}

const int64_t* kiln_cpu_tensor_sizes(const kiln_cpu_tensor* tensor) {
  return tensor ? tensor->tensor.sizes().data() : nullptr;
}

const int64_t* kiln_cpu_tensor_strides(const kiln_cpu_tensor* tensor) {
  return tensor ? tensor->tensor.strides().data() : nullptr;
}

size_t kiln_cpu_tensor_nbytes(const kiln_cpu_tensor* tensor) {
  return tensor ? static_cast<size_t>(tensor->tensor.numel()) *
                      kiln::DTypeSize(tensor->tensor.dtype())
                : 0;
}

void kiln_cpu_tensor_destroy(kiln_cpu_tensor* tensor) {
  std::unique_ptr<kiln_cpu_tensor> owned(tensor);
}

const char* kiln_supported_ops(void) {
  static const std::string* const ops =
      new std::string(absl::StrJoin(kiln::OpSignatures::Get().Names(), "\n"));
  return ops->c_str();
}

}  // extern "C"
