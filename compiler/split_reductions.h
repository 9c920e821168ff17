// Compiler stage (CUDA targets; CPU targets only in tests, see CompileEnv),
// between fusion and code generation: a row kernel with few, long rows is
// split in two kernels, so the GPU is not left
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
// reductions (not a reduction of another's result) and row stores only (the
// reductions are moved ahead of the stores, which fusion interleaves for
// several outputs of the same rows), and ChooseReductionSplits
// (gpu_launch.h) picks S >= 2 for its rows and row length. An argmax/argmin's
// partial is a pair, the chunk's extreme and its position in the row (two temp
// buffers); the combining kernel's argmax over the S extremes picks the first
// chunk holding the row's extreme, and loads its position.
//
// One-pass moments. A row kernel whose only multi-pass reductions are
// centered second moments -- a kSum of (e - A)^2 (as (e - A) * (e - A) or
// pow(e - A, 2)) where A is an earlier kSum of the same e finalized as
// sum / row length: var, std, layer norm's variance -- is split so that the
// row is read once for its statistics, when its rows cut into S chunks of
// C <= kMaxPersistentRow elements (the persistent form keeps a chunk in
// registers):
//
//   kiln_kN_partial  rows x S blocks; block (row, c) runs the kernel's
//                    reductions, two-level as they are, over chunk c: the
//                    chunk's mean m_c = sum_c / C, then M2_c = the sum of
//                    (e - m_c)^2 from registers; stores m_c and M2_c (and
//                    the raw partial accumulator of any other reduction)
//                    to temps of rows * S values (float32)
//   kiln_kN          one row of S partials per row: mean = (sum m_c) / S,
//                    M2 = sum (M2_c + C * (m_c - mean)^2) (Chan et al.'s
//                    pairwise update for equal counts, which is exact
//                    algebra, robust like Welford: no E[x^2] - E[x]^2
//                    cancellation), then the original finalizes
//                    (var = M2 / max(0, n - correction), ...) and row
//                    stores; with element stores, also the finalized row
//                    results to temps of one value per row
//   kiln_kN_fp       element stores (layer norm's output) as a pointwise
//                    kernel, reading the row results: layer norm reads x
//                    twice in all (statistics, then the normalisation)
//
// Any other multi-pass row kernel with such rows (softmax, log-softmax: the
// sum of exp(x - max); element stores of row results), or a moment whose
// rows do not cut into such chunks, is fissioned, then each part split:
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
