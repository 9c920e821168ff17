#include "runtime/cuda_executable.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "runtime/guards.h"
#include "runtime/per_context.h"
#include "support/sha256.h"

namespace kiln {
namespace {

// The format this runtime understands (compiler/compile.h's
// kArtifactFormatVersion; the client does not link the compiler back end).
constexpr int kSupportedFormatVersion = 1;

// cuLaunchKernel's limits: 1024 threads per block on every GPU Kiln
// targets, and 4 KB of kernel parameters (8 bytes each here).
constexpr int kMaxBlockThreads = 1024;
constexpr int kMaxKernelParams = 4096 / 8;

struct Arch {
  int major = 0;
  int minor = 0;
  bool arch_specific = false;  // "sm_90a": runs on exactly that GPU
};

// Parses "sm_90", "sm_90a", "sm_100f".
bool ParseArch(absl::string_view name, Arch* arch) {
  if (!absl::ConsumePrefix(&name, "sm_")) return false;
  if (!name.empty() && (name.back() == 'a' || name.back() == 'f')) {
    arch->arch_specific = name.back() == 'a';
    name.remove_suffix(1);
  }
  int number = 0;
  if (name.size() < 2 || !absl::SimpleAtoi(name, &number)) return false;
  arch->major = number / 10;
  arch->minor = number % 10;
  return true;
}

bool IsElf(absl::string_view image) {
  return image.size() >= 4 && image.substr(0, 4) ==
                                  "\x7f"
                                  "ELF";
}

}  // namespace

DeviceTensor::DeviceTensor(DeviceAllocation storage, DType dtype,
                           absl::Span<const int64_t> sizes)
    : storage_(std::move(storage)),
      dtype_(dtype),
      sizes_(sizes.begin(), sizes.end()),
      strides_(sizes.size()) {
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides_[d] = stride;
    stride *= sizes[d];
  }
  numel_ = stride;
}

CudaExecutable::~CudaExecutable() {
  if (error_word_ == 0 && error_mirror_ == nullptr) return;
  absl::StatusOr<cuda::ScopedContext> scope =
      cuda::ScopedContext::Enter(*driver_, context_->get());
  if (!scope.ok()) return;  // the context is gone, and its memory with it
  if (error_word_ != 0) driver_->api().cuMemFree_v2(error_word_);
  if (error_mirror_ != nullptr) driver_->api().cuMemFreeHost(error_mirror_);
}

namespace {
constexpr size_t kErrorWordBytes = 3 * sizeof(int64_t);
}  // namespace

absl::Status CudaExecutable::TakeIndexError(cuda::Stream stream) const {
  if (error_mirror_ == nullptr) return absl::OkStatus();
  absl::Status error = kiln::TakeIndexError(artifact_.program(), error_mirror_);
  if (error.ok()) return error;
  if (absl::Status s =
          driver_->Check(driver_->api().cuMemsetD8Async(
                             error_word_, 0, kErrorWordBytes, stream),
                         "cuMemsetD8Async");
      !s.ok()) {
    return s;
  }
  return error;
}

absl::Status CudaExecutable::CheckIndexErrors(cuda::Stream stream,
                                              bool synchronize) const {
  if (error_mirror_ == nullptr) return absl::OkStatus();
  absl::StatusOr<cuda::ScopedContext> scope =
      cuda::ScopedContext::Enter(*driver_, context_->get());
  if (!scope.ok()) return scope.status();
  if (synchronize) {
    if (absl::Status s = driver_->Check(
            driver_->api().cuStreamSynchronize(stream), "cuStreamSynchronize");
        !s.ok()) {
      return s;
    }
  }
  return TakeIndexError(stream);
}

absl::StatusOr<std::unique_ptr<CudaExecutable>> CudaExecutable::Load(
    const v1::Artifact& artifact, const CudaLoadOptions& options) {
  if (artifact.format_version() != kSupportedFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("artifact format version ", artifact.format_version(),
                     " is not supported (this runtime reads ",
                     kSupportedFormatVersion, ")"));
  }
  if (!artifact.target().has_cuda()) {
    return absl::FailedPreconditionError(
        "the artifact's target is not a CUDA target");
  }
  if (!artifact.has_cuda()) {
    return absl::FailedPreconditionError("the artifact holds no CUDA binary");
  }
  std::unique_ptr<CudaExecutable> exe(new CudaExecutable());
  // The bytes hashed are the bytes loaded: this copy, which nobody else
  // can reach.
  exe->artifact_ = artifact;
  const std::string& cubin = exe->artifact_.cuda().cubin();
  Sha256Digest expected{};
  if (artifact.binary_sha256().size() != expected.size()) {
    return absl::DataLossError("the artifact's binary_sha256 is not 32 bytes");
  }
  std::memcpy(expected.data(), artifact.binary_sha256().data(),
              expected.size());
  const Sha256Digest actual = Sha256(cubin);
  if (actual != expected) {
    return absl::DataLossError(
        absl::StrCat("CUDA binary SHA-256 mismatch: expected ",
                     DigestToHex(expected), ", got ", DigestToHex(actual), " (",
                     cubin.size(), " bytes); not loaded"));
  }
  LaunchLimits limits;
  limits.max_block_threads = kMaxBlockThreads;
  limits.max_kernel_params = kMaxKernelParams;
  limits.extern_library = v1::ExternCall::CUBLASLT;
  limits.gemm_epilogues = true;
  limits.gemm_dtypes = {{DType::kFloat32, DType::kFloat32},
                        {DType::kFloat16, DType::kFloat32},
                        {DType::kBFloat16, DType::kFloat32}};
  limits.conv_library = v1::ExternCall::CUDNN;
  limits.attention_library = v1::ExternCall::CUDNN;
  limits.attention_dtypes = {DType::kFloat16, DType::kBFloat16};
  limits.attention_bias_grad = true;
  limits.conv_dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  // Each allocation is a call into the caller's allocator (PyTorch's:
  // a few microseconds through Python); statistics, partial sums and
  // other small temps take one for all.
  limits.arena_temp_bytes = 1 << 20;
  absl::StatusOr<ProgramPlan> plan = PlanProgram(exe->artifact_, limits);
  if (!plan.ok()) return plan.status();
  exe->plan_ = *std::move(plan);
  if (absl::Status s = exe->LoadModule(options); !s.ok()) return s;
  return exe;
}

absl::Status CudaExecutable::LoadModule(const CudaLoadOptions& options) {
  absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
  if (!driver.ok()) return driver.status();
  driver_ = *driver;
  const cuda::DriverApi& api = driver_->api();
  device_ordinal_ = options.device_ordinal;
  absl::StatusOr<cuda::PrimaryContext> context =
      cuda::PrimaryContext::Retain(*driver_, device_ordinal_);
  if (!context.ok()) return context.status();
  context_.emplace(*std::move(context));

  int major = 0, minor = 0, grid_x = 0;
  const cuda::Device device = context_->device();
  if (absl::Status s = driver_->Check(
          api.cuDeviceGetAttribute(
              &major, cuda::kDeviceAttributeComputeCapabilityMajor, device),
          "cuDeviceGetAttribute");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = driver_->Check(
          api.cuDeviceGetAttribute(
              &minor, cuda::kDeviceAttributeComputeCapabilityMinor, device),
          "cuDeviceGetAttribute");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = driver_->Check(
          api.cuDeviceGetAttribute(&grid_x, cuda::kDeviceAttributeMaxGridDimX,
                                   device),
          "cuDeviceGetAttribute");
      !s.ok()) {
    return s;
  }
  max_grid_x_ = grid_x;

  // A cubin runs on its own major version at an equal or newer minor (an
  // "a" cubin only on its exact GPU); PTX is compiled by the driver for
  // whatever device it finds, so its arch is not checked here.
  const std::string& arch_name = artifact_.cuda().arch();
  const std::string& image = artifact_.cuda().cubin();
  if (IsElf(image)) {
    Arch arch;
    if (!ParseArch(arch_name, &arch)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the artifact's CUDA arch '", arch_name,
                       "' is not of the form sm_XY"));
    }
    const bool runs =
        arch.major == major &&
        (arch.arch_specific ? arch.minor == minor : arch.minor <= minor);
    if (!runs) {
      return absl::FailedPreconditionError(
          absl::StrCat("the artifact is built for ", arch_name, ", device ",
                       device_ordinal_, " is sm_", major, minor));
    }
  }

  // std::string keeps a NUL after its bytes, which PTX needs.
  absl::StatusOr<cuda::Module> module =
      cuda::Module::Load(*driver_, context_->get(), image.c_str());
  if (!module.ok()) return module.status();
  module_.emplace(*std::move(module));

  functions_.clear();
  for (const ProgramPlan::Launch& plan : plan_.launches) {
    absl::StatusOr<cuda::Function> function =
        module_->GetFunction(*plan.kernel);
    if (!function.ok()) return function.status();
    functions_.push_back(*function);
    int max_threads = 0;
    if (absl::Status s = driver_->Check(
            api.cuFuncGetAttribute(&max_threads,
                                   cuda::kFuncAttributeMaxThreadsPerBlock,
                                   *function),
            "cuFuncGetAttribute");
        !s.ok()) {
      return s;
    }
    if (static_cast<int>(plan.block_threads) > max_threads) {
      return absl::FailedPreconditionError(
          absl::StrCat("kernel '", *plan.kernel, "' is launched with ",
                       plan.block_threads, " threads per block, it allows ",
                       max_threads, " on device ", device_ordinal_));
    }
  }

  bool gemms = false, convs = false, attention = false;
  for (const ProgramPlan::Extern& e : plan_.externs) {
    gemms |= e.gemm != nullptr;
    convs |= e.conv != nullptr;
    attention |= e.attention != nullptr;
  }
  if (gemms || convs || attention) {
    // The handles are made with the executable's context current.
    absl::StatusOr<cuda::ScopedContext> scope =
        cuda::ScopedContext::Enter(*driver_, context_->get());
    if (!scope.ok()) return scope.status();
    if (gemms) {
      absl::StatusOr<std::shared_ptr<CudaGemm>> gemm =
          SharedPerContext<CudaGemm>(context_->get(),
                                     [] { return CudaGemm::Create(); });
      if (!gemm.ok()) return gemm.status();
      gemm_ = *std::move(gemm);
    }
    if (convs) {
      absl::StatusOr<std::unique_ptr<CudaConv>> conv =
          CudaConv::Create(context_->get());
      if (!conv.ok()) return conv.status();
      conv_ = *std::move(conv);
    }
    if (attention) {
      absl::StatusOr<std::unique_ptr<CudaAttention>> a =
          CudaAttention::Create(context_->get());
      if (!a.ok()) return a.status();
      attention_ = *std::move(a);
    }
  }

  if (plan_.error_buffer >= 0) {
    // The error word and its mirror, zeroed, with the context current.
    absl::StatusOr<cuda::ScopedContext> scope =
        cuda::ScopedContext::Enter(*driver_, context_->get());
    if (!scope.ok()) return scope.status();
    if (absl::Status s = driver_->Check(
            api.cuMemAlloc_v2(&error_word_, kErrorWordBytes), "cuMemAlloc");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = driver_->Check(
            api.cuMemsetD8_v2(error_word_, 0, kErrorWordBytes), "cuMemsetD8");
        !s.ok()) {
      return s;
    }
    void* mirror = nullptr;
    if (absl::Status s = driver_->Check(
            api.cuMemHostAlloc(&mirror, kErrorWordBytes, 0), "cuMemHostAlloc");
        !s.ok()) {
      return s;
    }
    error_mirror_ = static_cast<int64_t*>(mirror);
    std::memset(error_mirror_, 0, kErrorWordBytes);
  }

  allocator_ = options.allocator;
  if (allocator_ == nullptr) {
    auto own = CachingDeviceAllocator::Create(device_ordinal_);
    if (!own.ok()) return own.status();
    allocator_ = *std::move(own);
  }
  return absl::OkStatus();
}

namespace {

// The largest power of two up to 16 that divides the address of every
// buffer in `ids`.
template <typename Ids>
int64_t CommonAlignment(const Ids& ids,
                        absl::Span<const cuda::DevicePtr> buffers) {
  int64_t alignment = 16;
  for (int b : ids) {
    while (alignment > 1 && buffers[b] % alignment != 0) alignment /= 2;
  }
  return alignment;
}

// A library call's workspace of `bytes` (none when 0).
absl::StatusOr<DeviceAllocation> Workspace(
    const std::shared_ptr<DeviceAllocator>& allocator, size_t bytes,
    cuda::Stream stream) {
  if (bytes == 0) return DeviceAllocation();
  return DeviceAllocation::Allocate(allocator, bytes, stream);
}

}  // namespace

absl::Status CudaExecutable::RunConv(int step, const ProgramPlan::Extern& e,
                                     absl::Span<const int64_t> symbols,
                                     absl::Span<const int64_t> elements,
                                     absl::Span<const cuda::DevicePtr> buffers,
                                     cuda::Stream stream) const {
  absl::StatusOr<ConvDims> dims = EvaluateConv(*e.conv, symbols, elements);
  if (!dims.ok()) return dims.status();
  if (dims->x_elements == 0 || dims->w_elements == 0 || dims->y_elements == 0) {
    // An empty sum: the written tensor is zeros (when it has elements).
    const int64_t written =
        e.conv->direction() == v1::Convolution::FORWARD ? dims->y_elements
        : e.conv->direction() == v1::Convolution::BACKWARD_DATA
            ? dims->x_elements
            : dims->w_elements;
    if (written == 0) return absl::OkStatus();
    return driver_->Check(
        driver_->api().cuMemsetD8Async(
            buffers[e.c], 0,
            static_cast<size_t>(written * plan_.element_size[e.c]), stream),
        "cuMemsetD8Async");
  }
  absl::StatusOr<CudaConv::Prepared> prepared = conv_->Prepare(
      step, *e.conv, e.dtype, *dims,
      CommonAlignment(std::initializer_list<int>{e.a, e.b, e.c}, buffers));
  if (!prepared.ok()) return prepared.status();
  absl::StatusOr<DeviceAllocation> workspace =
      Workspace(allocator_, prepared->workspace_bytes, stream);
  if (!workspace.ok()) return workspace.status();
  return conv_->Run(*prepared, buffers[e.a], buffers[e.b], buffers[e.c],
                    workspace->get(), stream);
}

absl::Status CudaExecutable::RunAttention(
    int step, const ProgramPlan::Extern& e, absl::Span<const int64_t> symbols,
    absl::Span<const int64_t> elements,
    absl::Span<const cuda::DevicePtr> buffers, cuda::Stream stream) const {
  const v1::Attention& a = *e.attention;
  absl::StatusOr<AttentionDims> dims = EvaluateAttention(a, symbols, elements);
  if (!dims.ok()) return dims.status();
  const bool forward = a.direction() == v1::Attention::FORWARD;
  // The tensors' common alignment; dropout's (seed, offset) buffer, the
  // last read, needs only its int64s' own.
  absl::InlinedVector<int, 12> tensors(a.buffers().begin(), a.buffers().end());
  if (a.dropout() > 0) {
    const int rng = (forward ? 3 : 6) + (a.bias() ? 1 : 0);
    tensors.erase(tensors.begin() + rng);
  }
  absl::StatusOr<CudaAttention::Prepared> prepared =
      attention_->Prepare(step,
                          forward ? CudaAttention::Direction::kForward
                                  : CudaAttention::Direction::kBackward,
                          e.dtype, *dims,
                          {.causal = a.causal(),
                           .scale = a.scale(),
                           .bias = a.bias(),
                           .bias_batch = a.bias_batch(),
                           .bias_heads = a.bias_heads(),
                           .dropout = a.dropout(),
                           .bias_grad = a.bias_grad(),
                           .alignment = CommonAlignment(tensors, buffers)});
  if (!prepared.ok()) return prepared.status();
  absl::StatusOr<DeviceAllocation> workspace =
      Workspace(allocator_, prepared->workspace_bytes, stream);
  if (!workspace.ok()) return workspace.status();
  // The artifact lists the reads, then the writes (artifact.proto): the
  // runtime's order.
  absl::InlinedVector<cuda::DevicePtr, 10> pointers;
  for (int b : a.buffers()) pointers.push_back(buffers[b]);
  return attention_->Run(*prepared, pointers, workspace->get(), stream);
}

absl::Status CudaExecutable::CheckGuards(
    absl::Span<const DeviceTensorView> inputs,
    absl::Span<int64_t> symbols) const {
  return CheckInputGuards(
      artifact_, static_cast<int>(inputs.size()),
      [&](int i) {
        const DeviceTensorView& t = inputs[i];
        return GuardedTensor{t.dtype, t.sizes, t.strides, t.data};
      },
      symbols);
}

absl::StatusOr<std::vector<DeviceTensor>> CudaExecutable::Run(
    absl::Span<const DeviceTensorView> inputs, cuda::Stream stream) const {
  absl::InlinedVector<int64_t, 8> symbols(artifact_.symbols_size(), 0);
  if (absl::Status s = CheckGuards(inputs, absl::MakeSpan(symbols)); !s.ok())
    return s;
  absl::StatusOr<cuda::ScopedContext> scope =
      cuda::ScopedContext::Enter(*driver_, context_->get());
  if (!scope.ok()) return scope.status();
  // An earlier run's out-of-range index fails this call (Run's comment).
  if (absl::Status s = TakeIndexError(stream); !s.ok()) return s;

  absl::InlinedVector<cuda::DevicePtr, 8> output_data;
  std::vector<DeviceTensor> outputs;
  outputs.reserve(plan_.outputs.size());
  absl::InlinedVector<int64_t, 6> sizes;
  for (const ProgramPlan::Output& out : plan_.outputs) {
    sizes.clear();
    int64_t numel = 1;
    for (const v1::SymPoly& p : out.spec->sizes()) {
      sizes.push_back(EvaluateSymPoly(p, symbols));
      numel *= sizes.back();
    }
    const int64_t elements =
        std::max(numel, EvaluateSymPoly(*out.elements, symbols));
    if (elements < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("output of buffer ", out.buffer, " has ", elements,
                       " elements for these inputs"));
    }
    absl::StatusOr<DeviceAllocation> storage = DeviceAllocation::Allocate(
        allocator_,
        static_cast<size_t>(elements * plan_.element_size[out.buffer]), stream);
    if (!storage.ok()) return storage.status();
    output_data.push_back(storage->get());
    outputs.emplace_back(*std::move(storage), out.dtype, sizes);
  }

  if (absl::Status s =
          Execute(absl::MakeSpan(symbols), inputs, output_data, stream);
      !s.ok()) {
    return s;
  }
  return outputs;
}

absl::Status CudaExecutable::RunInto(absl::Span<const DeviceTensorView> inputs,
                                     absl::Span<const DeviceTensorView> outputs,
                                     cuda::Stream stream) const {
  absl::InlinedVector<int64_t, 8> symbols(artifact_.symbols_size(), 0);
  if (absl::Status s = CheckGuards(inputs, absl::MakeSpan(symbols)); !s.ok())
    return s;
  if (outputs.size() != plan_.outputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(outputs.size(), " outputs given, the program writes ",
                     plan_.outputs.size()));
  }
  absl::InlinedVector<cuda::DevicePtr, 8> output_data;
  absl::InlinedVector<int64_t, 6> sizes;
  for (size_t o = 0; o < outputs.size(); ++o) {
    const DeviceTensorView& out = outputs[o];
    const ProgramPlan::Output& spec = plan_.outputs[o];
    sizes.clear();
    int64_t numel = 1;
    for (const v1::SymPoly& p : spec.spec->sizes()) {
      sizes.push_back(EvaluateSymPoly(p, symbols));
      numel *= sizes.back();
    }
    if (absl::Status s = CheckOutputMemory(
            o, GuardedTensor{out.dtype, out.sizes, out.strides, out.data},
            spec.dtype, sizes);
        !s.ok()) {
      return s;
    }
    if (EvaluateSymPoly(*spec.elements, symbols) > numel) {
      return absl::FailedPreconditionError(
          absl::StrCat("output ", o,
                       ": the program's buffer is larger than "
                       "the output; use Run"));
    }
    output_data.push_back(out.data);
  }
  absl::StatusOr<cuda::ScopedContext> scope =
      cuda::ScopedContext::Enter(*driver_, context_->get());
  if (!scope.ok()) return scope.status();
  if (absl::Status s = TakeIndexError(stream); !s.ok()) return s;
  return Execute(absl::MakeSpan(symbols), inputs, output_data, stream);
}

absl::Status CudaExecutable::Execute(
    absl::Span<int64_t> symbols, absl::Span<const DeviceTensorView> inputs,
    absl::Span<const cuda::DevicePtr> output_data, cuda::Stream stream) const {
  absl::InlinedVector<cuda::DevicePtr, 16> buffers(plan_.element_size.size(),
                                                   0);
  if (plan_.error_buffer >= 0) buffers[plan_.error_buffer] = error_word_;
  for (const auto& [buffer, input] : plan_.input_buffers)
    buffers[buffer] = inputs[input].data;

  for (size_t o = 0; o < plan_.outputs.size(); ++o)
    buffers[plan_.outputs[o].buffer] = output_data[o];

  // Temps go back to the allocator in stream order: a later allocation on
  // this stream may reuse them at once, its work runs after these launches.
  // The small ones share one allocation (ProgramPlan::arena_offset).
  absl::InlinedVector<DeviceAllocation, 4> temps(plan_.num_temps);
  DeviceAllocation arena;
  if (plan_.arena_bytes > 0) {
    absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(
        allocator_, static_cast<size_t>(plan_.arena_bytes), stream);
    if (!a.ok()) return a.status();
    arena = *std::move(a);
    for (size_t b = 0; b < plan_.arena_offset.size(); ++b) {
      if (plan_.arena_offset[b] >= 0)
        buffers[b] = arena.get() + static_cast<uint64_t>(plan_.arena_offset[b]);
    }
  }
  absl::InlinedVector<void*, 32> params(plan_.max_params, nullptr);
  const v1::Program& program = artifact_.program();
  // For extern calls: the buffers' element counts (checked by EvaluateGemm
  // and EvaluateConv), made on the first call, and one cuBLASLt workspace,
  // made on the first GEMM.
  absl::InlinedVector<int64_t, 16> elements;
  DeviceAllocation workspace;
  for (const ProgramPlan::Step& step : plan_.steps) {
    switch (step.kind) {
      case ProgramPlan::Step::Kind::kAlloc: {
        const int64_t elements =
            EvaluateSymPoly(program.buffers(step.index).elements(), symbols);
        if (elements < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("temp buffer ", step.index, " has ", elements,
                           " elements for these inputs"));
        }
        absl::StatusOr<DeviceAllocation> temp = DeviceAllocation::Allocate(
            allocator_,
            static_cast<size_t>(elements * plan_.element_size[step.index]),
            stream);
        if (!temp.ok()) return temp.status();
        buffers[step.index] = temp->get();
        temps[plan_.temp_slot[step.index]] = *std::move(temp);
        break;
      }
      case ProgramPlan::Step::Kind::kFree:
        temps[plan_.temp_slot[step.index]].Reset();
        buffers[step.index] = 0;
        break;
      case ProgramPlan::Step::Kind::kLaunch: {
        const ProgramPlan::Launch& launch = plan_.launches[step.index];
        const int64_t range = EvaluateSymPoly(*launch.range, symbols);
        if (range <= 0) break;
        const int64_t blocks = std::max<int64_t>(
            1, (range + launch.items_per_block - 1) / launch.items_per_block);
        if (blocks > max_grid_x_) {
          return absl::InvalidArgumentError(
              absl::StrCat("kernel '", *launch.kernel, "' would need ", blocks,
                           " blocks, more than device ", device_ordinal_, "'s ",
                           max_grid_x_));
        }
        int p = 0;
        for (int k = 0; k < launch.num_slots; ++k)
          params[p++] = &buffers[plan_.launch_slots[launch.first_slot + k]];
        for (int64_t& value : symbols) params[p++] = &value;
        const cuda::Result result = driver_->api().cuLaunchKernel(
            functions_[step.index], static_cast<unsigned>(blocks), 1, 1,
            launch.block_threads, 1, 1, /*shared_bytes=*/0, stream,
            params.data(), /*extra=*/nullptr);
        if (result != cuda::kSuccess) {
          return driver_->Check(
              result, absl::StrCat("cuLaunchKernel(", *launch.kernel, ")"));
        }
        break;
      }
      case ProgramPlan::Step::Kind::kExtern: {
        const ProgramPlan::Extern& e = plan_.externs[step.index];
        if (elements.empty()) {
          for (const v1::BufferSpec& b : program.buffers())
            elements.push_back(EvaluateSymPoly(b.elements(), symbols));
        }
        if (e.conv != nullptr) {
          if (absl::Status s =
                  RunConv(step.index, e, symbols, elements, buffers, stream);
              !s.ok()) {
            return s;
          }
          break;
        }
        if (e.attention != nullptr) {
          if (absl::Status s = RunAttention(step.index, e, symbols, elements,
                                            buffers, stream);
              !s.ok()) {
            return s;
          }
          break;
        }
        if (workspace.get() == 0) {
          absl::StatusOr<DeviceAllocation> w = DeviceAllocation::Allocate(
              allocator_, CudaGemm::kWorkspaceBytes, stream);
          if (!w.ok()) return w.status();
          workspace = *std::move(w);
        }
        absl::StatusOr<GemmDims> dims =
            EvaluateGemm(*e.gemm, symbols, elements);
        if (!dims.ok()) return dims.status();
        CudaGemm::Options options;
        options.epilogue = e.gemm->epilogue();
        options.bias = e.bias >= 0 ? buffers[e.bias] : 0;
        options.tf32 = e.gemm->tf32();
        options.strict_reduction = e.gemm->strict_reduction();
        options.deterministic = e.gemm->deterministic();
        if (absl::Status s = gemm_->Run(
                step.index, e.dtype, *dims, e.gemm->alpha(), e.gemm->beta(),
                buffers[e.a], buffers[e.b], buffers[e.c], workspace.get(),
                CudaGemm::kWorkspaceBytes, stream, options);
            !s.ok()) {
          return s;
        }
        break;
      }
    }
  }
  if (error_mirror_ != nullptr) {
    // Pinned memory: the copy is asynchronous; the next Run (or
    // CheckIndexErrors) reads it.
    if (absl::Status s = driver_->Check(
            driver_->api().cuMemcpyDtoHAsync_v2(error_mirror_, error_word_,
                                                kErrorWordBytes, stream),
            "cuMemcpyDtoHAsync");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
