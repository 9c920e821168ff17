// The guard key: SHA-256 over a canonical encoding of everything that
// decides the generated code (DESIGN.md, decision 2), and nothing about the
// calling process.
//
// Components, each hashed on its own so two keys can be diffed part by part:
//   format      the key format version
//   compiler    the compiler's identity (hash of its sources + LLVM/CUDA
//               versions, fixed at build time)
//   graph       the canonical graph: nodes in a canonical topological order
//               (independent nodes ordered by structure), values renumbered
//               in that order, arguments in schema order
//   input.<i>   per input: dtype, rank, each size (static value or symbol
//               number), stride pattern (strides of size-1 dims don't count),
//               alignment class (>= 16 bytes or not)
//   symbols     per symbol (numbered by first use): bounds, multiple_of
//   target      CPU triple/cpu/features or CUDA arch
//   options     the code-changing CompileOptions
// The key is SHA-256 over the component names and their hashes, in order.
//
// Renaming values or symbols, reordering independent nodes and changing
// storage offsets keep the key; changing any guarded property changes it.
//
// Thread-safety: pure functions.
#ifndef KILN_COMPILER_GUARD_KEY_H_
#define KILN_COMPILER_GUARD_KEY_H_

#include <string>
#include <vector>

#include "compiler/graph.h"
#include "kiln/v1/graph.pb.h"
#include "support/sha256.h"

namespace kiln {

using GuardKey = Sha256Digest;

struct KeyComponent {
  std::string name;       // "format", "compiler", "graph", "input.0", ...
  std::string canonical;  // readable canonical encoding of the part
  Sha256Digest hash;      // SHA-256 of `canonical`
};

// Components in key order.
std::vector<KeyComponent> ExplainKey(const Graph& graph, const v1::Target& target,
                                     const v1::CompileOptions& options);

GuardKey ComputeGuardKey(const Graph& graph, const v1::Target& target,
                         const v1::CompileOptions& options);

// The key from its components (what ComputeGuardKey does after ExplainKey).
GuardKey CombineKeyComponents(const std::vector<KeyComponent>& components);

// The compiler identity baked in at build time (64 hex characters).
const char* CompilerIdentity();

}  // namespace kiln

#endif  // KILN_COMPILER_GUARD_KEY_H_
