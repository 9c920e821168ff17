// The guard key, also called the request key: SHA-256 over a canonical
// encoding of everything in a request that decides the generated code
// (DESIGN.md, decisions 2 and 11), and nothing about the calling process (no
// names, device ordinals, storage offsets, paths, time) nor about the build
// that computes it: clients of any build compute the same key. kilnd stores
// an artifact under the request key combined with its compiler's identity
// (compiler/compiler_identity.h, StoreKey), so a changed compiler never
// serves an older one's artifact.
//
// Components, each a readable canonical text hashed on its own so two keys
// can be diffed part by part (`kilnctl explain`):
//   format      the key format version ("kiln-request-key-v1")
//   graph       the canonical graph. Each node gets a structural (Merkle)
//               hash of its op and arguments, a tensor argument standing for
//               "input i" or (producer's hash, output index); and a use hash
//               of its consumers' use hashes, argument positions and graph
//               output positions. Nodes are ordered by Kahn's algorithm taking
//               the ready node with the smallest (structural, use) hash;
//               values are numbered inputs first (by position), then node
//               outputs in that order. One line per node, e.g.
//                 %3 = aten.mul.Tensor(self=%2, other=f:0.5/0x3fe0...)
//                      : float32[s0, 16]     (on one line)
//               Floats carry their bit pattern; strings are C-escaped.
//               Then the outputs, and the input writes when there are any
//               ("input writes output 0 -> input 2, ...", in request order).
//   input.<i>   per input: dtype, rank, sizes (static value, canonical
//               symbol or polynomial over canonical symbols, e.g.
//               "s0*s1", "-1 + s0": SymExpr's canonical form, so the order
//               a request gives terms and factors in does not matter),
//               strides (SymExprs; a dim of static size 1 gets
//               stride 0, all strides of a tensor with a static 0 size are
//               0), alignment class (align16 when >= 16 bytes, else align<16)
//   symbols     per symbol in canonical numbering: max (inf when unbounded),
//               multiple_of (0 and 1 both mean 1). Symbols are numbered by
//               first appearance: inputs' sizes in input order, inputs'
//               strides, then node arguments and value sizes in canonical
//               node order. Declared but unused symbols are not part of it.
//   target      CPU triple, cpu and features (a set: split on ',', sorted,
//               deduplicated) or CUDA arch
//   options     the code-changing CompileOptions after NormalizeOptions:
//               fast_math, and for CUDA targets the matrix-product flags
//               (allow_tf32, strict_fp16_reduction, strict_bf16_reduction,
//               unfused_gemm_epilogues) and the convolution flags
//               (allow_tf32_convolution, deterministic_convolutions,
//               cudnn_benchmark; only
//               for graphs with a convolution) and deterministic_algorithms
//               (only for graphs with an accumulating scatter) when set,
//               so keys of
//               requests without them are those of earlier releases
// The key is SHA-256 over the length-prefixed component names and their
// hashes, in order.
//
// Renaming values or symbols, reordering symbol declarations or independent
// nodes, storage offsets, devices and alignment within its class keep the
// key; changing any guarded property changes it.
//
// Thread-safety: pure functions.
#ifndef KILN_GRAPH_GUARD_KEY_H_
#define KILN_GRAPH_GUARD_KEY_H_

#include <string>
#include <vector>

#include "graph/graph.h"
#include "kiln/v1/graph.pb.h"
#include "support/sha256.h"

namespace kiln {

using GuardKey = Sha256Digest;

struct KeyComponent {
  std::string name;       // "format", "graph", "input.0", ...
  std::string canonical;  // readable canonical encoding of the part
  Sha256Digest hash;      // SHA-256 of `canonical`
};

// `options` as they affect code for `target` and `graph`: options they
// ignore are cleared (the matrix-product flags on CPU targets, the
// convolution flags on CPU targets and for graphs without a convolution),
// so requests that differ only in those share a key and an artifact: a
// client that sends PyTorch's cuDNN flags with every CUDA graph keeps the
// keys of graphs without convolutions. ImportRequest keeps the normalized
// options; ExplainKey and ComputeGuardKey apply it themselves.
v1::CompileOptions NormalizeOptions(const v1::CompileOptions& options,
                                    const v1::Target& target,
                                    const Graph& graph);

// Components in key order.
std::vector<KeyComponent> ExplainKey(const Graph& graph,
                                     const v1::Target& target,
                                     const v1::CompileOptions& options);

GuardKey ComputeGuardKey(const Graph& graph, const v1::Target& target,
                         const v1::CompileOptions& options);

// The key from its components (what ComputeGuardKey does after ExplainKey).
GuardKey CombineKeyComponents(const std::vector<KeyComponent>& components);

}  // namespace kiln

#endif  // KILN_GRAPH_GUARD_KEY_H_
