// An LLVM function pass for x86 CPUs without AVX512-FP16 (every x86-64-v4
// CPU before Sapphire Rapids, and the x86-64-v4 level itself): it computes
// float16 compares, min/max, negation, absolute value, rounding and square
// roots in float32.
//
// Why: Kiln's CPU kernels compute float16 values in float32 (fpext ...
// fptrunc), but InstCombine narrows `fcmp (fpext a), (fpext b)`,
// `fptrunc (maxnum (fpext a), (fpext b))` and the like back to float16
// operations where that is exact. X86's back end promotes float16 fadd,
// fsub, fmul and fdiv vectors to float32 with F16C, but computes every other
// float16 vector operation one lane at a time (an fcmp of <16 x half> is 16
// scalar compares), and the loop vectoriser's cost model, seeing that,
// vectorises such loops narrowly or not at all (session 37: a float16 relu
// 11x slower than Inductor's).
//
// The rewrite is exact: float32 holds every float16 value, and each listed
// operation's float32 result rounded to float16 is the float16 result
// (compares, min/max, negation, fabs, copysign and rounding to an integer
// are exact in float32; sqrt and frem round once more, which float32's
// 24-bit significand makes harmless, the reason InstCombine may narrow them).
//
// OptimizeModule (cpu_backend.h) runs it twice: before the loop vectoriser,
// so its cost model sees float32 operations, and at the end of the pipeline,
// after the InstCombine that narrows the vectorised operations again.
//
// Thread-safety: a pure function of the function it runs on.
#ifndef KILN_COMPILER_PROMOTE_HALF_H_
#define KILN_COMPILER_PROMOTE_HALF_H_

#include "llvm/IR/Function.h"
#include "llvm/IR/PassManager.h"

namespace kiln {

// Rewrites each float16 (scalar or vector) fcmp, fneg, frem and call of
// llvm.{fabs, copysign, minnum, maxnum, floor, ceil,
// trunc, rint, nearbyint, round, roundeven, sqrt} in `function` as the same
// operation on float32 operands (fpext), its float result truncated back
// (fptrunc); fast-math flags are kept. Returns how many it rewrote.
int PromoteHalfOperations(llvm::Function& function);

// PromoteHalfOperations as a new-pass-manager function pass.
class PromoteHalfPass : public llvm::PassInfoMixin<PromoteHalfPass> {
 public:
  llvm::PreservedAnalyses run(llvm::Function& function,
                              llvm::FunctionAnalysisManager& analyses);
};

}  // namespace kiln

#endif  // KILN_COMPILER_PROMOTE_HALF_H_
