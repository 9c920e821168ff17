// The fusion stage: LoopGraph -> FusedProgram (compiler/loop_ir.h).
//
// 1. Inlining: every pointwise node that is not a graph output is
//    substituted into its readers (vertical fusion; nothing is stored for
//    it). Reductions, scatters, inputs and outputs are materialised, and
//    so are extern calls' operands, the pointwise values an output reads
//    whole, and a pointwise value read by several nodes whose inlined
//    form reads more than 4 buffers or takes more than 30 operations
//    (Inductor's rule for reused values: computing it again in each
//    reader would repeat that work, and chains of them grow).
// 2. Kernels: nodes are visited in order; a reduction joins the previous
//    kernel when it reduces the same index space the same way and reads the
//    kernel's earlier reductions only for the current row (softmax's max
//    and sum, layer norm's mean and variance), or, with
//    FuseOptions::stores_into_reductions, when the previous kernel only
//    stores elements of its index space; an output joins it as an
//    epilogue when its shape is the kernel's full space (stored per inner
//    element) or its row space (stored once per row). Anything else starts
//    a kernel. A scatter stores its initial value like a pointwise node,
//    then adds its sources in a kernel of its own (Stage::kScatterAdd).
// 3. Buffers: reductions read only inside their kernel live in registers
//    (kAcc); the rest get a buffer. Loads become flat offsets.
//
// Thread-safety: pure function.
#ifndef KILN_COMPILER_FUSE_H_
#define KILN_COMPILER_FUSE_H_

#include "absl/status/statusor.h"
#include "compiler/loop_ir.h"

namespace kiln {

struct FuseOptions {
  // false: no fusion at all, one kernel per loop node (what eager execution
  // does); benchmarks compare against it.
  bool fuse = true;
  // A reduction may take over the kernel before it when that kernel only
  // stores elements of the reduction's index space (y = norm(x), then
  // sum(y * y)): the stores run per element inside the reduction's rows
  // (Stage::kStoreInner) and the reduction reads y in registers instead of
  // from memory. For GPUs, whose split reductions carry such stores
  // (split_reductions.h); a CPU runs each row on one thread, so a
  // reduction to few rows would serialise the elementwise work.
  bool stores_into_reductions = false;
};

absl::StatusOr<FusedProgram> Fuse(const LoopGraph& graph,
                                  const FuseOptions& options = {});

}  // namespace kiln

#endif  // KILN_COMPILER_FUSE_H_
