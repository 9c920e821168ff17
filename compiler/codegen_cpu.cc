#include "compiler/codegen_cpu.h"

#include <cmath>
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "compiler/kernel_emitter.h"
#include "graph/host_tensor.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/ModRef.h"

namespace kiln {
namespace {

using llvm::IRBuilder;
using llvm::Value;

// Emits one kernel function.
class CpuKernelEmitter : public KernelEmitterBase {
 public:
  CpuKernelEmitter(llvm::Module& module, const FusedProgram& program,
                   const Kernel& kernel, const CpuCodegenOptions& options)
      : KernelEmitterBase(module, program, kernel, options.fast_math, "CPU") {}

  absl::Status Emit() {
    llvm::Type* ptr = llvm::PointerType::get(ctx_, 0);
    llvm::Type* i64 = b_.getInt64Ty();
    auto* fn_type =
        llvm::FunctionType::get(b_.getVoidTy(), {ptr, ptr, i64, i64}, false);
    fn_ = llvm::Function::Create(fn_type, llvm::Function::ExternalLinkage,
                                 kernel_.name, m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    auto args = fn_->arg_begin();
    Value* buffers = &*args++;
    Value* symbols = &*args++;
    Value* start = &*args++;
    Value* end = &*args++;
    buffers->setName("buffers");
    symbols->setName("symbols");
    start->setName("start");
    end->setName("end");
    entry_ = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry_);
    ApplyFastMathFlags();
    for (size_t s = 0; s < kernel_.buffers.size(); ++s) {
      Value* slot = b_.CreateInBoundsGEP(ptr, buffers, b_.getInt64(s));
      base_.push_back(b_.CreateLoad(ptr, slot, absl::StrCat("buf", s)));
    }
    MakeAliasScopes();
    for (size_t s = 0; s < program_.symbol_names.size(); ++s) {
      Value* slot = b_.CreateInBoundsGEP(i64, symbols, b_.getInt64(s));
      syms_.push_back(b_.CreateLoad(i64, slot, program_.symbol_names[s]));
    }
    SetUpKernelDims();
    if (kernel_.is_scatter()) scatter_nonempty_ = ScatterTargetNonEmpty();
    if (kernel_.is_scatter() && !inner_dims_.empty()) {
      // In source order: each inner position over the chunk's outer
      // positions, which own disjoint elements (Stage::kScatterAdd,
      // kScatterStore).
      EmitInnerNest(0, [&] { EmitPointwiseKernel(start, end); });
    } else if (inner_dims_.empty()) {
      EmitPointwiseKernel(start, end);
    } else {
      EmitRowKernel(start, end);
    }
    return FinishFunction();
  }

 private:
  // Pointwise: runs along the innermost dim, each a counted loop.
  void EmitPointwiseKernel(Value* start, Value* end) {
    if (outer_dims_.empty()) {  // a 0-d output: one element
      auto* body = llvm::BasicBlock::Create(ctx_, "scalar", fn_);
      auto* done = llvm::BasicBlock::Create(ctx_, "done", fn_);
      b_.CreateCondBr(b_.CreateICmpSLT(start, end), body, done);
      b_.SetInsertPoint(body);
      memo_.emplace_back();
      EmitStages();
      memo_.pop_back();
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
      return;
    }
    const int last = outer_dims_.back();
    Value* last_size = dim_size_[last];
    // for (f = start; f < end; f += n) { decompose f;
    //   n = min(size_last - i_last, end - f); ... }
    EmitLoopSkeleton(
        start, end, /*is_signed=*/true,
        {"run.header", "run.body", "run.exit", "f"}, [&](Value* f) {
          Value* first = b_.CreateSRem(f, last_size, "i_last");
          DecomposeOuter(b_.CreateSDiv(f, last_size), 1);
          // The rest of the decomposition used the quotient as the flat index
          // of the dims before `last`.
          Value* n = b_.CreateSub(last_size, first);
          Value* left = b_.CreateSub(end, f);
          n = b_.CreateSelect(b_.CreateICmpSLT(left, n), left, n, "run.len");
          EmitLoop(b_.getInt64(0), n, "j", [&](Value* j) {
            vars_[last] = b_.CreateAdd(first, j, "v_last", true, true);
            EmitStages();
          });
          return b_.CreateAdd(f, n);
        });
  }

  // Row kernels: for each row in [start, end), the stages in order.
  void EmitRowKernel(Value* start, Value* end) {
    EmitLoop(start, end, "row", [&](Value* row) {
      DecomposeOuter(row, 0);
      EmitStages();
    });
  }

  void EmitStages() {
    ForEachStage([&](const Stage& st, int slot) { EmitReduce(st, slot); },
                 [&](const Stage& st, size_t) {
                   if (st.kind == Stage::Kind::kStoreInner) {
                     EmitInnerNest(0, [&] { EmitStore(st); });
                   } else {
                     EmitStore(st);
                   }
                 });
  }

  // ---- stages ----

  void EmitStore(const Stage& st) {
    Value* v = EmitExpr(st.value);
    v = ConvertValue(v, st.value->dtype, st.store_dtype);
    Value* off = EmitExpr(st.offset);
    if (!kernel_.is_scatter()) {
      StoreElement(st.buffer_slot, off, v, st.store_dtype);
      return;
    }
    // A scatter: its indices are checked (above, in the offset) even where
    // its target is empty; only the access is skipped there.
    llvm::BasicBlock* done = nullptr;
    if (scatter_nonempty_ != nullptr) {
      auto* store = llvm::BasicBlock::Create(ctx_, "scatter.store", fn_);
      done = llvm::BasicBlock::Create(ctx_, "scatter.done", fn_);
      b_.CreateCondBr(scatter_nonempty_, store, done);
      b_.SetInsertPoint(store);
    }
    if (st.kind == Stage::Kind::kScatterAdd) {
      Value* old = LoadElement(st.buffer_slot, off, st.store_dtype);
      v = EmitBinary(ExprOp::kAdd, old, v, st.store_dtype, st.store_dtype);
    }
    StoreElement(st.buffer_slot, off, v, st.store_dtype);
    if (done != nullptr) {
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
    }
  }

  void EmitReduce(const Stage& st, int slot) {
    const bool is_arg = IsArgReduce(st.reduce);
    const DType vdtype = is_arg ? st.value->dtype : st.acc_dtype;
    llvm::Type* ty = TypeOf(vdtype);
    // Accumulators live in allocas in the entry block; SROA makes them SSA.
    llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
    b_.SetInsertPoint(entry_, entry_->begin());
    llvm::AllocaInst* acc =
        b_.CreateAlloca(ty, nullptr, absl::StrCat("acc", slot));
    llvm::AllocaInst* pos =
        is_arg ? b_.CreateAlloca(b_.getInt64Ty(), nullptr, "argpos") : nullptr;
    b_.restoreIP(saved);
    b_.CreateStore(InitValue(st.reduce, vdtype), acc);
    if (pos) b_.CreateStore(b_.getInt64(0), pos);
    EmitInnerNest(0, [&] {
      Value* v = ConvertValue(EmitExpr(st.value), st.value->dtype, vdtype);
      Value* a = b_.CreateLoad(ty, acc);
      Value* take = nullptr;
      Value* next = CombineStep(st.reduce, vdtype, a, v, &take);
      if (pos) {
        b_.CreateStore(b_.CreateSelect(take, InnerPosition(),
                                       b_.CreateLoad(b_.getInt64Ty(), pos)),
                       pos);
      }
      b_.CreateStore(next, acc);
    });
    Value* result =
        is_arg ? static_cast<Value*>(b_.CreateLoad(b_.getInt64Ty(), pos))
               : static_cast<Value*>(b_.CreateLoad(ty, acc));
    // Readers see the node's dtype; the accumulator may be wider (int64
    // sums of int32) or a position (argmax).
    SetAccValue(slot, result, is_arg ? DType::kInt64 : st.acc_dtype);
    if (st.finalize)
      SetAccValue(slot, EmitExpr(st.finalize), st.finalize->dtype);
    // Anything computed from this row's accumulators is row-local.
    memo_.back().clear();
  }

  // are only read), so accesses through different slots never alias. Saying
  // so spares the vectoriser its runtime overlap checks.
  void MakeAliasScopes() {
    llvm::MDBuilder md(ctx_);
    llvm::MDNode* domain = md.createAnonymousAliasScopeDomain(kernel_.name);
    std::vector<llvm::Metadata*> scopes;
    for (size_t s = 0; s < kernel_.buffers.size(); ++s) {
      scopes.push_back(
          md.createAnonymousAliasScope(domain, absl::StrCat("slot", s)));
    }
    for (size_t s = 0; s < scopes.size(); ++s) {
      std::vector<llvm::Metadata*> others;
      for (size_t o = 0; o < scopes.size(); ++o) {
        if (o != s) others.push_back(scopes[o]);
      }
      scope_md_.push_back(llvm::MDNode::get(ctx_, {scopes[s]}));
      noalias_md_.push_back(llvm::MDNode::get(ctx_, others));
    }
  }

  void TagAccess(llvm::Instruction* inst, int slot) override {
    inst->setMetadata(llvm::LLVMContext::MD_alias_scope, scope_md_[slot]);
    inst->setMetadata(llvm::LLVMContext::MD_noalias, noalias_md_[slot]);
  }

  std::vector<llvm::MDNode*> scope_md_, noalias_md_;
  // A scatter kernel's ScatterTargetNonEmpty (entry block), or null.
  Value* scatter_nonempty_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<llvm::Module>> EmitCpuModule(
    const FusedProgram& program, llvm::LLVMContext& context,
    const CpuCodegenOptions& options) {
  return EmitKernelModule(
      context, program.kernels.size(), [&](llvm::Module& module, size_t k) {
        if (program.kernels[k].is_extern()) return absl::OkStatus();
        return CpuKernelEmitter(module, program, program.kernels[k], options)
            .Emit();
      });
}

}  // namespace kiln
