// The host's CPU target for requests, without LLVM (clients do not link it).
//
// On x86-64 the CPU is named by its x86-64 micro-architecture level
// ("x86-64", "x86-64-v2", "-v3", "-v4"), read from the flags the kernel
// reports in /proc/cpuinfo (so features the OS has not enabled, such as AVX
// state, do not count); the level implies the features, so `features` is
// empty. This is kiln::Client::DefaultTarget() and kilnctl's --target=cpu,
// so both get the same guard key for a graph. compiler/cpu_backend.h's
// HostCpuTarget() names the exact CPU and its features instead (another
// guard key for the same machine; used by the compiler's own tests).
//
// Thread-safety: pure functions.
#ifndef KILN_CLIENT_HOST_TARGET_H_
#define KILN_CLIENT_HOST_TARGET_H_

#include <string>

#include "absl/strings/string_view.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

// The target for code that runs on this machine.
v1::CpuTarget HostCpuTargetFromCpuinfo();

// The x86-64 level implied by a /proc/cpuinfo "flags" line (the words after
// the colon, or the whole line): "x86-64", "x86-64-v2", "x86-64-v3" or
// "x86-64-v4".
std::string X86LevelFromCpuinfoFlags(absl::string_view flags);

}  // namespace kiln

#endif  // KILN_CLIENT_HOST_TARGET_H_
