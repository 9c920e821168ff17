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

int64_t EvaluateSymPoly(const v1::SymPoly& p,
                        absl::Span<const int64_t> symbols) {
  uint64_t sum = 0;
  for (const v1::SymPoly::Term& t : p.terms()) {
    uint64_t prod = static_cast<uint64_t>(t.coeff());
    for (int s : t.symbols()) prod *= static_cast<uint64_t>(symbols[s]);
    sum += prod;
  }
  return static_cast<int64_t>(sum);
}

absl::StatusOr<std::unique_ptr<CpuExecutable>> CpuExecutable::Load(
    const v1::Artifact& artifact) {
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
  auto library = LoadedLibrary::Load(artifact.cpu().shared_object(), expected);
  if (!library.ok()) return library.status();
  std::unique_ptr<CpuExecutable> exe(
      new CpuExecutable(artifact, *std::move(library)));
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
  const auto& guards = artifact_.inputs();
  if (static_cast<int>(inputs.size()) != guards.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the graph takes ", guards.size(), " inputs, got ", inputs.size()));
  }
  std::vector<int64_t> symbols(artifact_.symbols_size(), 0);
  for (int s = 0; s < artifact_.symbols_size(); ++s) {
    const v1::SymbolGuard& g = artifact_.symbols(s);
    if (g.input() < 0) {
      symbols[s] = g.min_value();
      continue;
    }
    const HostTensor& t = inputs[g.input()];
    if (g.dim() >= t.rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", g.input(), " has rank ", t.rank(), ", symbol ",
                       g.name(), " is its dim ", g.dim()));
    }
    const int64_t v = t.sizes()[g.dim()];
    if (v < g.min_value() || (g.max_value() > 0 && v > g.max_value()) ||
        (g.multiple_of() > 1 && v % g.multiple_of() != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", g.input(), " dim ", g.dim(), ": size ", v,
          " violates the guard of symbol ", g.name(), " (>= ", g.min_value(),
          g.max_value() > 0 ? absl::StrCat(", <= ", g.max_value()) : "",
          g.multiple_of() > 1 ? absl::StrCat(", multiple of ", g.multiple_of())
                              : "",
          ")"));
    }
    symbols[s] = v;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const v1::InputGuard& g = guards[static_cast<int>(i)];
    const HostTensor& t = inputs[i];
    if (static_cast<int>(t.dtype()) != static_cast<int>(g.dtype())) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", i, ": dtype ", DTypeName(t.dtype()),
                       ", compiled for dtype #", g.dtype()));
    }
    if (t.rank() != g.sizes_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", i, ": rank ", t.rank(), ", compiled for rank ",
                       g.sizes_size()));
    }
    bool empty = false;
    for (int d = 0; d < t.rank(); ++d) {
      const int64_t want = EvaluateSymPoly(g.sizes(d), symbols);
      if (t.sizes()[d] != want) {
        return absl::InvalidArgumentError(
            absl::StrCat("input ", i, ": size ", t.sizes()[d], " of dim ", d,
                         ", compiled for ", want));
      }
      empty |= want == 0;
    }
    if (!empty) {
      for (int d = 0; d < t.rank(); ++d) {
        if (t.sizes()[d] == 1) continue;  // its stride is never used
        const int64_t want = EvaluateSymPoly(g.strides(d), symbols);
        if (t.strides()[d] != want) {
          return absl::InvalidArgumentError(
              absl::StrCat("input ", i, ": stride ", t.strides()[d], " of dim ",
                           d, ", compiled for ", want));
        }
      }
      const auto addr = reinterpret_cast<uintptr_t>(t.data());
      if (g.alignment() > 1 &&
          addr % static_cast<uintptr_t>(g.alignment()) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input ", i, ": data is not ", g.alignment(), "-byte aligned"));
      }
    }
  }
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
