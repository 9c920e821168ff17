// What the CPU and GPU code generators share: LLVM IR for the loop IR's
// scalar expressions (every ExprOp on every dtype, float16/bfloat16 storage,
// PyTorch's integer division and NaN rules), reduction identities, loads and
// stores of buffer elements, the loops of a kernel and the walk over its
// stages.
//
// A code generator derives one emitter per kernel kind from
// KernelEmitterBase and decides the iteration structure: it sets vars_ (the
// index vars of the kernel) and acc_value_ (finished reductions of the row)
// and calls EmitExpr. Values are memoised per scope (memo_ is a stack; a
// loop body or a vector lane pushes a scope) so a subexpression is computed
// once where it is valid.
//
// Math functions are emitted as LLVM intrinsics (llvm.sin, llvm.exp, ...)
// and libm names (expm1f, tanhf, ...); the CPU back end maps them to
// libm/libmvec, the NVPTX back end to libdevice (cuda_backend.h).
//
// Thread-safety: one emitter per kernel, used by one thread.
#ifndef KILN_COMPILER_KERNEL_EMITTER_H_
#define KILN_COMPILER_KERNEL_EMITTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/loop_ir.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"

namespace kiln {

// Whether every value of `e` is a bfloat16 value: a float32 whose low 16
// bits are zero (NaNs included). Loads of bfloat16 and roundings to it are;
// negation, absolute value, relu, max, min and selection keep it; so do
// constants bfloat16 holds. Rounding such a value to bfloat16 changes
// nothing, so EmitExpr skips it, and the CPU stores it as its high half
// (codegen_cpu.cc; bench/README.md, session 37).
bool IsBfloat16Exact(const Expr& e);

// The module "kiln_kernels" that both code generators return: kernel k of
// `num_kernels` emitted by emit_kernel(module, k), in order, then the whole
// module verified (INTERNAL when LLVM rejects it). The first error of
// emit_kernel is returned as is.
absl::StatusOr<std::unique_ptr<llvm::Module>> EmitKernelModule(
    llvm::LLVMContext& context, size_t num_kernels,
    const std::function<absl::Status(llvm::Module&, size_t)>& emit_kernel);

class KernelEmitterBase {
 public:
  virtual ~KernelEmitterBase() = default;

 protected:
  using Value = llvm::Value;

  KernelEmitterBase(llvm::Module& module, const FusedProgram& program,
                    const Kernel& kernel, bool fast_math,
                    std::string backend_name);

  // With fast_math, the flags every float operation gets: reassociation,
  // contraction (FMA), approximate functions and reciprocals. NaN and Inf
  // semantics are kept (no nnan/ninf), so isnan and NaN-propagating max/min
  // stay correct. No-op without fast_math.
  void ApplyFastMathFlags();

  // A scatter kernel (Kernel::is_scatter) adds at clamped indices, which
  // still name element 0 of an empty target: the condition that its target
  // buffer has elements, or null where that is static. The code generators
  // skip the access (not the index checks) where it does not hold.
  Value* ScatterTargetNonEmpty();

  // Returns from the kernel function and verifies it: INTERNAL naming the
  // kernel when LLVM rejects it, else the first error met while emitting.
  // A kernel with index checks first writes the last violation it met to
  // the error word (EmitCheck).
  absl::Status FinishFunction();

  // ---- loops and stages ----
  // The blocks and induction variable of a loop, by name.
  struct LoopNames {
    std::string header, body, exit, var;
  };
  // The loop every loop of a kernel is built from, in SSA form:
  //   header: var = phi(lo, next); var < hi (signed or unsigned) ? body : exit
  //   body:   next = body(var), in its own memo scope; back to header
  // The three blocks are created in that order, before any code; `next` is
  // what body() returns, coming from the block the body ends in. Leaves the
  // builder in the exit block and returns the back edge's branch.
  llvm::BranchInst* EmitLoopSkeleton(Value* lo, Value* hi, bool is_signed,
                                     const LoopNames& names,
                                     const std::function<Value*(Value*)>& body);
  // for (i = lo; i < hi; ++i) body(i), in SSA form; the body gets its own
  // memo scope. With unroll = false the loop carries llvm.loop metadata
  // that keeps LLVM (and ptxas, through PTX's nounroll pragma) from
  // unrolling it.
  void EmitLoop(Value* lo, Value* hi, const std::string& name,
                const std::function<void(Value*)>& body, bool unroll = true);
  // Nested loops over the inner dims (outermost first).
  void EmitInnerNest(size_t k, const std::function<void()>& body);
  // Sets the outer vars from a flat row-major index over the outer dims,
  // leaving the last `skip_last` outer dims unset.
  void DecomposeOuter(Value* flat, size_t skip_last);
  // Fills dim_size_, vars_, outer_dims_, inner_dims_ and the accumulator
  // slots from the kernel (after base_ and syms_ are set).
  void SetUpKernelDims();
  // The kernel's stages in order, stopping at the first error (status_):
  // reduce(stage, slot) for a reduction, `slot` numbering the reductions in
  // order (acc_value_), and store(stage, index in kernel_.stages) for a
  // store.
  void ForEachStage(const std::function<void(const Stage&, int)>& reduce,
                    const std::function<void(const Stage&, size_t)>& store);

  // ---- reductions ----
  Value* Reassoc(Value* v);
  // Row-major position within the inner dims (argmax's answer).
  Value* InnerPosition();
  Value* InitValue(ReduceKind k, DType dtype);
  // One accumulation step acc (+) v. For argmax/argmin, `*take` is set to
  // whether v replaces acc (the caller tracks positions).
  Value* CombineStep(ReduceKind k, DType dtype, Value* acc, Value* v,
                     Value** take);

  // ---- types and memory ----
  llvm::Type* TypeOf(DType d);
  llvm::Type* StorageType(DType d);
  // Called on every load and store of buffer slot `slot` (alias scopes).
  virtual void TagAccess(llvm::Instruction* inst, int slot) {}
  Value* LoadElement(int slot, Value* offset, DType d);
  void StoreElement(int slot, Value* offset, Value* v, DType d);
  // Storage bits <-> computation values (float16/bfloat16 bits, bool bytes).
  Value* FromStorage(Value* raw, DType d);
  Value* ToStorage(Value* v, DType d);
  // IEEE half <-> float with integer ops (support/half.h has the same
  // algorithms in C++; the reference evaluator uses those). A back end
  // whose target converts in hardware overrides them with the same values
  // (NaN payloads aside): the CUDA emitter with one cvt each, the CPU one
  // with fpext/fptrunc where the target has F16C.
  virtual Value* HalfBitsToFloat(Value* h16);
  virtual Value* FloatToHalfBits(Value* f);
  virtual Value* BFloat16BitsToFloat(Value* h16);
  virtual Value* FloatToBFloat16Bits(Value* f);
  // Rounds a float32 value to what `d` can hold (float16/bfloat16).
  Value* RoundFloat(Value* v, DType d);
  // Converts a value of dtype `from` to dtype `to` (a cast's semantics).
  Value* ConvertValue(Value* v, DType from, DType to);

  // A row's finished reduction: acc_value_[slot] = v, of dtype `d`. Every
  // memoised value that read the slot's previous value (the raw
  // accumulator, which the stage's finalize expression reads) is
  // forgotten, so that later readers of the slot see `v`.
  void SetAccValue(int slot, Value* v, DType d);

  // ---- expressions ----
  Value* Lookup(const Expr& e);
  Value* EmitExpr(const Expr& e);
  // kLoadBuffer; a GPU emitter overrides it for vector loads.
  virtual Value* EmitLoadBuffer(const Expr& e);
  llvm::Function* Intrinsic(llvm::Intrinsic::ID id, llvm::Type* t);
  Value* Call1(llvm::Intrinsic::ID id, Value* x);
  Value* LibM(const char* name, std::initializer_list<Value*> args);
  Value* F(double v);
  // exp(x) (ExprOp::kExp): LLVM's intrinsic (libdevice's on CUDA). The CPU
  // emitter computes float32 inline instead of libmvec's.
  virtual Value* Exp(Value* x) { return Call1(llvm::Intrinsic::exp, x); }
  Value* EmitUncached(const Expr& e);
  Value* EmitUnary(ExprOp op, Value* x, DType in, DType out);
  Value* EmitBinary(ExprOp op, Value* a, Value* b, DType in, DType out);
  Value* NanPropagate(Value* r, Value* a, Value* b);
  Value* EmitFloatBinary(ExprOp op, Value* a, Value* b, DType out);
  Value* EmitIntBinary(ExprOp op, Value* a, Value* b, DType in, DType out);
  // ExprOp::kPhilox: the ten rounds of support/philox.h inline on i32
  // values (32x32->64 products), word `word` zero-extended to i64.
  Value* EmitPhilox(Value* seed, Value* offset, Value* index, int word);
  // ExprOp::kCheck (loop_ir.h, IndexCheck): the checked value. Per check
  // site the kernel keeps two locals, whether an index failed (an or) and
  // the largest failing index (a max), reductions the loop vectoriser
  // takes, so the common path costs a compare, an or, a select and a max
  // per index read and no branch. FinishFunction writes each site that
  // failed to the error word once: a compare-and-swap of word[0] from 0 to
  // site + 1 (the first writer wins) and, when it wins, word[1] = that
  // index and word[2] = the site's size.
  Value* EmitCheck(const Expr& e);
  void EmitErrorFlush();
  // i64 kiln_ipow(i64 base, i64 exp): wrapping; negative exponents give
  // 1, -1 or 0 as the reference does.
  llvm::Function* IntPowFunction();

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const FusedProgram& program_;
  const Kernel& kernel_;
  const bool fast_math_;
  const std::string backend_name_;  // for error messages
  llvm::Function* fn_ = nullptr;
  llvm::BasicBlock* entry_ = nullptr;
  std::vector<Value*> base_, syms_, dim_size_, vars_, acc_value_;
  std::vector<DType> acc_dtype_;  // dtype of acc_value_[slot]
  // The index checks' locals per site, in first-use order, and the error
  // word's slot (-1: the kernel has no check).
  struct ErrorSite {
    int site = 0;
    llvm::AllocaInst* seen = nullptr;   // i32: some index failed
    llvm::AllocaInst* index = nullptr;  // i64: the largest that failed
  };
  std::vector<ErrorSite> err_sites_;
  int err_slot_ = -1;
  std::vector<int> outer_dims_, inner_dims_;
  std::vector<absl::flat_hash_map<const ExprNode*, Value*>> memo_;
  std::vector<Expr> keep_alive_;
  absl::Status status_;
};

}  // namespace kiln

#endif  // KILN_COMPILER_KERNEL_EMITTER_H_
