#include "compiler/promote_half.h"

#include <vector>

#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/Intrinsics.h"

namespace kiln {
namespace {

bool IsHalf(const llvm::Type* type) {
  return type->getScalarType()->isHalfTy();
}

// The intrinsics whose float16 form x86 computes one lane at a time and
// whose float32 form rounded to float16 is exact (promote_half.h).
bool IsPromotedIntrinsic(llvm::Intrinsic::ID id) {
  switch (id) {
    case llvm::Intrinsic::fabs:
    case llvm::Intrinsic::copysign:
    case llvm::Intrinsic::minnum:
    case llvm::Intrinsic::maxnum:
    case llvm::Intrinsic::floor:
    case llvm::Intrinsic::ceil:
    case llvm::Intrinsic::trunc:
    case llvm::Intrinsic::rint:
    case llvm::Intrinsic::nearbyint:
    case llvm::Intrinsic::round:
    case llvm::Intrinsic::roundeven:
    case llvm::Intrinsic::sqrt:
      return true;
    default:
      return false;
  }
}

// Whether `inst` is one PromoteHalfOperations rewrites.
bool IsPromoted(const llvm::Instruction& inst) {
  if (const auto* cmp = llvm::dyn_cast<llvm::FCmpInst>(&inst))
    return IsHalf(cmp->getOperand(0)->getType());
  if (!IsHalf(inst.getType())) return false;
  if (inst.getOpcode() == llvm::Instruction::FNeg ||
      inst.getOpcode() == llvm::Instruction::FRem) {
    return true;
  }
  const auto* call = llvm::dyn_cast<llvm::IntrinsicInst>(&inst);
  return call != nullptr && IsPromotedIntrinsic(call->getIntrinsicID());
}

// `inst` computed on its operands widened to float32.
llvm::Value* Promote(llvm::Instruction& inst) {
  llvm::IRBuilder<> b(&inst);
  if (llvm::isa<llvm::FPMathOperator>(inst))
    b.setFastMathFlags(inst.getFastMathFlags());
  llvm::Type* wide =
      inst.getOperand(0)->getType()->getWithNewType(b.getFloatTy());
  auto widen = [&](llvm::Value* v) { return b.CreateFPExt(v, wide); };
  if (auto* cmp = llvm::dyn_cast<llvm::FCmpInst>(&inst)) {
    return b.CreateFCmp(cmp->getPredicate(), widen(cmp->getOperand(0)),
                        widen(cmp->getOperand(1)));
  }
  llvm::Value* result = nullptr;
  if (inst.getOpcode() == llvm::Instruction::FNeg) {
    result = b.CreateFNeg(widen(inst.getOperand(0)));
  } else if (inst.getOpcode() == llvm::Instruction::FRem) {
    result = b.CreateFRem(widen(inst.getOperand(0)), widen(inst.getOperand(1)));
  } else {
    auto& call = llvm::cast<llvm::IntrinsicInst>(inst);
    std::vector<llvm::Value*> args;
    for (llvm::Value* arg : call.args()) args.push_back(widen(arg));
    result = b.CreateIntrinsic(call.getIntrinsicID(), {wide}, args);
  }
  return b.CreateFPTrunc(result, inst.getType());
}

}  // namespace

int PromoteHalfOperations(llvm::Function& function) {
  std::vector<llvm::Instruction*> found;
  for (llvm::Instruction& inst : llvm::instructions(function))
    if (IsPromoted(inst)) found.push_back(&inst);
  for (llvm::Instruction* inst : found) {
    llvm::Value* promoted = Promote(*inst);
    promoted->takeName(inst);
    inst->replaceAllUsesWith(promoted);
    inst->eraseFromParent();
  }
  return static_cast<int>(found.size());
}

llvm::PreservedAnalyses PromoteHalfPass::run(
    llvm::Function& function, llvm::FunctionAnalysisManager& /*analyses*/) {
  if (PromoteHalfOperations(function) == 0)
    return llvm::PreservedAnalyses::all();
  llvm::PreservedAnalyses kept;
  kept.preserveSet<llvm::CFGAnalyses>();
  return kept;
}

}  // namespace kiln
