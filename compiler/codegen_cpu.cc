#include "compiler/codegen_cpu.h"

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/kernel_emitter.h"
#include "graph/host_tensor.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/MDBuilder.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/ModRef.h"
#include "support/half.h"

namespace kiln {
namespace {

using llvm::IRBuilder;
using llvm::Value;

// Rows of a block (EmitBlockedRowKernel): a multiple of every vector width,
// small enough that a block's accumulators stay in L1.
constexpr int64_t kRowBlock = 64;

// Whether `e` reads index var `v`.
bool ReadsVar(const Expr& e, int v) {
  if (!e) return false;
  if (e->op == ExprOp::kVar && e->index == v) return true;
  for (const Expr& a : e->args)
    if (ReadsVar(a, v)) return true;
  return false;
}

// Calls fn on every node of `e` (shared nodes once).
void ForEachNode(const Expr& e, absl::flat_hash_set<const ExprNode*>& seen,
                 const std::function<void(const ExprNode&)>& fn) {
  if (!e || !seen.insert(e.get()).second) return;
  fn(*e);
  for (const Expr& a : e->args) ForEachNode(a, seen, fn);
}

// Whether a row kernel's loads run along its last outer dim rather than its
// last inner dim: a column reduction (a bias or layer norm weight gradient,
// sum over the rows of a [rows, columns] tensor for each column) reads its
// inner dims at a stride and its outer dim contiguously. Its rows are then
// better walked a block at a time (EmitBlockedRowKernel), the block's
// positions innermost, where the loop vectoriser sees unit strides; the
// row-at-a-time walk would reduce each column with strided scalar loads.
// Counted over the loads that move with the inner dims (in reductions and
// inner stores) and the inner stores' own offsets.
bool PrefersRowBlocks(const Kernel& k) {
  if (k.is_scatter() || k.dims.empty()) return false;
  int last_inner = -1, last_outer = -1;
  for (size_t d = 0; d < k.dims.size(); ++d)
    (k.inner[d] ? last_inner : last_outer) = static_cast<int>(d);
  if (last_inner < 0 || last_outer < 0) return false;
  // Short rows of blocks are not worth it.
  if (std::optional<int64_t> n = k.dims[last_outer].AsConstant();
      n.has_value() && *n < 8) {
    return false;
  }
  const int num_vars = static_cast<int>(k.dims.size());
  const SymExpr one(1);
  int along_inner = 0, along_outer = 0;
  auto count = [&](const Expr& offset) {
    std::optional<ir::AffineForm> f = ir::Affine(offset, num_vars);
    if (!f.has_value()) return;
    bool moves_inner = false;
    for (size_t d = 0; d < k.dims.size(); ++d)
      if (k.inner[d] && f->coeffs[d] != SymExpr(0)) moves_inner = true;
    if (!moves_inner) return;
    if (f->coeffs[last_inner] == one) {
      ++along_inner;
    } else if (f->coeffs[last_outer] == one) {
      ++along_outer;
    }
  };
  absl::flat_hash_set<const ExprNode*> seen;
  for (const Stage& st : k.stages) {
    if (st.kind == Stage::Kind::kReduce && IsArgReduce(st.reduce)) return false;
    if (st.kind == Stage::Kind::kStoreOuter) continue;
    ForEachNode(st.value, seen, [&](const ExprNode& e) {
      if (e.op == ExprOp::kLoadBuffer) count(e.args[0]);
    });
    if (st.kind == Stage::Kind::kStoreInner) count(st.offset);
  }
  return along_outer > along_inner;
}

// A pointwise kernel whose innermost index var L (static size N) is read
// through floordiv(L + r, d) and remainder(L + r, d) with constant
// divisors (a concatenation or a permutation of heads along a flattened
// dim: qkv's gradients into one [tokens, 3 * width] buffer) computes those
// per element, and its loads, no longer linear in L, are gathers. Splitting
// L into a * S + b with S the divisors' gcd (S | N, every r a multiple of
// S) makes each quotient constant along b and each remainder linear in it:
// floordiv(L + r, d) = floordiv(a * S + r, d) and remainder(L + r, d) =
// remainder(a * S + r, d) + b. Runs along b then load contiguously. Returns
// the kernel with dims [..., N / S, S], or nullopt where that does not
// apply. The flattened range (the kernel's ABI) is unchanged.
constexpr int64_t kMinSegment = 16;

std::optional<Kernel> SplitInnermostDim(const Kernel& k) {
  if (k.is_scatter() || k.dims.empty()) return std::nullopt;
  for (bool inner : k.inner)
    if (inner) return std::nullopt;
  const int last = static_cast<int>(k.dims.size()) - 1;
  const std::optional<int64_t> n = k.dims[last].AsConstant();
  if (!n.has_value()) return std::nullopt;
  // The divisors that L reaches.
  int64_t seg = 0;
  absl::flat_hash_set<const ExprNode*> seen;
  auto note = [&](const ExprNode& e) {
    if ((e.op != ExprOp::kFloorDiv && e.op != ExprOp::kRemainder) ||
        e.dtype != DType::kInt64 || !ReadsVar(e.args[0], last)) {
      return;
    }
    // Only the innermost: remainder(floordiv(L, 64), 3) is constant along
    // a segment once floordiv(L, 64) is.
    std::optional<ir::AffineForm> f = ir::Affine(e.args[0], last + 1);
    if (f.has_value() && f->coeffs[last] == SymExpr(0)) return;
    if (!f.has_value()) {
      bool nested = false;
      absl::flat_hash_set<const ExprNode*> below;
      ForEachNode(e.args[0], below, [&](const ExprNode& inner) {
        nested = nested || inner.op == ExprOp::kFloorDiv ||
                 inner.op == ExprOp::kRemainder;
      });
      if (nested) return;
    }
    const Expr& d = e.args[1];
    seg = d->op == ExprOp::kConst && d->i > 0 ? std::gcd(seg, d->i) : -1;
  };
  for (const Stage& st : k.stages) {
    if (seg < 0) break;
    ForEachNode(st.value, seen, note);
    ForEachNode(st.offset, seen, note);
  }
  if (seg < kMinSegment || seg >= *n || *n % seg != 0) return std::nullopt;
  // L = a * seg + b: a takes var `last`, b the new var `last + 1`.
  const int num_vars = last + 2;
  std::vector<Expr> vars;
  for (int v = 0; v < last; ++v) vars.push_back(ir::Var(v));
  vars.push_back(
      ir::Add(ir::Mul(ir::Var(last), ir::IntConst(seg)), ir::Var(last + 1)));
  // Every var as itself but b, which is 0.
  std::vector<Expr> b_at_zero;
  for (int v = 0; v <= last; ++v) b_at_zero.push_back(ir::Var(v));
  b_at_zero.push_back(ir::IntConst(0));
  bool ok = true;
  ir::Rewriter split([&](const Expr& e) -> std::optional<Expr> {
    if ((e->op != ExprOp::kFloorDiv && e->op != ExprOp::kRemainder) ||
        e->dtype != DType::kInt64 || !ReadsVar(e->args[0], last + 1)) {
      return std::nullopt;
    }
    // The argument: b plus a part that is a multiple of seg.
    std::optional<ir::AffineForm> f = ir::Affine(e->args[0], num_vars);
    bool aligned = f.has_value() && f->coeffs[last + 1] == SymExpr(1);
    if (aligned) {
      for (int v = 0; v <= last; ++v) {
        std::optional<int64_t> c = f->coeffs[v].AsConstant();
        aligned = aligned && c.has_value() && *c % seg == 0;
      }
      std::optional<int64_t> c = f->constant.AsConstant();
      aligned = aligned && c.has_value() && *c % seg == 0;
    }
    if (!aligned) {
      ok = false;
      return std::nullopt;
    }
    const Expr base = ir::SubstituteVars(e->args[0], b_at_zero);
    if (e->op == ExprOp::kFloorDiv) return ir::FloorDiv(base, e->args[1]);
    return ir::Add(ir::Mod(base, e->args[1]), ir::Var(last + 1));
  });
  Kernel out = k;
  out.dims[last] = SymExpr(*n / seg);
  out.dims.push_back(SymExpr(seg));
  out.inner.push_back(false);
  for (Stage& st : out.stages) {
    if (st.value) st.value = split.Run(ir::SubstituteVars(st.value, vars));
    if (st.offset) st.offset = split.Run(ir::SubstituteVars(st.offset, vars));
  }
  if (!ok) return std::nullopt;
  return out;
}

// ---- CoalesceDims: adjacent dims that every access walks as one ----
//
// A kernel's innermost loop runs along its last dim: a pointwise kernel
// over [N, C, 28, 28] runs 28 elements at a time, too short for LLVM's
// vectoriser (8 floats x 4), so a convolution net's pointwise and row
// kernels ran scalar. Where every offset reads two adjacent dims P and L
// of the same kind (outer or inner) only as c * (P * size(L) + L), and no
// value reads them otherwise (an iota, a mask, a Philox counter), the two
// are one dim W of size(P) * size(L): runs of 784 instead of 28, as
// PyTorch's TensorIterator coalesces dims. Codegen only: the flattened
// outer range (the kernel's ABI) is unchanged.

// e as signed additive terms (through add, sub and neg).
void AdditiveTerms(const Expr& e, int sign,
                   std::vector<std::pair<Expr, int>>& terms) {
  switch (e->op) {
    case ExprOp::kAdd:
      AdditiveTerms(e->args[0], sign, terms);
      AdditiveTerms(e->args[1], sign, terms);
      return;
    case ExprOp::kSub:
      AdditiveTerms(e->args[0], sign, terms);
      AdditiveTerms(e->args[1], -sign, terms);
      return;
    case ExprOp::kNeg:
      AdditiveTerms(e->args[0], -sign, terms);
      return;
    default:
      terms.push_back({e, sign});
  }
}

// An offset split into the terms that read P or L (summed as one affine
// form) and the rest (kept as expressions).
struct SplitOffset {
  ir::AffineForm pl;
  std::vector<std::pair<Expr, int>> rest;
};

std::optional<SplitOffset> SplitPL(const Expr& offset, int p, int l,
                                   int num_vars) {
  std::vector<std::pair<Expr, int>> terms;
  AdditiveTerms(offset, 1, terms);
  SplitOffset out;
  out.pl.coeffs.assign(num_vars, SymExpr(0));
  for (const auto& [term, sign] : terms) {
    if (!ReadsVar(term, p) && !ReadsVar(term, l)) {
      out.rest.push_back({term, sign});
      continue;
    }
    std::optional<ir::AffineForm> f = ir::Affine(term, num_vars);
    if (!f.has_value()) return std::nullopt;
    const SymExpr k(sign);
    out.pl.constant = out.pl.constant + k * f->constant;
    for (int v = 0; v < num_vars; ++v)
      out.pl.coeffs[v] = out.pl.coeffs[v] + k * f->coeffs[v];
  }
  return out;
}

// Whether dims p and l = p + 1 of k can be one (see above).
bool CanCoalesce(const Kernel& k, int p) {
  const int l = p + 1, num_vars = static_cast<int>(k.dims.size());
  bool ok = true;
  auto offset_ok = [&](const Expr& offset) {
    if (!ok || !offset) return;
    std::optional<SplitOffset> split = SplitPL(offset, p, l, num_vars);
    ok = split.has_value() &&
         split->pl.coeffs[p] == split->pl.coeffs[l] * k.dims[l];
  };
  absl::flat_hash_set<const ExprNode*> seen;
  std::function<void(const Expr&)> value_ok = [&](const Expr& e) {
    if (!ok || !e || !seen.insert(e.get()).second) return;
    if (e->op == ExprOp::kVar && (e->index == p || e->index == l)) {
      ok = false;
      return;
    }
    if (e->op == ExprOp::kLoadBuffer) {
      offset_ok(e->args[0]);
      return;
    }
    for (const Expr& a : e->args) value_ok(a);
  };
  for (const Stage& st : k.stages) {
    value_ok(st.value);
    value_ok(st.finalize);
    offset_ok(st.offset);
  }
  return ok;
}

// `offset` with P and L only as c * (P * size(L) + L) (CanCoalesce holds).
Expr CanonicalOffset(const Expr& offset, int p, int l, const SymExpr& size_l,
                     int num_vars) {
  std::optional<SplitOffset> split = SplitPL(offset, p, l, num_vars);
  Expr sum = ir::FromSym(split->pl.constant);
  auto add = [&](Expr term, int sign) {
    sum = ir::Add(sum, sign > 0 ? term : ir::Mul(term, ir::IntConst(-1)));
  };
  for (const auto& [term, sign] : split->rest) add(term, sign);
  for (int v = 0; v < num_vars; ++v) {
    if (v == p || v == l || split->pl.coeffs[v] == SymExpr(0)) continue;
    add(ir::Mul(ir::Var(v), ir::FromSym(split->pl.coeffs[v])), 1);
  }
  if (split->pl.coeffs[l] != SymExpr(0)) {
    add(ir::Mul(ir::Add(ir::Mul(ir::Var(p), ir::FromSym(size_l)), ir::Var(l)),
                ir::FromSym(split->pl.coeffs[l])),
        1);
  }
  return sum;
}

// k with dims p and p + 1 as one (CanCoalesce holds): offsets made
// canonical, then P = 0 and L = W (var p) substituted, which turns
// P * size(L) + L into W exactly; later vars move down by one.
Kernel Coalesce(const Kernel& k, int p) {
  const int l = p + 1, num_vars = static_cast<int>(k.dims.size());
  auto canonical_offset = [&](const Expr& offset) {
    if (!ReadsVar(offset, p) && !ReadsVar(offset, l)) return offset;
    return CanonicalOffset(offset, p, l, k.dims[l], num_vars);
  };
  ir::Rewriter canonical([&](const Expr& e) -> std::optional<Expr> {
    if (e->op != ExprOp::kLoadBuffer) return std::nullopt;
    const Expr offset = canonical_offset(e->args[0]);
    if (offset == e->args[0]) return std::nullopt;
    return ir::LoadBuffer(e->index, offset, e->dtype);
  });
  std::vector<Expr> vars;
  for (int v = 0; v < num_vars; ++v) {
    vars.push_back(v == p   ? ir::IntConst(0)
                   : v == l ? ir::Var(p)
                   : v > l  ? ir::Var(v - 1)
                            : ir::Var(v));
  }
  auto rewrite = [&](const Expr& e) {
    return e ? ir::SubstituteVars(canonical.Run(e), vars) : e;
  };
  Kernel out = k;
  out.dims[p] = k.dims[p] * k.dims[l];
  out.dims.erase(out.dims.begin() + l);
  out.inner.erase(out.inner.begin() + l);
  for (Stage& st : out.stages) {
    st.value = rewrite(st.value);
    st.finalize = rewrite(st.finalize);
    if (st.offset) st.offset = rewrite(canonical_offset(st.offset));
  }
  return out;
}

// k with every coalescible pair of adjacent dims of the same kind merged;
// nullopt when none is. Scatter kernels keep their dims (their inner dims'
// order is the sources' order).
std::optional<Kernel> CoalesceDims(const Kernel& k) {
  if (k.is_scatter() || k.dims.size() < 2) return std::nullopt;
  std::optional<Kernel> out;
  const Kernel* cur = &k;
  for (int p = static_cast<int>(k.dims.size()) - 2; p >= 0; --p) {
    if (cur->inner[p] != cur->inner[p + 1] || !CanCoalesce(*cur, p)) continue;
    out = Coalesce(*cur, p);
    cur = &*out;
  }
  return out;
}

// Emits one kernel function.
class CpuKernelEmitter : public KernelEmitterBase {
 public:
  CpuKernelEmitter(llvm::Module& module, const FusedProgram& program,
                   const Kernel& kernel, const CpuCodegenOptions& options)
      : KernelEmitterBase(module, program, kernel, options.fast_math, "CPU"),
        options_(options) {}

  // float16 <-> float32 in hardware where the target has it (the same
  // values, RNE; NaN payloads aside).
  Value* HalfBitsToFloat(Value* h16) override {
    if (!options_.f16c) return KernelEmitterBase::HalfBitsToFloat(h16);
    return b_.CreateFPExt(b_.CreateBitCast(h16, b_.getHalfTy()),
                          b_.getFloatTy());
  }
  Value* FloatToHalfBits(Value* f) override {
    if (!options_.f16c) return KernelEmitterBase::FloatToHalfBits(f);
    return b_.CreateBitCast(b_.CreateFPTrunc(f, b_.getHalfTy()),
                            b_.getInt16Ty());
  }

  // A float32 that is a bfloat16 value (IsBfloat16Exact, kernel_emitter.h)
  // stores as its high half; a value widened from bfloat16 bits
  // (BFloat16BitsToFloat, as a load or a rounding leaves it) stores as those
  // bits; any other rounds to nearest even.
  Value* FloatToBFloat16Bits(Value* f) override {
    if (Value* bits = BFloat16BitsOf(f)) return bits;
    if (!bf16_exact_.contains(f))
      return KernelEmitterBase::FloatToBFloat16Bits(f);
    return b_.CreateTrunc(
        b_.CreateLShr(b_.CreateBitCast(f, b_.getInt32Ty()), 16),
        b_.getInt16Ty());
  }

  // X where `f` is BFloat16BitsToFloat(X) (bitcast (shl (zext X), 16)),
  // else null.
  static Value* BFloat16BitsOf(Value* f) {
    auto* cast = llvm::dyn_cast<llvm::BitCastInst>(f);
    auto* shl = cast == nullptr
                    ? nullptr
                    : llvm::dyn_cast<llvm::BinaryOperator>(cast->getOperand(0));
    if (shl == nullptr || shl->getOpcode() != llvm::Instruction::Shl)
      return nullptr;
    auto* by = llvm::dyn_cast<llvm::ConstantInt>(shl->getOperand(1));
    auto* wide = llvm::dyn_cast<llvm::ZExtInst>(shl->getOperand(0));
    if (by == nullptr || by->getZExtValue() != 16 || wide == nullptr ||
        !wide->getSrcTy()->isIntegerTy(16)) {
      return nullptr;
    }
    return wide->getOperand(0);
  }

  // float32 exp inline: SLEEF's expf_u10 (error within 1 ulp), without a
  // branch, so that it vectorises. libmvec's vector expf, which LLVM's
  // intrinsic became, computes a whole vector on a scalar path when a lane
  // is below -87.3 (a result that is subnormal or 0): the -inf or
  // finfo.min of a causal or padding mask made a softmax 10x slower
  // (bench/README.md, session 36). Computed without fast-math flags: a
  // reassociated range reduction would lose the low bits of ln 2.
  Value* Exp(Value* x) override {
    if (!x->getType()->isFloatTy()) return KernelEmitterBase::Exp(x);
    llvm::IRBuilderBase::FastMathFlagGuard exact(b_);
    b_.clearFastMathFlags();
    auto fma = [&](Value* a, Value* m, Value* c) {
      return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {b_.getFloatTy()},
                                {a, m, c});
    };
    // NaN and values beyond +-104 (the masked scores) are computed as 0,
    // then replaced: as +-104 they made subnormal products, which x86
    // finishes in microcode (a masked softmax 9x slower). The tests are on
    // x's bits: a float compare of a widened float16 value is narrowed to
    // a float16 compare by InstCombine, which x86 without AVX512-FP16 runs
    // one lane at a time (a float16 kernel 8x slower).
    Value* bits = b_.CreateBitCast(x, b_.getInt32Ty());
    Value* magnitude = b_.CreateAnd(bits, b_.getInt32(0x7fffffff));
    Value* negative = b_.CreateICmpSLT(bits, b_.getInt32(0));
    Value* nan = b_.CreateICmpUGT(magnitude, b_.getInt32(0x7f800000));
    Value* big = b_.CreateICmpUGT(magnitude, b_.getInt32(0x42d00000));  // 104
    Value* xc = b_.CreateSelect(big, F(0.0), x);
    // x = q ln2 + s, |s| <= ln2 / 2 (ln 2 in two parts, the first exact
    // times any q here); e^s by a polynomial.
    Value* qf = Call1(llvm::Intrinsic::roundeven,
                      b_.CreateFMul(xc, F(1.442695040888963407359924681)));
    Value* s = fma(qf, F(-0.693145751953125), xc);
    s = fma(qf, F(-1.428606765330187045e-06), s);
    Value* u = F(0.000198527617612853646278381);
    for (double c :
         {0.00139304355252534151077271, 0.00833336077630519866943359,
          0.0416664853692054748535156, 0.166666671633720397949219, 0.5}) {
      u = fma(u, s, F(c));
    }
    u = b_.CreateFAdd(F(1.0), fma(b_.CreateFMul(s, s), u, s));
    // u * 2^q as u * 2^(q >> 1) * 2^(q - (q >> 1)): both factors normal
    // floats for |q| <= 150, so subnormal results round once.
    Value* q = b_.CreateFPToSI(qf, b_.getInt32Ty());
    auto pow2 = [&](Value* e) {
      return b_.CreateBitCast(
          b_.CreateShl(b_.CreateAdd(e, b_.getInt32(127)), 23), b_.getFloatTy());
    };
    Value* q_half = b_.CreateAShr(q, 1);
    u = b_.CreateFMul(b_.CreateFMul(u, pow2(q_half)),
                      pow2(b_.CreateSub(q, q_half)));
    Value* limit = b_.CreateSelect(negative, F(0.0),
                                   F(std::numeric_limits<double>::infinity()));
    return b_.CreateSelect(nan, x, b_.CreateSelect(big, limit, u));
  }

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
    } else if (options_.row_blocks && PrefersRowBlocks(kernel_)) {
      EmitBlockedRowKernel(start, end);
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
    EmitRuns(start, end, {"run", "i_last", "run.len"}, /*max_len=*/0,
             [&](Value* first, Value* n) {
               EmitLoop(b_.getInt64(0), n, "j", [&](Value* j) {
                 vars_[last] = b_.CreateAdd(first, j, "v_last", true, true);
                 EmitStages();
               });
             });
  }

  // The names of EmitRuns' blocks and values.
  struct RunNames {
    std::string loop, first, len;
  };
  // Runs of consecutive positions of the last outer dim over the flat
  // range [start, end), the other outer vars set per run (DecomposeOuter),
  // each at most `max_len` long where max_len > 0:
  //   for (f = start; f < end; f += n) { decompose f;
  //     n = min(size_last - first, end - f[, max_len]); body(first, n) }
  void EmitRuns(Value* start, Value* end, const RunNames& names,
                int64_t max_len,
                const std::function<void(Value*, Value*)>& body) {
    Value* last_size = dim_size_[outer_dims_.back()];
    EmitLoopSkeleton(start, end, /*is_signed=*/true,
                     {names.loop + ".header", names.loop + ".body",
                      names.loop + ".exit", "f"},
                     [&](Value* f) {
                       Value* first = b_.CreateSRem(f, last_size, names.first);
                       // The rest of the decomposition uses the quotient as the
                       // flat index of the dims before the last.
                       DecomposeOuter(b_.CreateSDiv(f, last_size), 1);
                       Value* n = b_.CreateSub(last_size, first);
                       Value* left = b_.CreateSub(end, f);
                       n = b_.CreateSelect(b_.CreateICmpSLT(left, n), left, n,
                                           max_len > 0 ? "" : names.len);
                       if (max_len > 0) {
                         n = b_.CreateSelect(
                             b_.CreateICmpSLT(b_.getInt64(max_len), n),
                             b_.getInt64(max_len), n, names.len);
                       }
                       body(first, n);
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

  // Row kernels in blocks (PrefersRowBlocks): the rows of [start, end) in
  // runs of at most kRowBlock consecutive positions of the last outer dim
  // (the other outer vars fixed), and for each stage the block's rows
  // innermost:
  //   reduce:      acc[j] = init; for inner...: for j < n: acc[j] (+)= value
  //   store inner: for inner...: for j < n: store
  //   store outer: for j < n: store
  // Each reduction keeps its n accumulators in an array; a later stage's
  // row j reads them (finalized) from there.
  void EmitBlockedRowKernel(Value* start, Value* end) {
    EmitRuns(start, end, {"blk", "blk.first", "blk.len"}, kRowBlock,
             [&](Value* first, Value* n) { EmitBlockStages(first, n); });
  }

  void EmitBlockStages(Value* first, Value* n) {
    const int last = outer_dims_.back();
    std::vector<llvm::AllocaInst*> accs;  // per finished reduction slot
    std::vector<const Stage*> reductions;
    // Row j of the block: its last outer var and the finished reductions.
    auto bind_row = [&](Value* j) {
      vars_[last] = b_.CreateAdd(first, j, "v_last", true, true);
      for (size_t slot = 0; slot < accs.size(); ++slot) {
        const Stage& st = *reductions[slot];
        llvm::Type* ty = TypeOf(st.acc_dtype);
        Value* raw = b_.CreateLoad(ty, b_.CreateInBoundsGEP(ty, accs[slot], j));
        SetAccValue(static_cast<int>(slot), raw, st.acc_dtype);
        if (st.finalize) {
          SetAccValue(static_cast<int>(slot), EmitExpr(st.finalize),
                      st.finalize->dtype);
        }
      }
    };
    auto rows = [&](const char* name, const std::function<void(Value*)>& fn) {
      EmitLoop(b_.getInt64(0), n, name, fn);
    };
    ForEachStage(
        [&](const Stage& st, int slot) {
          llvm::Type* ty = TypeOf(st.acc_dtype);
          llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
          b_.SetInsertPoint(entry_, entry_->begin());
          llvm::AllocaInst* acc = b_.CreateAlloca(ty, b_.getInt64(kRowBlock),
                                                  absl::StrCat("accs", slot));
          b_.restoreIP(saved);
          rows("blk.init", [&](Value* j) {
            b_.CreateStore(InitValue(st.reduce, st.acc_dtype),
                           b_.CreateInBoundsGEP(ty, acc, j));
          });
          EmitInnerNest(0, [&] {
            rows("blk.reduce", [&](Value* j) {
              bind_row(j);
              Value* v = ConvertValue(EmitExpr(st.value), st.value->dtype,
                                      st.acc_dtype);
              Value* at = b_.CreateInBoundsGEP(ty, acc, j);
              Value* take = nullptr;
              b_.CreateStore(CombineStep(st.reduce, st.acc_dtype,
                                         b_.CreateLoad(ty, at), v, &take),
                             at);
            });
          });
          accs.push_back(acc);
          reductions.push_back(&st);
        },
        [&](const Stage& st, size_t) {
          if (st.kind == Stage::Kind::kStoreInner) {
            EmitInnerNest(0, [&] {
              rows("blk.store", [&](Value* j) {
                bind_row(j);
                EmitStore(st);
              });
            });
          } else {
            rows("blk.store", [&](Value* j) {
              bind_row(j);
              EmitStore(st);
            });
          }
        });
  }

  void EmitStages() {
    const std::vector<int> partner = KeptSummands();
    auto partner_of = [&](const Stage& st) {
      return partner[static_cast<size_t>(&st - kernel_.stages.data())];
    };
    // A 16-bit store's summands are kept in a float32 row of the pair's own
    // (its output would round them before the sum reads them), indexed by
    // both stages of the pair.
    std::vector<llvm::AllocaInst*> scratch(partner.size(), nullptr);
    for (size_t s = 0; s < partner.size(); ++s) {
      if (partner[s] < 0 || kernel_.stages[s].kind == Stage::Kind::kReduce ||
          kernel_.stages[s].store_dtype == DType::kFloat32) {
        continue;
      }
      llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
      b_.SetInsertPoint(entry_, entry_->begin());
      scratch[s] = b_.CreateAlloca(b_.getFloatTy(), b_.getInt64(*ConstantRow()),
                                   "summands");
      scratch[s]->setAlignment(llvm::Align(64));
      scratch[partner[s]] = scratch[s];
      b_.restoreIP(saved);
    }
    auto scratch_of = [&](const Stage& st) {
      return scratch[static_cast<size_t>(&st - kernel_.stages.data())];
    };
    ForEachStage(
        [&](const Stage& st, int slot) {
          const int s = partner_of(st);
          EmitReduce(st, slot, s < 0 ? nullptr : &kernel_.stages[s],
                     scratch_of(st));
        },
        [&](const Stage& st, size_t) {
          if (st.kind != Stage::Kind::kStoreInner) {
            EmitStore(st);
            return;
          }
          const bool reads_kept = partner_of(st) >= 0;
          EmitInnerNest(0, [&] {
            if (!reads_kept) {
              EmitStore(st);
              return;
            }
            // The summand, stored by the reduction at this position (in
            // the output, or for a 16-bit output in the scratch row),
            // times the reciprocal of the divisor (LICM takes the division
            // out of the loop), as ATen's softmax computes it.
            const Expr& quotient = Quotient(st);
            Value* off = EmitExpr(st.offset);
            Value* summand =
                st.store_dtype == DType::kFloat32
                    ? LoadElement(st.buffer_slot, off, DType::kFloat32)
                    : b_.CreateLoad(
                          b_.getFloatTy(),
                          b_.CreateInBoundsGEP(b_.getFloatTy(), scratch_of(st),
                                               InnerPosition()));
            Value* scale = b_.CreateFDiv(F(1.0), EmitExpr(quotient->args[1]));
            StoreElement(st.buffer_slot, off,
                         ConvertValue(b_.CreateFMul(summand, scale),
                                      DType::kFloat32, st.store_dtype),
                         st.store_dtype);
          });
        });
  }

  // The quotient a store stage computes: its value, or what its value
  // rounds (a cast).
  static const Expr& Quotient(const Stage& st) {
    return st.value->op == ExprOp::kCast ? st.value->args[0] : st.value;
  }

  // The length of the kernel's rows when it is a constant no longer than
  // kScratchRow (a float32 scratch row of that length fits the stack).
  static constexpr int64_t kScratchRow = 16384;
  std::optional<int64_t> ConstantRow() const {
    int64_t n = 1;
    for (size_t d = 0; d < kernel_.dims.size(); ++d) {
      if (!kernel_.inner[d]) continue;
      std::optional<int64_t> size = kernel_.dims[d].AsConstant();
      if (!size || *size < 0 || (*size > 0 && n > kScratchRow / *size))
        return std::nullopt;
      n *= *size;
    }
    if (n > kScratchRow) return std::nullopt;
    return n;
  }

  // Pairs of stages, each index naming its partner (-1: none): a float32
  // sum over the row and a later store of the row that divides the sum's
  // summand by something in float32 (softmax: sum(exp(x - max)), then
  // exp(x - max) / sum). The reduction then stores the summand where the
  // store will write (a float32 output) or in a float32 scratch row of the
  // kernel's (a 16-bit output, which would round the summands before the
  // sum reads them; rows of a constant length up to kScratchRow), and the
  // store reads it back and multiplies it by the divisor's reciprocal, as
  // ATen's softmax does: one exp per element instead of two, and no
  // division per element (within 1.5 ulps of the quotient). Only where
  // nothing else in the kernel reads or writes the stored buffer and the
  // store's offset reads no accumulator.
  std::vector<int> KeptSummands() const {
    const std::vector<Stage>& stages = kernel_.stages;
    std::vector<int> partner(stages.size(), -1);
    if (kernel_.is_scatter()) return partner;
    const bool constant_row = ConstantRow().has_value();
    // Whether a stage other than `s` touches buffer slot `slot`, or `s`'s
    // offset reads an accumulator.
    auto other_use = [&](size_t s, int slot) {
      bool found = false;
      absl::flat_hash_set<const ExprNode*> offset_nodes, seen;
      ForEachNode(stages[s].offset, offset_nodes, [&](const ExprNode& x) {
        found = found || x.op == ExprOp::kAcc;
      });
      for (size_t o = 0; o < stages.size(); ++o) {
        const Stage& other = stages[o];
        found = found || (o != s && other.kind != Stage::Kind::kReduce &&
                          other.buffer_slot == slot);
        for (const Expr* e : {&other.value, &other.offset, &other.finalize}) {
          ForEachNode(*e, seen, [&](const ExprNode& x) {
            found = found || (x.op == ExprOp::kLoadBuffer && x.index == slot);
          });
        }
      }
      return found;
    };
    for (size_t r = 0; r < stages.size(); ++r) {
      const Stage& red = stages[r];
      if (red.kind != Stage::Kind::kReduce || red.reduce != ReduceKind::kSum ||
          red.acc_dtype != DType::kFloat32 ||
          red.value->dtype != DType::kFloat32) {
        continue;
      }
      for (size_t s = r + 1; s < stages.size(); ++s) {
        const Stage& st = stages[s];
        const Expr& quotient = Quotient(st);
        const bool kept_in_output =
            st.store_dtype == DType::kFloat32 && st.value->op == ExprOp::kDiv;
        const bool kept_in_scratch = (st.store_dtype == DType::kBFloat16 ||
                                      st.store_dtype == DType::kFloat16) &&
                                     st.value->op == ExprOp::kCast &&
                                     st.value->dtype == st.store_dtype &&
                                     constant_row;
        if (partner[s] < 0 && st.kind == Stage::Kind::kStoreInner &&
            (kept_in_output || kept_in_scratch) &&
            quotient->op == ExprOp::kDiv &&
            quotient->dtype == DType::kFloat32 &&
            ir::Equal(quotient->args[0], red.value) &&
            !other_use(s, st.buffer_slot)) {
          partner[r] = static_cast<int>(s);
          partner[s] = static_cast<int>(r);
          break;
        }
      }
    }
    return partner;
  }

  // ---- stages ----

  // A 16-bit store of a float32 quotient whose divisor is the same along the
  // row (softmax's exp(x - max) / sum, a normalisation by a row's norm): the
  // dividend times the divisor's reciprocal, which LICM computes once per
  // row, as ATen's softmax does. A vector division costs more than the rest
  // of such a store (session 37: bfloat16 softmax); the product is within an
  // ulp of the quotient in float32, which the rounding to 16 bits hides but
  // for quotients within that ulp of a rounding boundary. Null: `st` is not
  // such a store.
  Expr ReciprocalQuotient(const Stage& st) const {
    if (st.store_dtype != DType::kFloat16 &&
        st.store_dtype != DType::kBFloat16) {
      return nullptr;
    }
    const Expr& quotient = Quotient(st);
    if (st.value->op != ExprOp::kCast || quotient->op != ExprOp::kDiv ||
        quotient->dtype != DType::kFloat32) {
      return nullptr;
    }
    bool varies = false;
    absl::flat_hash_set<const ExprNode*> seen;
    ForEachNode(quotient->args[1], seen, [&](const ExprNode& x) {
      varies = varies || x.op == ExprOp::kLoadBuffer || x.op == ExprOp::kLoad ||
               x.op == ExprOp::kPhilox || x.op == ExprOp::kCheck ||
               (x.op == ExprOp::kVar && kernel_.inner[x.index]);
    });
    if (varies) return nullptr;
    return ir::Cast(ir::Binary(ExprOp::kMul, quotient->args[0],
                               ir::Unary(ExprOp::kReciprocal, quotient->args[1],
                                         DType::kFloat32),
                               DType::kFloat32),
                    st.value->dtype);
  }

  void EmitStore(const Stage& st) {
    Value* off = EmitExpr(st.offset);
    const Expr reciprocal = ReciprocalQuotient(st);
    const Expr& value = reciprocal ? reciprocal : st.value;
    Value* v = EmitExpr(value);
    if (!kernel_.is_scatter() && st.store_dtype == DType::kBFloat16 &&
        IsBfloat16Exact(value)) {
      // Its float32 value (EmitExpr skips a rounding of a bfloat16 value),
      // stored as its high half: a bfloat16 relu, where or copy, whose
      // rounding was most of the kernel's instructions, and a NaN keeps
      // its payload as PyTorch's copy does.
      v = ConvertValue(v, value->dtype, DType::kFloat32);
      bf16_exact_.insert(v);
      StoreElement(st.buffer_slot, off, v, st.store_dtype);
      return;
    }
    v = ConvertValue(v, value->dtype, st.store_dtype);
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

  // `keep`: a store stage whose summand this sum is (KeptSummands): each
  // summand is also stored where that stage writes, or for a 16-bit stage
  // in `scratch` at its position in the row.
  void EmitReduce(const Stage& st, int slot, const Stage* keep = nullptr,
                  llvm::AllocaInst* scratch = nullptr) {
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
    if (UsesOrderedKeys(st)) {
      EmitKeyedReduce(st, acc);
    } else {
      b_.CreateStore(InitValue(st.reduce, vdtype), acc);
      if (pos) b_.CreateStore(b_.getInt64(0), pos);
      EmitInnerNest(0, [&] {
        Value* v = ConvertValue(EmitExpr(st.value), st.value->dtype, vdtype);
        if (keep != nullptr && keep->store_dtype == DType::kFloat32) {
          StoreElement(keep->buffer_slot, EmitExpr(keep->offset), v,
                       keep->store_dtype);
        } else if (keep != nullptr) {
          b_.CreateStore(v, b_.CreateInBoundsGEP(b_.getFloatTy(), scratch,
                                                 InnerPosition()));
        }
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
    }
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

  // A float max or min over a row, where the row is contiguous, is a
  // reduction the loop vectoriser does not take in LLVM 16 as NaN
  // propagation writes it (a compare, an unordered check and a select; it
  // needs nnan). Over ordered keys it is an integer max/min, which it does:
  // key(x) = bits(x) ^ (sign(x) ? 0x7fff.. : 0) orders floats as their
  // values (-0 just below +0), and a NaN gets the key beyond every other
  // (INT_MAX for max, INT_MIN for min) so that it wins, as PyTorch's NaN
  // does. The key maps back to the float; the winning NaN key to NaN.
  static bool UsesOrderedKeys(const Stage& st) {
    return (st.reduce == ReduceKind::kMax || st.reduce == ReduceKind::kMin) &&
           st.acc_dtype == DType::kFloat32;
  }

  // The reduction of `st` over the row into `acc` (of the float type).
  void EmitKeyedReduce(const Stage& st, llvm::AllocaInst* acc) {
    const bool is_max = st.reduce == ReduceKind::kMax;
    llvm::Type* fty = TypeOf(st.acc_dtype);
    const unsigned bits = fty->getPrimitiveSizeInBits();
    llvm::IntegerType* ity = b_.getIntNTy(bits);
    const llvm::APInt top = llvm::APInt::getSignedMaxValue(bits);
    Value* nan_key = llvm::ConstantInt::get(
        ity, is_max ? top : llvm::APInt::getSignedMinValue(bits));
    // The key map is its own inverse.
    auto flip = [&](Value* i) {
      return b_.CreateXor(i, b_.CreateAnd(b_.CreateAShr(i, bits - 1),
                                          llvm::ConstantInt::get(ity, top)));
    };
    auto key = [&](Value* f) {
      return b_.CreateSelect(b_.CreateFCmpUNO(f, f), nan_key,
                             flip(b_.CreateBitCast(f, ity)));
    };
    llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
    b_.SetInsertPoint(entry_, entry_->begin());
    llvm::AllocaInst* kacc = b_.CreateAlloca(ity, nullptr, "acc.key");
    b_.restoreIP(saved);
    b_.CreateStore(key(InitValue(st.reduce, st.acc_dtype)), kacc);
    EmitInnerNest(0, [&] {
      Value* v =
          ConvertValue(EmitExpr(st.value), st.value->dtype, st.acc_dtype);
      Value* a = b_.CreateLoad(ity, kacc);
      b_.CreateStore(b_.CreateBinaryIntrinsic(
                         is_max ? llvm::Intrinsic::smax : llvm::Intrinsic::smin,
                         a, key(v)),
                     kacc);
    });
    Value* k = b_.CreateLoad(ity, kacc);
    b_.CreateStore(b_.CreateSelect(b_.CreateICmpEQ(k, nan_key),
                                   llvm::ConstantFP::getNaN(fty),
                                   b_.CreateBitCast(flip(k), fty)),
                   acc);
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

  const CpuCodegenOptions options_;
  // Values EmitStore found to be bfloat16 values (IsBfloat16Exact).
  absl::flat_hash_set<const Value*> bf16_exact_;
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
        const Kernel& kernel = program.kernels[k];
        if (kernel.is_extern()) return absl::OkStatus();
        std::optional<Kernel> coalesced;
        if (options.coalesce_dims) coalesced = CoalesceDims(kernel);
        const Kernel& walked = coalesced ? *coalesced : kernel;
        if (options.split_innermost_dim) {
          if (std::optional<Kernel> split = SplitInnermostDim(walked))
            return CpuKernelEmitter(module, program, *split, options).Emit();
        }
        return CpuKernelEmitter(module, program, walked, options).Emit();
      });
}

}  // namespace kiln
