#include "runtime/cpu_executable.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "runtime/cpu_attention.h"
#include "runtime/cpu_blas.h"
#include "runtime/cpu_conv.h"
#include "support/sha256.h"

namespace kiln {
namespace {

// The format this runtime understands (compiler/compile.h's
// kArtifactFormatVersion; the client does not link the compiler back end).
constexpr int kSupportedFormatVersion = 1;

// What the CPU runtime runs: launches without block geometry, extern calls
// into a CBLAS in float32 (bfloat16 operands into a float32 C through
// oneDNN), convolutions through oneDNN in float32, fused attention in its
// own kernel (cpu_attention.h).
LaunchLimits CpuLimits() {
  LaunchLimits limits;
  limits.extern_library = v1::ExternCall::BLAS;
  limits.gemm_dtypes = {{DType::kFloat32, DType::kFloat32}};
  limits.gemm_mixed_dtypes = {{DType::kBFloat16, DType::kFloat32}};
  limits.conv_library = v1::ExternCall::ONEDNN;
  limits.conv_dtypes = {DType::kFloat32};
  limits.conv_mixed_dtypes = {{DType::kBFloat16, DType::kFloat32}};
  limits.attention_library = v1::ExternCall::KILN_RUNTIME;
  limits.attention_dtypes = {DType::kFloat32, DType::kFloat16,
                             DType::kBFloat16};
  limits.attention_bias_grad = true;
  return limits;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuExecutable>> CpuExecutable::Load(
    const v1::Artifact& artifact) {
  return Load(v1::Artifact(artifact));  // one copy (not on the Lookup path)
}

absl::StatusOr<std::unique_ptr<CpuExecutable>> CpuExecutable::Load(
    v1::Artifact&& artifact) {
  const std::string shared_object =
      std::move(*artifact.mutable_cpu()->mutable_shared_object());
  const absl::string_view piece(shared_object);
  return LoadFromPieces(std::move(artifact), absl::MakeConstSpan(&piece, 1));
}

absl::StatusOr<std::unique_ptr<CpuExecutable>> CpuExecutable::LoadFromPieces(
    v1::Artifact artifact, absl::Span<const absl::string_view> shared_object) {
  if (artifact.format_version() != kSupportedFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("artifact format version ", artifact.format_version(),
                     " is not supported (this runtime reads ",
                     kSupportedFormatVersion, ")"));
  }
  if (!artifact.has_cpu())
    return absl::FailedPreconditionError("the artifact holds no CPU binary");
  Sha256Digest expected{};
  if (artifact.binary_sha256().size() != expected.size()) {
    return absl::DataLossError("the artifact's binary_sha256 is not 32 bytes");
  }
  std::memcpy(expected.data(), artifact.binary_sha256().data(),
              expected.size());
  // The program is checked before any of the artifact's code is loaded.
  if (absl::StatusOr<ProgramPlan> plan = PlanProgram(artifact, CpuLimits());
      !plan.ok()) {
    return plan.status();
  }
  // LoadedLibrary::Load verifies the SHA-256 before the bytes are used.
  auto library = LoadedLibrary::Load(shared_object, expected);
  if (!library.ok()) return library.status();
  artifact.mutable_cpu()->clear_shared_object();  // kept without the binary
  std::unique_ptr<CpuExecutable> exe(
      new CpuExecutable(std::move(artifact), *std::move(library)));
  // Planned again where the artifact now lives (the plan points into it).
  absl::StatusOr<ProgramPlan> plan = PlanProgram(exe->artifact_, CpuLimits());
  if (!plan.ok()) return plan.status();
  exe->plan_ = *std::move(plan);
  for (const ProgramPlan::Launch& launch : exe->plan_.launches) {
    auto sym = exe->library_.Symbol(*launch.kernel);
    if (!sym.ok()) return sym.status();
    exe->kernels_.push_back(reinterpret_cast<KernelFn>(*sym));
  }
  for (const ProgramPlan::Extern& e : exe->plan_.externs) {
    if (e.conv == nullptr) continue;
    absl::StatusOr<std::unique_ptr<CpuConv>> conv = CpuConv::Create();
    if (!conv.ok()) return conv.status();
    exe->conv_ = *std::move(conv);
    break;
  }
  return exe;
}

absl::StatusOr<std::vector<int64_t>> CpuExecutable::CheckGuards(
    absl::Span<const HostTensor> inputs) const {
  std::vector<int64_t> symbols(artifact_.symbols_size(), 0);
  absl::Status status = CheckInputGuards(
      artifact_, static_cast<int>(inputs.size()),
      [&](int i) {
        const HostTensor& t = inputs[i];
        return GuardedTensor{t.dtype(), t.sizes(), t.strides(),
                             reinterpret_cast<uintptr_t>(t.data())};
      },
      absl::MakeSpan(symbols));
  if (!status.ok()) return status;
  return symbols;
}

namespace {
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using TempBlocks = std::multimap<size_t, std::unique_ptr<void, FreeDeleter>>;

// The most temporary memory an executable keeps between runs.
constexpr size_t kMaxCachedTempBytes = size_t{256} << 20;
}  // namespace

struct CpuExecutable::TempCache {
  absl::Mutex mu;
  TempBlocks blocks ABSL_GUARDED_BY(mu);

  TempBlocks Take() {
    absl::MutexLock lock(&mu);
    return std::exchange(blocks, {});
  }
  // Keeps `freed` (the largest first) up to kMaxCachedTempBytes in all.
  void Give(TempBlocks freed) {
    absl::MutexLock lock(&mu);
    size_t bytes = 0;
    for (const auto& [size, block] : blocks) bytes += size;
    for (auto it = freed.rbegin(); it != freed.rend(); ++it) {
      if (bytes + it->first > kMaxCachedTempBytes) continue;
      bytes += it->first;
      blocks.emplace(it->first, std::move(it->second));
    }
  }
};

struct CpuExecutable::Profile {
  explicit Profile(int64_t every) : every(every) {}

  // Adds one run's step times (nanoseconds per plan step); every `every`
  // runs, prints the table for `exe` and clears it.
  void Add(const CpuExecutable& exe, const std::vector<int64_t>& step_ns) {
    absl::MutexLock lock(&mu);
    if (total_ns.empty()) total_ns.assign(step_ns.size(), 0);
    for (size_t i = 0; i < step_ns.size(); ++i) total_ns[i] += step_ns[i];
    if (++runs < every) return;
    Print(exe);
    total_ns.assign(step_ns.size(), 0);
    runs = 0;
  }

  void Print(const CpuExecutable& exe) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const ProgramPlan& plan = exe.plan_;
    int64_t sum = 0;
    for (int64_t t : total_ns) sum += t;
    std::vector<size_t> order;
    for (size_t i = 0; i < total_ns.size(); ++i) {
      if (plan.steps[i].kind == ProgramPlan::Step::Kind::kLaunch ||
          plan.steps[i].kind == ProgramPlan::Step::Kind::kExtern)
        order.push_back(i);
    }
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return total_ns[a] > total_ns[b]; });
    std::string table = absl::StrCat(
        "kiln cpu profile: ", exe.artifact_.program().buffers_size(),
        " buffers, ", order.size(), " steps, ", runs, " runs, ",
        absl::StrFormat("%.3f", sum / 1e6 / runs), " ms per run\n");
    for (size_t i : order) {
      const ProgramPlan::Step& step = plan.steps[i];
      std::string what;
      if (step.kind == ProgramPlan::Step::Kind::kLaunch) {
        what = *plan.launches[step.index].kernel;
      } else {
        auto label = extern_labels.find(i);
        what = label != extern_labels.end() ? label->second : "gemm";
      }
      absl::StrAppend(
          &table, absl::StrFormat(
                      "  step %4d  %8.3f ms  %5.1f%%  %s\n", i,
                      total_ns[i] / 1e6 / runs,
                      100.0 * total_ns[i] / std::max<int64_t>(sum, 1), what));
    }
    std::fputs(table.c_str(), stderr);
  }

  // Labels a GEMM step by its dims (the first run's).
  void NoteGemm(size_t step, const GemmDims& d) {
    absl::MutexLock lock(&mu);
    if (extern_labels.contains(step)) return;
    extern_labels[step] = absl::StrFormat(
        "gemm %dx%dx%dx%d (batch, m, n, k)%s%s", d.batch, d.m, d.n, d.k,
        d.a.transposed ? " A^T" : "", d.b.transposed ? " B^T" : "");
  }

  // Labels a convolution step by its direction and dims (the first run's).
  void NoteConv(size_t step, const v1::Convolution& conv, const ConvDims& d) {
    absl::MutexLock lock(&mu);
    if (extern_labels.contains(step)) return;
    std::string spatial;
    for (int s = 0; s < d.spatial; ++s)
      absl::StrAppend(&spatial, s ? "x" : "", d.x[s]);
    extern_labels[step] =
        absl::StrFormat("onednn conv %s n%d c%d o%d %s k%d s%d g%d",
                        v1::Convolution::Direction_Name(conv.direction()), d.n,
                        d.c, d.o, spatial, d.kernel[0], d.stride[0], d.groups);
  }

  void NoteAttention(size_t step, const v1::Attention& a,
                     const AttentionDims& d) {
    absl::MutexLock lock(&mu);
    if (extern_labels.contains(step)) return;
    extern_labels[step] = absl::StrFormat(
        "attention %s %dx%dx%dx%d (batch, heads, queries, keys) dim "
        "%d/%d%s%s%s",
        v1::Attention::Direction_Name(a.direction()), d.batch, d.heads, d.s_q,
        d.s_kv, d.d_qk, d.d_v, a.causal() ? " causal" : "",
        a.dropout() > 0 ? " dropout" : "", a.bias_grad() ? " bias grad" : "");
  }

  const int64_t every;
  absl::Mutex mu;
  absl::flat_hash_map<size_t, std::string> extern_labels ABSL_GUARDED_BY(mu);
  std::vector<int64_t> total_ns ABSL_GUARDED_BY(mu);
  int64_t runs ABSL_GUARDED_BY(mu) = 0;
};

CpuExecutable::CpuExecutable(v1::Artifact artifact, LoadedLibrary library)
    : artifact_(std::move(artifact)),
      library_(std::move(library)),
      temp_cache_(std::make_unique<TempCache>()) {
  if (const char* env = std::getenv("KILN_CPU_PROFILE")) {
    const int64_t every = std::atoll(env);
    if (every > 0) profile_ = std::make_unique<Profile>(every);
  }
}

CpuExecutable::~CpuExecutable() = default;

absl::StatusOr<std::vector<int64_t>> CpuExecutable::CheckViewGuards(
    absl::Span<const HostBufferView> inputs) const {
  std::vector<int64_t> symbols(artifact_.symbols_size(), 0);
  absl::Status status = CheckInputGuards(
      artifact_, static_cast<int>(inputs.size()),
      [&](int i) {
        const HostBufferView& t = inputs[i];
        return GuardedTensor{t.dtype, t.sizes, t.strides,
                             reinterpret_cast<uintptr_t>(t.data)};
      },
      absl::MakeSpan(symbols));
  if (!status.ok()) return status;
  return symbols;
}

std::vector<std::vector<int64_t>> CpuExecutable::SizesFor(
    absl::Span<const int64_t> symbols) const {
  std::vector<std::vector<int64_t>> all;
  all.reserve(plan_.outputs.size());
  for (const ProgramPlan::Output& out : plan_.outputs) {
    std::vector<int64_t>& sizes = all.emplace_back();
    for (const v1::SymPoly& s : out.spec->sizes())
      sizes.push_back(EvaluateSymPoly(s, symbols));
  }
  return all;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> CpuExecutable::OutputSizes(
    absl::Span<const HostBufferView> inputs) const {
  auto symbols = CheckViewGuards(inputs);
  if (!symbols.ok()) return symbols.status();
  return SizesFor(*symbols);
}

absl::StatusOr<std::vector<HostTensor>> CpuExecutable::Run(
    absl::Span<const HostTensor> inputs, ThreadPool* pool) const {
  auto symbols = CheckGuards(inputs);
  if (!symbols.ok()) return symbols.status();
  std::vector<HostTensor> outputs;
  std::vector<void*> output_data;
  outputs.reserve(plan_.outputs.size());
  for (std::vector<int64_t>& sizes : SizesFor(*symbols)) {
    outputs.push_back(HostTensor::Uninitialized(
        plan_.outputs[outputs.size()].dtype, std::move(sizes)));
    output_data.push_back(outputs.back().data());
  }
  std::vector<void*> input_data;
  input_data.reserve(inputs.size());
  for (const HostTensor& t : inputs)
    input_data.push_back(const_cast<uint8_t*>(t.data()));
  absl::Status status = Execute(*symbols, input_data, output_data, pool);
  if (!status.ok()) return status;
  return outputs;
}

absl::Status CpuExecutable::RunInto(absl::Span<const HostBufferView> inputs,
                                    absl::Span<const HostBufferView> outputs,
                                    ThreadPool* pool) const {
  auto symbols = CheckViewGuards(inputs);
  if (!symbols.ok()) return symbols.status();
  if (outputs.size() != plan_.outputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(outputs.size(), " outputs given, the program writes ",
                     plan_.outputs.size()));
  }
  const std::vector<std::vector<int64_t>> sizes = SizesFor(*symbols);
  std::vector<void*> output_data(outputs.size(), nullptr);
  for (size_t o = 0; o < outputs.size(); ++o) {
    const HostBufferView& out = outputs[o];
    if (absl::Status s = CheckOutputMemory(
            o,
            GuardedTensor{out.dtype, out.sizes, out.strides,
                          reinterpret_cast<uintptr_t>(out.data)},
            plan_.outputs[o].dtype, sizes[o]);
        !s.ok()) {
      return s;
    }
    output_data[o] = out.data;
  }
  std::vector<void*> input_data;
  input_data.reserve(inputs.size());
  for (const HostBufferView& t : inputs) input_data.push_back(t.data);
  return Execute(*symbols, input_data, output_data, pool);
}

absl::Status CpuExecutable::Execute(absl::Span<const int64_t> symbols,
                                    absl::Span<void* const> input_data,
                                    absl::Span<void* const> output_data,
                                    ThreadPool* pool) const {
  std::vector<void*> buffers(plan_.element_size.size(), nullptr);
  for (size_t o = 0; o < plan_.outputs.size(); ++o)
    buffers[plan_.outputs[o].buffer] = output_data[o];
  for (const auto& [buffer, input] : plan_.input_buffers)
    buffers[buffer] = input_data[input];
  // The index checks' error word, zeroed per run (program_plan.h).
  alignas(16) int64_t error_word[3] = {0, 0, 0};
  if (plan_.error_buffer >= 0) buffers[plan_.error_buffer] = error_word;
  // Temps: a freed block is reused by a later allocation of a size it can
  // hold (unfused programs free and allocate one temp per op), starting
  // from the blocks earlier runs left (temp_cache_), given back at the end.
  std::vector<std::unique_ptr<void, FreeDeleter>> temps(plan_.num_temps);
  std::vector<size_t> temp_bytes(plan_.num_temps, 0);
  TempBlocks free_blocks = temp_cache_->Take();
  absl::Cleanup give_back = [&] {
    for (size_t slot = 0; slot < temps.size(); ++slot) {
      if (temps[slot])
        free_blocks.emplace(temp_bytes[slot], std::move(temps[slot]));
    }
    temp_cache_->Give(std::move(free_blocks));
  };
  const v1::Program& program = artifact_.program();
  std::vector<int64_t> elements;  // per buffer, on the first extern call
  std::vector<int64_t> step_ns;
  if (profile_) step_ns.assign(plan_.steps.size(), 0);
  for (size_t step_index = 0; step_index < plan_.steps.size(); ++step_index) {
    const ProgramPlan::Step& step = plan_.steps[step_index];
    const auto start = profile_ ? std::chrono::steady_clock::now()
                                : std::chrono::steady_clock::time_point();
    absl::Cleanup timed = [&] {
      if (profile_)
        step_ns[step_index] = (std::chrono::steady_clock::now() - start) /
                              std::chrono::nanoseconds(1);
    };
    switch (step.kind) {
      case ProgramPlan::Step::Kind::kAlloc: {
        const int slot = plan_.temp_slot[step.index];
        const int64_t bytes =
            EvaluateSymPoly(program.buffers(step.index).elements(), symbols) *
            plan_.element_size[step.index];
        const size_t rounded =
            static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
        auto reuse = free_blocks.lower_bound(rounded);
        if (reuse != free_blocks.end() && reuse->first <= 2 * rounded) {
          temp_bytes[slot] = reuse->first;
          temps[slot] = std::move(reuse->second);
          free_blocks.erase(reuse);
        } else {
          temp_bytes[slot] = rounded;
          temps[slot].reset(std::aligned_alloc(64, rounded));
        }
        if (!temps[slot])
          return absl::ResourceExhaustedError(
              absl::StrCat("cannot allocate ", bytes, " bytes"));
        buffers[step.index] = temps[slot].get();
        break;
      }
      case ProgramPlan::Step::Kind::kFree: {
        const int slot = plan_.temp_slot[step.index];
        free_blocks.emplace(temp_bytes[slot], std::move(temps[slot]));
        break;
      }
      case ProgramPlan::Step::Kind::kExtern: {
        const ProgramPlan::Extern& e = plan_.externs[step.index];
        if (elements.empty()) {
          for (const v1::BufferSpec& b : program.buffers())
            elements.push_back(EvaluateSymPoly(b.elements(), symbols));
        }
        if (e.attention != nullptr) {
          absl::StatusOr<AttentionDims> dims =
              EvaluateAttention(*e.attention, symbols, elements);
          if (!dims.ok()) return dims.status();
          if (profile_)
            profile_->NoteAttention(step_index, *e.attention, *dims);
          std::vector<void*> tensors;
          for (int b : e.attention->buffers()) tensors.push_back(buffers[b]);
          if (absl::Status s =
                  RunCpuAttention(*e.attention, *dims, tensors, pool);
              !s.ok()) {
            return s;
          }
          break;
        }
        if (e.conv != nullptr) {
          absl::StatusOr<ConvDims> dims =
              EvaluateConv(*e.conv, symbols, elements);
          if (!dims.ok()) return dims.status();
          if (profile_) profile_->NoteConv(step_index, *e.conv, *dims);
          if (absl::Status s =
                  conv_->Run(step.index, *e.conv, *dims, buffers[e.a],
                             buffers[e.b], buffers[e.c]);
              !s.ok()) {
            return s;
          }
          break;
        }
        absl::StatusOr<GemmDims> dims =
            EvaluateGemm(*e.gemm, symbols, elements);
        if (!dims.ok()) return dims.status();
        if (profile_) profile_->NoteGemm(step_index, *dims);
        absl::StatusOr<const CpuBlas*> blas = CpuBlas::Get();
        if (!blas.ok()) return blas.status();
        const absl::Status s =
            e.c_dtype != e.dtype
                ? (*blas)->GemmBf16(*dims, e.gemm->alpha(), e.gemm->beta(),
                                    buffers[e.a], buffers[e.b],
                                    static_cast<float*>(buffers[e.c]), pool)
                : (*blas)->Gemm(e.dtype, *dims, e.gemm->alpha(), e.gemm->beta(),
                                buffers[e.a], buffers[e.b], buffers[e.c], pool);
        if (!s.ok()) return s;
        break;
      }
      case ProgramPlan::Step::Kind::kLaunch: {
        const ProgramPlan::Launch& l = plan_.launches[step.index];
        KernelFn fn = kernels_[step.index];
        std::vector<void*> slots;
        slots.reserve(l.num_slots);
        for (int k = 0; k < l.num_slots; ++k)
          slots.push_back(buffers[plan_.launch_slots[l.first_slot + k]]);
        const int64_t range = EvaluateSymPoly(*l.range, symbols);
        if (range <= 0) break;
        const int64_t max_chunks = pool ? pool->size() : 1;
        const int64_t chunks =
            std::min<int64_t>(max_chunks, (range + l.grain - 1) / l.grain);
        const int64_t per = (range + chunks - 1) / chunks;
        auto run_chunk = [&](int64_t c) {
          const int64_t lo = c * per, hi = std::min(range, lo + per);
          if (lo < hi) fn(slots.data(), symbols.data(), lo, hi);
        };
        if (chunks <= 1 || pool == nullptr) {
          run_chunk(0);
          for (int64_t c = 1; c < chunks; ++c) run_chunk(c);
        } else {
          pool->ParallelFor(chunks, run_chunk);
        }
        break;
      }
    }
  }
  if (profile_) profile_->Add(*this, step_ns);
  // The whole program ran (every index clamped); a recorded violation
  // fails the call.
  return IndexErrorStatus(program, error_word);
}

}  // namespace kiln
