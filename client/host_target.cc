#include "client/host_target.h"

#include <fstream>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace kiln {
namespace {

// The x86-64 psABI levels, as /proc/cpuinfo spells their flags (sse3 is
// "pni", lzcnt is "abm").
constexpr const char* kV2[] = {"cx16",   "lahf_lm", "popcnt", "pni",
                               "sse4_1", "sse4_2",  "ssse3"};
constexpr const char* kV3[] = {"avx", "avx2", "bmi1",  "bmi2", "f16c",
                               "fma", "abm",  "movbe", "xsave"};
constexpr const char* kV4[] = {"avx512f", "avx512bw", "avx512cd", "avx512dq",
                               "avx512vl"};

template <size_t N>
bool HasAll(const absl::flat_hash_set<absl::string_view>& flags,
            const char* const (&names)[N]) {
  for (const char* name : names) {
    if (!flags.contains(name)) return false;
  }
  return true;
}

}  // namespace

std::string X86LevelFromCpuinfoFlags(absl::string_view line) {
  if (const size_t colon = line.find(':'); colon != absl::string_view::npos) {
    line.remove_prefix(colon + 1);
  }
  absl::flat_hash_set<absl::string_view> flags;
  for (absl::string_view f : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    flags.insert(f);
  }
  if (!HasAll(flags, kV2)) return "x86-64";
  if (!HasAll(flags, kV3)) return "x86-64-v2";
  if (!HasAll(flags, kV4)) return "x86-64-v3";
  return "x86-64-v4";
}

v1::CpuTarget HostCpuTargetFromCpuinfo() {
  v1::CpuTarget target;
#if defined(__x86_64__)
  target.set_triple("x86_64-unknown-linux-gnu");
  std::string cpu = "x86-64";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "flags")) {
      cpu = X86LevelFromCpuinfoFlags(line);
      break;
    }
  }
  target.set_cpu(cpu);
#elif defined(__aarch64__)
  target.set_triple("aarch64-unknown-linux-gnu");
  target.set_cpu("generic");
#else
  target.set_triple("unknown-unknown-linux-gnu");
#endif
  return target;
}

}  // namespace kiln
