#include "client/cpu_executable.h"

#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "support/sha256.h"

namespace kiln {

// The format this runtime understands (compiler/compile.h's
// kArtifactFormatVersion; the client does not link the compiler back end).
constexpr int kSupportedFormatVersion = 1;

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
  // LoadedLibrary::Load verifies the SHA-256 before the bytes are used.
  auto library = LoadedLibrary::Load(shared_object, expected);
  if (!library.ok()) return library.status();
  artifact.mutable_cpu()->clear_shared_object();  // kept without the binary
  std::unique_ptr<CpuExecutable> exe(
      new CpuExecutable(std::move(artifact), *std::move(library)));
  for (const v1::Step& step : exe->artifact_.program().steps()) {
    if (!step.has_launch()) continue;
    auto sym = exe->library_.Symbol(step.launch().kernel());
    if (!sym.ok()) return sym.status();
    exe->kernels_.push_back(reinterpret_cast<KernelFn>(*sym));
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
}  // namespace

absl::StatusOr<std::vector<HostTensor>> CpuExecutable::Run(
    absl::Span<const HostTensor> inputs, ThreadPool* pool) const {
  auto symbols = CheckGuards(inputs);
  if (!symbols.ok()) return symbols.status();
  const v1::Program& program = artifact_.program();
  std::vector<void*> buffers(program.buffers_size(), nullptr);
  std::vector<HostTensor> outputs(artifact_.outputs_size());
  for (int o = 0; o < artifact_.outputs_size(); ++o) {
    const v1::OutputSpec& spec = artifact_.outputs(o);
    std::vector<int64_t> sizes;
    for (const v1::SymPoly& s : spec.sizes())
      sizes.push_back(EvaluateSymPoly(s, *symbols));
    outputs[o] =
        HostTensor::Uninitialized(static_cast<DType>(spec.dtype()), sizes);
    buffers[spec.buffer()] = outputs[o].data();
  }
  for (int b = 0; b < program.buffers_size(); ++b) {
    const v1::BufferSpec& spec = program.buffers(b);
    if (spec.kind() == v1::BufferSpec::INPUT) {
      buffers[b] = const_cast<uint8_t*>(inputs[spec.index()].data());
    }
  }
  // Temps: a freed block is reused by a later allocation of a size it can
  // hold (unfused programs free and allocate one temp per op).
  std::vector<std::unique_ptr<void, FreeDeleter>> temps(program.buffers_size());
  std::vector<size_t> temp_bytes(program.buffers_size(), 0);
  std::multimap<size_t, std::unique_ptr<void, FreeDeleter>> free_blocks;
  size_t launch = 0;
  for (const v1::Step& step : program.steps()) {
    if (step.has_alloc()) {
      const v1::BufferSpec& spec = program.buffers(step.alloc());
      const int64_t bytes = EvaluateSymPoly(spec.elements(), *symbols) *
                            DTypeSize(static_cast<DType>(spec.dtype()));
      const size_t rounded =
          static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
      auto reuse = free_blocks.lower_bound(rounded);
      if (reuse != free_blocks.end() && reuse->first <= 2 * rounded) {
        temp_bytes[step.alloc()] = reuse->first;
        temps[step.alloc()] = std::move(reuse->second);
        free_blocks.erase(reuse);
      } else {
        temp_bytes[step.alloc()] = rounded;
        temps[step.alloc()].reset(std::aligned_alloc(64, rounded));
      }
      if (!temps[step.alloc()])
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", bytes, " bytes"));
      buffers[step.alloc()] = temps[step.alloc()].get();
    } else if (step.has_free()) {
      free_blocks.emplace(temp_bytes[step.free()],
                          std::move(temps[step.free()]));
    } else if (step.has_launch()) {
      const v1::Launch& l = step.launch();
      KernelFn fn = kernels_[launch++];
      std::vector<void*> slots;
      for (int b : l.buffers()) slots.push_back(buffers[b]);
      const int64_t range = EvaluateSymPoly(l.range(), *symbols);
      if (range <= 0) continue;
      const int64_t grain = std::max<int64_t>(l.grain(), 1);
      const int64_t max_chunks = pool ? pool->size() : 1;
      const int64_t chunks =
          std::min<int64_t>(max_chunks, (range + grain - 1) / grain);
      const int64_t per = (range + chunks - 1) / chunks;
      auto run_chunk = [&](int64_t c) {
        const int64_t lo = c * per, hi = std::min(range, lo + per);
        if (lo < hi) fn(slots.data(), symbols->data(), lo, hi);
      };
      if (chunks <= 1 || pool == nullptr) {
        run_chunk(0);
        for (int64_t c = 1; c < chunks; ++c) run_chunk(c);
      } else {
        pool->ParallelFor(chunks, run_chunk);
      }
    }
  }
  return outputs;
}

}  // namespace kiln
