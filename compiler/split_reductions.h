// Compiler stage (CUDA only), between fusion and code generation: a row
// kernel with few, long rows is split in two kernels, so the GPU is not left
// with a handful of blocks (a full `x.sum()` over 2^26 elements is one row:
// one block of the looped-row form would run on one SM of 132).
//
//   kiln_kN_partial  rows x S blocks; block (row, s) reduces elements
//                    [s*C, (s+1)*C) of its row (C = L / S) into a temp
//                    buffer of rows*S accumulators (the accumulator dtype)
//   kiln_kN          one row of S partial accumulators per row: combines
//                    them with the same reduction, then runs the original
//                    kernel's finalize and row stores
//
// A kernel is split when its dims are static, its stages are independent
// reductions (not a reduction of another's result) followed by row stores
// only, and
// ChooseReductionSplits (gpu_launch.h) picks S >= 2 for its rows and row
// length. An argmax/argmin's partial is a pair, the chunk's extreme and its
// position in the row (two temp buffers); the combining kernel's argmax
// over the S extremes picks the first chunk holding the row's extreme, and
// loads its position.
//
// A multi-pass row kernel with such rows (var: a sum of squares around the
// mean; softmax, log-softmax, layer norm: element stores of row results) is
// first fissioned, then each part split:
//
//   kiln_kN_fL   the reductions of level L (L = 0: over the inputs; L > 0:
//                over what earlier levels finalized, read back from temp
//                buffers of one value per row), storing their finalized
//                results per row; the last level also does the row stores
//   kiln_kN_fp   the element stores, as a pointwise kernel
//
// Each part re-reads the row (3 passes for softmax instead of the one a
// row kept in registers takes), but fills the GPU where the kernel as it
// was runs one block per row. Multi-pass kernels with argmax/argmin are left
// as they are.
// The result computes the same values up to the reassociation of the
// reduction (as a multi-threaded row already does).
//
// Thread-safety: a pure function.
#ifndef KILN_COMPILER_SPLIT_REDUCTIONS_H_
#define KILN_COMPILER_SPLIT_REDUCTIONS_H_

#include "compiler/loop_ir.h"

namespace kiln {

FusedProgram SplitLongReductions(FusedProgram program);

}  // namespace kiln

#endif  // KILN_COMPILER_SPLIT_REDUCTIONS_H_
