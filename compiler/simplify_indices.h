#ifndef KILN_COMPILER_SIMPLIFY_INDICES_H_
#define KILN_COMPILER_SIMPLIFY_INDICES_H_

#include "compiler/loop_ir.h"

namespace kiln {

// Compiler stage, after fusion and reduction splits, before code
// generation: each generated kernel's index arithmetic simplified with the
// ranges of its static dims (ir::SimplifyIndex). A view that splits and
// merges dims (a group norm's (N, C, H, W) as (N, G, C/G*H*W)) and a split
// reduction's flat chunk of a tensor index every element through divisions
// and remainders of a flat position; most cancel once the ranges are
// known: floor((v0*25088 + v1) / 802816) with v1 < 25088 is floor(v0 / 32),
// a statistic's index that was computed per element becomes one per row,
// and the element's own offset becomes affine (a vector load). Values are
// unchanged for every index within the dims. Kernels with a symbolic dim
// keep their other dims' ranges; extern calls pass through.
FusedProgram SimplifyIndices(FusedProgram program);

}  // namespace kiln

#endif  // KILN_COMPILER_SIMPLIFY_INDICES_H_
