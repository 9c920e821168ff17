#include "compiler/codegen_cuda.h"

#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "compiler/kernel_emitter.h"
#include "graph/dtype.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InlineAsm.h"
#include "llvm/IR/IntrinsicsNVPTX.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"

namespace kiln {
namespace {

using llvm::Value;
using Form = GpuKernelPlan::Form;

constexpr unsigned kGlobal = 1;  // NVPTX address spaces
constexpr unsigned kShared = 3;
constexpr int64_t kRuntimeAlignment = 256;  // outputs and temps

// offset = sum(coeff[v] * var v) + constant + sum(scale[i] * q_i) within a
// group of V consecutive values of the group var, coefficients and the
// constant free of vars. Each q_i is floordiv(L_i, d_i) of an argument
// L_i whose group-var coefficient is 0 or 1 and a constant d_i that is a
// positive multiple of V: when L_i is a multiple of V at the group's first
// lane, L_i .. L_i + V - 1 lie in one block of d_i, so q_i is the same for
// the whole group (remainder(L, d) = L - d * q). That is how an index
// through a reshape of contiguous dims reads (batch norm's chunk of a
// channel: (i / 3136) * 802816 + ((i / 56) % 56) * 56 + i % 56).
// `aligned` collects the var-free parts (coefficients of the other vars
// and the constant) of every L_i whose group-var coefficient is 1: each
// must be a multiple of V for the group to share q_i.
struct LinearForm {
  std::vector<Expr> coeff;  // per var; null = 0
  Expr constant;
  std::vector<int64_t> invariant_scales;  // scale[i] of each q_i
};

struct GroupContext {
  int var = -1;  // the group var; -1: no group-invariant terms allowed
  int64_t size = 1;
  std::vector<Expr>* aligned = nullptr;
};

std::optional<LinearForm> Linearize(const Expr& e, size_t num_vars,
                                    const GroupContext& group = {}) {
  LinearForm f;
  f.coeff.assign(num_vars, nullptr);
  if (!ir::ContainsOp(e, ExprOp::kVar)) {
    f.constant = e;
    return f;
  }
  auto add = [](Expr a, Expr b) -> Expr {
    if (!a) return b;
    if (!b) return a;
    return ir::Add(a, b);
  };
  switch (e->op) {
    case ExprOp::kVar:
      f.coeff[e->index] = ir::IntConst(1);
      f.constant = ir::IntConst(0);
      return f;
    case ExprOp::kAdd: {
      auto a = Linearize(e->args[0], num_vars, group);
      auto b = Linearize(e->args[1], num_vars, group);
      if (!a || !b) return std::nullopt;
      for (size_t v = 0; v < num_vars; ++v)
        f.coeff[v] = add(a->coeff[v], b->coeff[v]);
      f.constant = ir::Add(a->constant, b->constant);
      f.invariant_scales = a->invariant_scales;
      f.invariant_scales.insert(f.invariant_scales.end(),
                                b->invariant_scales.begin(),
                                b->invariant_scales.end());
      return f;
    }
    case ExprOp::kMul: {
      int lin = ir::ContainsOp(e->args[0], ExprOp::kVar) ? 0 : 1;
      if (ir::ContainsOp(e->args[1 - lin], ExprOp::kVar)) return std::nullopt;
      auto a = Linearize(e->args[lin], num_vars, group);
      if (!a) return std::nullopt;
      const Expr& scale = e->args[1 - lin];
      for (size_t v = 0; v < num_vars; ++v)
        if (a->coeff[v]) f.coeff[v] = ir::Mul(a->coeff[v], scale);
      f.constant = ir::Mul(a->constant, scale);
      if (!a->invariant_scales.empty()) {
        if (scale->op != ExprOp::kConst) return std::nullopt;
        for (int64_t s : a->invariant_scales)
          f.invariant_scales.push_back(s * scale->i);
      }
      return f;
    }
    case ExprOp::kFloorDiv:
    case ExprOp::kRemainder: {
      const Expr& d = e->args[1];
      if (group.var < 0 || d->op != ExprOp::kConst || d->i <= 0 ||
          d->i % group.size != 0) {
        return std::nullopt;
      }
      auto arg = Linearize(e->args[0], num_vars, group);
      if (!arg) return std::nullopt;
      const Expr& g = arg->coeff[group.var];
      const bool moves = g != nullptr;
      if (moves && (g->op != ExprOp::kConst || g->i != 1)) return std::nullopt;
      if (moves) {
        // L at a group's first lane must be a multiple of V: its other
        // coefficients, its constant and its own invariant terms.
        for (size_t v = 0; v < num_vars; ++v) {
          if (static_cast<int>(v) != group.var && arg->coeff[v])
            group.aligned->push_back(arg->coeff[v]);
        }
        group.aligned->push_back(arg->constant);
        for (int64_t s : arg->invariant_scales) {
          if (s % group.size != 0) return std::nullopt;
        }
      }
      if (e->op == ExprOp::kFloorDiv) {
        // Constant within a group.
        f.constant = ir::IntConst(0);
        f.invariant_scales = {1};
        return f;
      }
      // remainder(L, d) = L - d * floordiv(L, d).
      f = *arg;
      f.invariant_scales.push_back(-d->i);
      return f;
    }
    default:
      return std::nullopt;
  }
}

// Emits one kernel entry in the form of its plan (gpu_launch.h).
class CudaKernelEmitter : public KernelEmitterBase {
 public:
  CudaKernelEmitter(llvm::Module& module, const FusedProgram& program,
                    const Kernel& kernel, const CudaCodegenOptions& options,
                    const GpuKernelPlan& plan)
      : KernelEmitterBase(module, program, kernel, options.fast_math, "CUDA"),
        options_(options),
        plan_(plan),
        V_(plan.vector_width) {}

  // ---- float16 / bfloat16 conversions: one instruction each ----
  // (The integer sequences of KernelEmitterBase cost 8-15 instructions per
  // element, a third of a tanh-GELU's; same values, NaN payloads aside.)
  // A float made from 16-bit bits converts back to those bits without an
  // instruction (a rounded value stored: LLVM cannot see through the asm).
  Value* HalfBitsToFloat(Value* h16) override {
    Value* f = Convert("cvt.f32.f16 $0, $1;", "=f,h", b_.getFloatTy(), h16);
    half_bits_[f] = h16;
    return f;
  }
  Value* FloatToHalfBits(Value* f) override {
    if (auto it = half_bits_.find(f); it != half_bits_.end()) return it->second;
    return Convert("cvt.rn.f16.f32 $0, $1;", "=h,f", b_.getInt16Ty(), f);
  }
  Value* BFloat16BitsToFloat(Value* h16) override {
    Value* f = KernelEmitterBase::BFloat16BitsToFloat(h16);
    bfloat16_bits_[f] = h16;
    return f;
  }
  Value* FloatToBFloat16Bits(Value* f) override {
    if (auto it = bfloat16_bits_.find(f); it != bfloat16_bits_.end())
      return it->second;
    if (options_.compute_capability < 80)
      return KernelEmitterBase::FloatToBFloat16Bits(f);
    return Convert("cvt.rn.bf16.f32 $0, $1;", "=h,f", b_.getInt16Ty(), f);
  }
  Value* Convert(const char* ptx, const char* constraints, llvm::Type* to,
                 Value* v) {
    llvm::InlineAsm* cvt = llvm::InlineAsm::get(
        llvm::FunctionType::get(to, {v->getType()}, false), ptx, constraints,
        /*hasSideEffects=*/false);
    llvm::CallInst* call = b_.CreateCall(cvt, {v});
    call->setDoesNotAccessMemory();
    call->setDoesNotThrow();
    return call;
  }

  absl::Status Emit() {
    if (kernel_.is_scatter() && plan_.form != Form::kPointwise) {
      return absl::InternalError(absl::StrCat(
          kernel_.name,
          ": a scatter kernel on CUDA has no inner dims (its additions are "
          "atomic)"));
    }
    const size_t nbuf = kernel_.buffers.size();
    const size_t nsym = program_.symbol_names.size();
    llvm::Type* gptr = llvm::PointerType::get(ctx_, kGlobal);
    std::vector<llvm::Type*> params(nbuf, gptr);
    params.insert(params.end(), nsym, b_.getInt64Ty());
    auto* fn_type = llvm::FunctionType::get(b_.getVoidTy(), params, false);
    fn_ = llvm::Function::Create(fn_type, llvm::Function::ExternalLinkage,
                                 kernel_.name, m_);
    fn_->setCallingConv(llvm::CallingConv::PTX_Kernel);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    for (size_t s = 0; s < nbuf; ++s) {
      fn_->addParamAttr(s, llvm::Attribute::NoAlias);
      fn_->addParamAttr(s, llvm::Attribute::NoCapture);
      // An input the kernel writes (an input write, FusedProgram) is not
      // read-only: no non-coherent loads from it.
      if (IsInputSlot(s) && !StoredSlot(s))
        fn_->addParamAttr(s, llvm::Attribute::ReadOnly);
    }
    Annotate("kernel", 1);
    Annotate("maxntidx", plan_.block_threads);

    auto args = fn_->arg_begin();
    for (size_t s = 0; s < nbuf; ++s) {
      Value* p = &*args++;
      p->setName(absl::StrCat("buf", s));
      base_.push_back(p);
    }
    for (size_t s = 0; s < nsym; ++s) {
      Value* p = &*args++;
      p->setName(program_.symbol_names[s]);
      syms_.push_back(p);
    }
    entry_ = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry_);
    ApplyFastMathFlags();
    if (fast_math_) {
      // Lets the NVPTX back end fuse and fold more freely. Approximate
      // division (div.full) is the back end's (cuda_backend.h,
      // LinkLibdevice): LLVM 16 picks fdiv's precision per target machine.
      fn_->addFnAttr("unsafe-fp-math", "true");
    }
    SetUpKernelDims();
    tid_ = b_.CreateZExt(
        b_.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, {}, {}),
        b_.getInt64Ty(), "tid");
    bid_ = b_.CreateZExt(
        b_.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, {}, {}),
        b_.getInt64Ty(), "bid");
    if (plan_.form == Form::kPointwise) {
      if (!outer_dims_.empty()) group_var_ = outer_dims_.back();
    } else if (!inner_dims_.empty()) {
      group_var_ = inner_dims_.back();
    }
    PlanVectorAccesses();
    if (kernel_.is_scatter()) scatter_nonempty_ = ScatterTargetNonEmpty();
    switch (plan_.form) {
      case Form::kPointwise:
        EmitPointwise();
        break;
      case Form::kPersistentRow:
      case Form::kLoopedRow:
        EmitRows();
        break;
      case Form::kColumn:
        EmitColumns();
        break;
    }
    return FinishFunction();
  }

 private:
  void Annotate(const char* key, int value) {
    llvm::NamedMDNode* md = m_.getOrInsertNamedMetadata("nvvm.annotations");
    llvm::Metadata* ops[] = {llvm::ValueAsMetadata::get(fn_),
                             llvm::MDString::get(ctx_, key),
                             llvm::ValueAsMetadata::get(b_.getInt32(value))};
    md->addOperand(llvm::MDNode::get(ctx_, ops));
  }

  const ProgramBuffer& SlotBuffer(size_t slot) const {
    return program_.buffers[kernel_.buffers[slot]];
  }
  bool IsInputSlot(size_t slot) const {
    return SlotBuffer(slot).kind == ProgramBuffer::Kind::kInput;
  }
  bool StoredSlot(size_t slot) const {
    for (const Stage& st : kernel_.stages) {
      if (st.kind != Stage::Kind::kReduce &&
          st.buffer_slot == static_cast<int>(slot))
        return true;
    }
    return false;
  }
  int64_t SlotAlignment(size_t slot) const {
    const ProgramBuffer& b = SlotBuffer(slot);
    if (b.kind != ProgramBuffer::Kind::kInput) return kRuntimeAlignment;
    if (b.index < static_cast<int>(options_.input_alignment.size()))
      return options_.input_alignment[b.index];
    return 0;
  }

  // ---- vector accesses ----

  // Whether an access of `slot` at `offset` can be one vector access per
  // group; if so, ANDs its run-time condition into vec_ok_.
  bool VectorCandidate(int slot, const Expr& offset, DType dtype) {
    if (V_ <= 1 || group_var_ < 0) return false;
    const int64_t bytes = V_ * DTypeSize(dtype);
    if (bytes > 16 || SlotAlignment(slot) < bytes) return false;
    std::vector<Expr> aligned;
    auto lin = Linearize(offset, kernel_.dims.size(),
                         GroupContext{group_var_, V_, &aligned});
    if (!lin) return false;
    const Expr& c = lin->coeff[group_var_];
    if (!c || c->op != ExprOp::kConst || c->i != 1) return false;
    // The group-invariant terms keep the first lane's offset a multiple of
    // V only when their scales are.
    for (int64_t s : lin->invariant_scales) {
      if (s % V_ != 0) return false;
    }
    auto divisible = [&](const Expr& e) {
      Value* v = EmitExpr(e);
      vec_ok_ = b_.CreateAnd(
          vec_ok_,
          b_.CreateICmpEQ(b_.CreateSRem(v, b_.getInt64(V_)), b_.getInt64(0)));
    };
    for (size_t v = 0; v < lin->coeff.size(); ++v) {
      if (static_cast<int>(v) != group_var_ && lin->coeff[v])
        divisible(lin->coeff[v]);
    }
    divisible(lin->constant);
    for (const Expr& e : aligned) divisible(e);
    return true;
  }

  void CollectLoads(const Expr& e) {
    if (!e) return;
    if (e->op == ExprOp::kLoadBuffer) {
      if (!vector_loads_.contains(e.get())) {
        const bool vec = VectorCandidate(e->index, e->args[0], e->dtype);
        vector_loads_[e.get()] = vec;
        if (vec) vector_load_order_.push_back(e);
        keep_alive_.push_back(e);
      }
      return;
    }
    for (const Expr& a : e->args) CollectLoads(a);
  }

  // Decides, before any control flow, which accesses are vector accesses
  // and the uniform run-time condition vec_ok_ under which they are.
  void PlanVectorAccesses() {
    vec_ok_ = b_.getTrue();
    for (const Stage& st : kernel_.stages) {
      CollectLoads(st.value);
      CollectLoads(st.finalize);
      CollectLoads(st.offset);
      vector_store_.push_back(
          st.kind == Stage::Kind::kStoreInner ||
                  (st.kind == Stage::Kind::kStoreOuter &&
                   plan_.form == Form::kPointwise)
              ? VectorCandidate(st.buffer_slot, st.offset, st.store_dtype)
              : false);
    }
  }

  // In a group (lane_ >= 0): a vector candidate's vector is loaded once, at
  // the group's first lane, and each lane extracts its element. In a lane
  // loop (loop_lane_) the vectors were loaded before the loop and the
  // iteration's lane is selected out of them.
  Value* EmitLoadBuffer(const Expr& e) override {
    auto cand = vector_loads_.find(e.get());
    if (lane_ < 0 || cand == vector_loads_.end() || !cand->second) {
      return KernelEmitterBase::EmitLoadBuffer(e);
    }
    auto& loads = group_loads_[group_];
    auto it = loads.find(e.get());
    if (it == loads.end()) {
      if (lane_ != 0) return KernelEmitterBase::EmitLoadBuffer(e);
      it = loads.emplace(e.get(), LoadGroupVector(e)).first;
    }
    if (loop_lane_) return FromStorage(SelectLane(it->second), e->dtype);
    return FromStorage(b_.CreateExtractElement(it->second, lane_), e->dtype);
  }

  // lanes[loop_lane_] by selects (a variable extractelement would go
  // through local memory).
  Value* SelectLane(Value* vec) {
    Value* v = b_.CreateExtractElement(vec, uint64_t{0});
    for (int k = 1; k < V_; ++k) {
      v = b_.CreateSelect(b_.CreateICmpEQ(loop_lane_, b_.getInt64(k)),
                          b_.CreateExtractElement(vec, k), v);
    }
    return v;
  }

  // The group's vector of load `e` (the current vars are lane 0's): one
  // vector load when vec_ok_, else V scalar loads.
  Value* LoadGroupVector(const Expr& e) {
    llvm::Type* st = StorageType(e->dtype);
    {
      Value* off0 = EmitExpr(e->args[0]);
      Value* vec = EmitIfElseValue(
          vec_ok_,
          [&] {
            Value* p = b_.CreateInBoundsGEP(st, base_[e->index], off0);
            return static_cast<Value*>(
                b_.CreateAlignedLoad(llvm::FixedVectorType::get(st, V_), p,
                                     llvm::Align(V_ * DTypeSize(e->dtype))));
          },
          [&] {
            Value* v =
                llvm::PoisonValue::get(llvm::FixedVectorType::get(st, V_));
            for (int k = 0; k < V_; ++k) {
              Value* p = b_.CreateInBoundsGEP(
                  st, base_[e->index], b_.CreateAdd(off0, b_.getInt64(k)));
              v = b_.CreateInsertElement(
                  v,
                  b_.CreateAlignedLoad(st, p, llvm::Align(DTypeSize(e->dtype))),
                  k);
            }
            return v;
          });
      return vec;
    }
  }

  // Stores of a group: lane values are collected and written at the last
  // lane, as one vector when vec_ok_, under `valid` (null = always).
  void EmitGroupStore(const Stage& st, size_t stage, Value* valid) {
    if (st.kind == Stage::Kind::kScatterAdd) {
      Value* v =
          ConvertValue(EmitExpr(st.value), st.value->dtype, st.store_dtype);
      Value* off = EmitExpr(st.offset);  // checks the indices
      Value* add = valid;
      if (scatter_nonempty_ != nullptr) {
        add = add ? b_.CreateAnd(add, scatter_nonempty_) : scatter_nonempty_;
      }
      EmitIf(add, [&] { AtomicAdd(st.buffer_slot, off, v, st.store_dtype); });
      return;
    }
    Value* v = ToStorage(
        ConvertValue(EmitExpr(st.value), st.value->dtype, st.store_dtype),
        st.store_dtype);
    if (lane_ < 0 || !vector_store_[stage]) {
      Value* off = EmitExpr(st.offset);
      EmitIf(valid, [&] { StoreRaw(st.buffer_slot, off, v, st.store_dtype); });
      return;
    }
    PendingStore& ps = pending_[stage];
    if (loop_lane_) {
      // The offset and the lane slots were set up before the loop.
      for (int k = 0; k < V_; ++k) {
        llvm::AllocaInst* slot = ps.lane_slots[k];
        Value* old = b_.CreateLoad(slot->getAllocatedType(), slot);
        b_.CreateStore(b_.CreateSelect(
                           b_.CreateICmpEQ(loop_lane_, b_.getInt64(k)), v, old),
                       slot);
      }
      return;
    }
    if (lane_ == 0) {
      ps.offset = EmitExpr(st.offset);
      ps.lanes.assign(V_, nullptr);
    }
    ps.lanes[lane_] = v;
    if (lane_ != V_ - 1) return;
    FlushGroupStore(st, ps, valid);
  }

  struct PendingStore;
  // Writes a group's lane values: one vector store when vec_ok_, else V
  // scalar stores, under `valid` (null = always).
  void FlushGroupStore(const Stage& st, const PendingStore& ps, Value* valid) {
    llvm::Type* ty = StorageType(st.store_dtype);
    const int64_t size = DTypeSize(st.store_dtype);
    EmitIf(valid, [&] {
      EmitIfElse(
          vec_ok_,
          [&] {
            Value* vec =
                llvm::PoisonValue::get(llvm::FixedVectorType::get(ty, V_));
            for (int k = 0; k < V_; ++k)
              vec = b_.CreateInsertElement(vec, ps.lanes[k], k);
            Value* p =
                b_.CreateInBoundsGEP(ty, base_[st.buffer_slot], ps.offset);
            b_.CreateAlignedStore(vec, p, llvm::Align(V_ * size));
          },
          [&] {
            for (int k = 0; k < V_; ++k) {
              StoreRaw(st.buffer_slot, b_.CreateAdd(ps.offset, b_.getInt64(k)),
                       ps.lanes[k], st.store_dtype);
            }
          });
    });
  }

  // buffer[offset] += v, atomically (a scatter's sum dtype: float32 or
  // int64, red.global.add).
  void AtomicAdd(int slot, Value* offset, Value* v, DType d) {
    llvm::Type* ty = StorageType(d);
    Value* p = b_.CreateInBoundsGEP(ty, base_[slot], offset);
    b_.CreateAtomicRMW(
        IsFloating(d) ? llvm::AtomicRMWInst::FAdd : llvm::AtomicRMWInst::Add, p,
        v, llvm::MaybeAlign(DTypeSize(d)), llvm::AtomicOrdering::Monotonic);
  }

  void StoreRaw(int slot, Value* offset, Value* raw, DType d) {
    llvm::Type* ty = StorageType(d);
    Value* p = b_.CreateInBoundsGEP(ty, base_[slot], offset);
    b_.CreateAlignedStore(raw, p, llvm::Align(DTypeSize(d)));
  }

  // ---- control flow (bodies get their own memo scope, so nothing computed
  // inside is reused outside) ----

  void EmitIf(Value* cond, const std::function<void()>& body) {
    if (!cond) {
      body();
      return;
    }
    if (auto* c = llvm::dyn_cast<llvm::ConstantInt>(cond)) {
      if (c->isOne()) {
        memo_.emplace_back();
        body();
        memo_.pop_back();
      }
      return;
    }
    auto* then = llvm::BasicBlock::Create(ctx_, "then", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "endif", fn_);
    b_.CreateCondBr(cond, then, done);
    b_.SetInsertPoint(then);
    memo_.emplace_back();
    body();
    memo_.pop_back();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  void EmitIfElse(Value* cond, const std::function<void()>& yes,
                  const std::function<void()>& no) {
    EmitIfElseValue(
        cond,
        [&]() -> Value* {
          yes();
          return nullptr;
        },
        [&]() -> Value* {
          no();
          return nullptr;
        });
  }

  // cond ? yes() : no() with a phi for the value (when not null).
  Value* EmitIfElseValue(Value* cond, const std::function<Value*()>& yes,
                         const std::function<Value*()>& no) {
    if (auto* c = llvm::dyn_cast<llvm::ConstantInt>(cond)) {
      memo_.emplace_back();
      Value* v = c->isOne() ? yes() : no();
      memo_.pop_back();
      return v;
    }
    auto* yes_bb = llvm::BasicBlock::Create(ctx_, "yes", fn_);
    auto* no_bb = llvm::BasicBlock::Create(ctx_, "no", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "merge", fn_);
    b_.CreateCondBr(cond, yes_bb, no_bb);
    b_.SetInsertPoint(yes_bb);
    memo_.emplace_back();
    Value* a = yes();
    memo_.pop_back();
    llvm::BasicBlock* yes_end = b_.GetInsertBlock();
    b_.CreateBr(done);
    b_.SetInsertPoint(no_bb);
    memo_.emplace_back();
    Value* c = no();
    memo_.pop_back();
    llvm::BasicBlock* no_end = b_.GetInsertBlock();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
    if (!a) return nullptr;
    llvm::PHINode* phi = b_.CreatePHI(a->getType(), 2);
    phi->addIncoming(a, yes_end);
    phi->addIncoming(c, no_end);
    return phi;
  }

  // Row-major decomposition of `flat` over `dims` into vars_.
  void Decompose(Value* flat, const std::vector<int>& dims) {
    Value* rest = flat;
    for (size_t k = dims.size(); k-- > 0;) {
      const int d = dims[k];
      if (k == 0) {
        vars_[d] = rest;
      } else {
        vars_[d] = b_.CreateURem(rest, dim_size_[d]);
        rest = b_.CreateUDiv(rest, dim_size_[d]);
      }
    }
  }

  Value* Product(const std::vector<int>& dims) {
    Value* p = b_.getInt64(1);
    for (int d : dims) p = b_.CreateMul(p, dim_size_[d]);
    return p;
  }

  // ---- pointwise ----

  // Each thread takes G = plan_.groups_per_thread groups of V elements, the
  // block's groups strided by block_threads * V (coalesced per group). In a
  // whole tile of grouped elements every group's vectors are loaded before
  // any is computed (G loads in flight per thread). Any other tile (the
  // last one) takes its elements one at a time in a loop: the body is
  // emitted once more, not G * V times.
  void EmitPointwise() {
    Value* n = Product(outer_dims_);
    const int groups = std::max(plan_.groups_per_thread, 1);
    Value* tile = b_.CreateMul(bid_, b_.getInt64(plan_.items_per_block));
    auto group_start = [&](Value* g) {
      return b_.CreateAdd(
          tile,
          b_.CreateMul(
              b_.CreateAdd(b_.CreateMul(g, b_.getInt64(plan_.block_threads)),
                           tid_),
              b_.getInt64(V_)),
          "f0");
    };
    if (groups == 1) {
      EmitPointwiseGroup(n, group_start(b_.getInt64(0)));
      return;
    }
    auto elements = [&] {
      EmitLoop(
          b_.getInt64(0), b_.getInt64(groups * V_), "element",
          [&](Value* k) {
            Value* v = b_.getInt64(V_);
            EmitElementInRange(n, b_.CreateAdd(group_start(b_.CreateUDiv(k, v)),
                                               b_.CreateURem(k, v)));
          },
          /*unroll=*/false);
    };
    if (outer_dims_.empty() || V_ == 1) {
      elements();
      return;
    }
    Value* whole = b_.CreateAnd(
        b_.CreateICmpULE(b_.CreateAdd(tile, b_.getInt64(plan_.items_per_block)),
                         n),
        Grouped());
    EmitIfElse(
        whole, [&] { EmitWholeTile(groups, group_start); }, elements);
  }

  // Groups stay within one row of the last dim when it splits evenly.
  Value* Grouped() {
    return b_.CreateICmpEQ(
        b_.CreateURem(dim_size_[outer_dims_.back()], b_.getInt64(V_)),
        b_.getInt64(0));
  }

  // `groups` groups, all within the range and grouped: their vector loads
  // first, then their lanes.
  void EmitWholeTile(int groups, const std::function<Value*(Value*)>& start) {
    const int last = outer_dims_.back();
    std::vector<std::vector<Value*>> group_vars;
    group_loads_.assign(groups, {});
    for (int g = 0; g < groups; ++g) {
      Decompose(start(b_.getInt64(g)), outer_dims_);
      group_vars.push_back(vars_);
      group_ = g;
      lane_ = 0;
      memo_.emplace_back();
      for (const Expr& e : vector_load_order_)
        group_loads_[g].emplace(e.get(), LoadGroupVector(e));
      memo_.pop_back();
    }
    for (int g = 0; g < groups; ++g) {
      vars_ = group_vars[g];
      group_ = g;
      EmitGroupLanes(last);
    }
    group_ = 0;
  }

  // The current group's lanes, unrolled: the vars are lane 0's, and the
  // last dim's var steps along the group.
  void EmitGroupLanes(int last) {
    Value* first = vars_[last];
    for (int k = 0; k < V_; ++k) {
      memo_.emplace_back();
      lane_ = k;
      vars_[last] = b_.CreateAdd(first, b_.getInt64(k));
      EmitPointwiseStages(nullptr);
      memo_.pop_back();
    }
    lane_ = -1;
  }

  // Flat element f, when below n.
  void EmitElementInRange(Value* n, Value* f) {
    EmitIf(b_.CreateICmpULT(f, n), [&] {
      Decompose(f, outer_dims_);
      EmitPointwiseStages(nullptr);
    });
  }

  // The V elements from f0 on: one group when in range and grouped, else
  // each element checked on its own.
  void EmitPointwiseGroup(Value* n, Value* f0) {
    auto scalar_elements = [&] {
      if (plan_.lane_loop) {
        EmitLoop(
            b_.getInt64(0), b_.getInt64(V_), "lane",
            [&](Value* k) { EmitElementInRange(n, b_.CreateAdd(f0, k)); },
            /*unroll=*/false);
        return;
      }
      for (int k = 0; k < V_; ++k)
        EmitElementInRange(n, b_.CreateAdd(f0, b_.getInt64(k)));
    };
    if (outer_dims_.empty() || V_ == 1) {
      scalar_elements();
      return;
    }
    const int last = outer_dims_.back();
    auto group = [&] {
      EmitIf(b_.CreateICmpULT(f0, n), [&] {
        Decompose(f0, outer_dims_);
        group_ = 0;
        group_loads_.assign(1, {});
        if (plan_.lane_loop) {
          EmitGroupLaneLoop(last, vars_[last]);
          return;
        }
        EmitGroupLanes(last);
      });
    };
    EmitIfElse(Grouped(), group, scalar_elements);
  }

  // A group whose lanes run in a loop (plan_.lane_loop): the vector loads
  // and the vector stores' offsets are lane 0's, set up before the loop;
  // each iteration selects its lane out of the loaded vectors and into the
  // stores' lane slots; the stores are written after the loop.
  void EmitGroupLaneLoop(int last, Value* first) {
    memo_.emplace_back();
    lane_ = 0;
    vars_[last] = first;
    for (const Expr& e : vector_load_order_)
      group_loads_[0].emplace(e.get(), LoadGroupVector(e));
    for (size_t s = 0; s < kernel_.stages.size(); ++s) {
      const Stage& st = kernel_.stages[s];
      if (st.kind == Stage::Kind::kReduce || !vector_store_[s]) continue;
      PendingStore& ps = pending_[s];
      ps.offset = EmitExpr(st.offset);
      ps.lane_slots.clear();
      llvm::Type* ty = StorageType(st.store_dtype);
      for (int k = 0; k < V_; ++k) {
        ps.lane_slots.push_back(EntryAlloca(ty, "lane"));
        b_.CreateStore(llvm::Constant::getNullValue(ty), ps.lane_slots[k]);
      }
    }
    memo_.pop_back();
    EmitLoop(
        b_.getInt64(0), b_.getInt64(V_), "lane",
        [&](Value* k) {
          loop_lane_ = k;
          vars_[last] = b_.CreateAdd(first, k);
          EmitPointwiseStages(nullptr);
          loop_lane_ = nullptr;
        },
        /*unroll=*/false);
    for (size_t s = 0; s < kernel_.stages.size(); ++s) {
      const Stage& st = kernel_.stages[s];
      if (st.kind == Stage::Kind::kReduce || !vector_store_[s]) continue;
      PendingStore& ps = pending_[s];
      ps.lanes.clear();
      for (llvm::AllocaInst* slot : ps.lane_slots)
        ps.lanes.push_back(b_.CreateLoad(slot->getAllocatedType(), slot));
      FlushGroupStore(st, ps, nullptr);
    }
    lane_ = -1;
  }

  void EmitPointwiseStages(Value* valid) {
    EmitStages(
        [&](const Stage& st, int slot, DType vdtype, Value* acc, Value* pos) {
          // A reduction over no dims (every reduced dim was dropped): one
          // element per output, no other thread involved.
          Accumulate(st, vdtype, nullptr, &acc, &pos);
          SetReduceResult(st, slot, acc, pos);
        },
        [&](const Stage& st, size_t s) { EmitGroupStore(st, s, valid); });
  }

  // ---- rows ----

  void EmitRows() {
    const int t = plan_.threads_per_row;
    lt_ = t == plan_.block_threads ? tid_
                                   : b_.CreateURem(tid_, b_.getInt64(t), "lt");
    Value* row =
        b_.CreateAdd(b_.CreateMul(bid_, b_.getInt64(plan_.items_per_block)),
                     b_.CreateUDiv(tid_, b_.getInt64(t)), "row");
    Value* rows = Product(outer_dims_);
    auto* body = llvm::BasicBlock::Create(ctx_, "row", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "row.done", fn_);
    // Uniform per row group: a block (or a warp for warp-per-row) leaves
    // together, so barriers stay matched.
    b_.CreateCondBr(b_.CreateICmpULT(row, rows), body, done);
    b_.SetInsertPoint(body);
    memo_.emplace_back();
    Decompose(row, outer_dims_);
    if (plan_.form == Form::kPersistentRow) {
      EmitPersistentRow();
    } else {
      EmitLoopedRow();
    }
    memo_.pop_back();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // Element e = j * V + k of this thread: inner flat index
  // (lt + j * T) * V + k, clamped to 0 for groups past the row's end (their
  // values are computed but never used).
  void EmitPersistentRow() {
    const int t = plan_.threads_per_row;
    const int j_count = plan_.groups_per_thread;
    const int64_t groups = plan_.row_size / V_;
    group_loads_.assign(j_count, {});
    valid_.assign(j_count, nullptr);
    elem_vars_.assign(j_count * V_, {});
    elem_memo_.assign(j_count * V_, {});
    for (int j = 0; j < j_count; ++j) {
      Value* g = b_.CreateAdd(lt_, b_.getInt64(int64_t{j} * t));
      if ((int64_t{j} + 1) * t > groups) {
        valid_[j] = b_.CreateICmpULT(g, b_.getInt64(groups));
        g = b_.CreateSelect(valid_[j], g, b_.getInt64(0));
      }
      Value* base = b_.CreateMul(g, b_.getInt64(V_));
      Decompose(base, inner_dims_);
      Value* first = vars_[inner_dims_.back()];
      for (int k = 0; k < V_; ++k) {
        std::vector<Value*>& ev = elem_vars_[j * V_ + k];
        for (int d : inner_dims_) ev.push_back(vars_[d]);
        if (k > 0) ev.back() = b_.CreateAdd(first, b_.getInt64(k));
      }
    }
    EmitStages(
        [&](const Stage& st, int slot, DType vdtype, Value* acc, Value* pos) {
          if (!IsArgReduce(st.reduce)) {
            ForEachElement(
                [&](int j) { Accumulate(st, vdtype, valid_[j], &acc, &pos); });
            FinishReduce(st, slot, vdtype, acc, pos);
            return;
          }
          // argmax/argmin: the selects keep the winning element's number
          // e = j * V + k, a constant, and it becomes the row position once,
          // after the loop. Keeping the 64-bit positions of every element
          // live instead took 64 registers for a row of 32 per thread: a
          // 1024-thread block then spilled and ran one block per SM.
          pos = b_.getInt32(0);
          ForEachElement([&](int j) {
            const int e = j * V_ + std::max(lane_, 0);
            Accumulate(st, vdtype, valid_[j], &acc, &pos, b_.getInt32(e));
          });
          Value* e = b_.CreateZExt(pos, b_.getInt64Ty());
          Value* v = b_.getInt64(V_);
          Value* group = b_.CreateAdd(
              lt_, b_.CreateMul(b_.CreateUDiv(e, v), b_.getInt64(t)));
          pos = b_.CreateAdd(b_.CreateMul(group, v), b_.CreateURem(e, v));
          FinishReduce(st, slot, vdtype, acc, pos);
        },
        [&](const Stage& st, size_t s) {
          if (st.kind == Stage::Kind::kStoreInner) {
            ForEachElement([&](int j) { EmitGroupStore(st, s, valid_[j]); });
          } else {
            StoreOuter(st);
          }
        });
  }

  void ForEachElement(const std::function<void(int)>& body) {
    for (int j = 0; j < plan_.groups_per_thread; ++j) {
      group_ = j;
      for (int k = 0; k < V_; ++k) {
        const int e = j * V_ + k;
        for (size_t i = 0; i < inner_dims_.size(); ++i)
          vars_[inner_dims_[i]] = elem_vars_[e][i];
        lane_ = V_ > 1 ? k : -1;
        memo_.push_back(std::move(elem_memo_[e]));
        body(j);
        elem_memo_[e] = std::move(memo_.back());
        memo_.pop_back();
      }
    }
    lane_ = -1;
  }

  void EmitLoopedRow() {
    const int t = plan_.threads_per_row;
    Value* row_size = Product(inner_dims_);
    EmitStages(
        [&](const Stage& st, int slot, DType vdtype, Value* acc, Value* pos) {
          LoopedReduce(st, slot, vdtype, acc, pos, row_size, t, 1);
        },
        [&](const Stage& st, size_t s) {
          if (st.kind == Stage::Kind::kStoreInner) {
            EmitStridedLoop(lt_, row_size, t, [&](Value* i) {
              Decompose(i, inner_dims_);
              EmitGroupStore(st, s, nullptr);
            });
          } else {
            StoreOuter(st);
          }
        });
  }

  // ---- columns ----

  // Lane x of warp y takes row bid * kColumnRows + x and elements y, y + T,
  // ... of it (T threads a row), kColumnUnroll at a time: loads of a warp
  // are adjacent along the rows. Rows past the end read row 0 and store
  // nothing, so that every thread reaches the block's barriers.
  void EmitColumns() {
    const int t = plan_.threads_per_row;
    const int64_t lanes = plan_.items_per_block;
    Value* x = b_.CreateURem(tid_, b_.getInt64(lanes), "x");
    lt_ = b_.CreateUDiv(tid_, b_.getInt64(lanes), "y");
    column_lane_ = x;
    Value* row = b_.CreateAdd(b_.CreateMul(bid_, b_.getInt64(lanes)), x, "row");
    Value* rows = Product(outer_dims_);
    row_valid_ = b_.CreateICmpULT(row, rows);
    // No rows (an empty tensor): no row 0 to read either. Uniform, so the
    // block's barriers stay matched.
    auto* body = llvm::BasicBlock::Create(ctx_, "columns", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "columns.done", fn_);
    b_.CreateCondBr(b_.CreateICmpUGT(rows, b_.getInt64(0)), body, done);
    b_.SetInsertPoint(body);
    memo_.emplace_back();
    Decompose(b_.CreateSelect(row_valid_, row, b_.getInt64(0)), outer_dims_);
    Value* row_size = Product(inner_dims_);
    const int u = plan_.groups_per_thread;
    EmitStages(
        [&](const Stage& st, int slot, DType vdtype, Value* acc, Value* pos) {
          LoopedReduce(st, slot, vdtype, acc, pos, row_size, t, u);
        },
        [&](const Stage& st, size_t) { StoreOuter(st); });
    memo_.pop_back();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  // The T partials of each row (one per warp, at the lane of the row)
  // combined in warp order through shared memory; every thread of the row
  // gets the result.
  void ColumnReduce(ReduceKind k, DType d, Value** acc, Value** pos) {
    const int t = plan_.threads_per_row;
    const int64_t lanes = plan_.items_per_block;
    const bool arg = IsArgReduce(k);
    if (!column_val_) column_val_ = SharedArray("column_val", t * lanes);
    if (arg && !column_pos_) column_pos_ = SharedArray("column_pos", t * lanes);
    auto* ty = llvm::ArrayType::get(b_.getInt64Ty(), t * lanes);
    auto slot = [&](llvm::GlobalVariable* g, Value* i) {
      return b_.CreateInBoundsGEP(ty, g, {b_.getInt64(0), i});
    };
    Barrier();  // the previous reduction's readers are done
    Value* mine =
        b_.CreateAdd(b_.CreateMul(lt_, b_.getInt64(lanes)), column_lane_);
    b_.CreateStore(ToBits64(*acc), slot(column_val_, mine));
    if (arg) b_.CreateStore(*pos, slot(column_pos_, mine));
    Barrier();
    llvm::Type* vty = (*acc)->getType();
    Value* a = nullptr;
    Value* p = b_.getInt64(0);
    for (int w = 0; w < t; ++w) {
      Value* i = b_.CreateAdd(b_.getInt64(int64_t{w} * lanes), column_lane_);
      Value* v =
          FromBits64(b_.CreateLoad(b_.getInt64Ty(), slot(column_val_, i)), vty);
      Value* pv =
          arg ? b_.CreateLoad(b_.getInt64Ty(), slot(column_pos_, i)) : nullptr;
      if (w == 0) {
        a = v;
        p = arg ? pv : p;
      } else {
        TreeCombine(k, d, &a, &p, v, pv);
      }
    }
    *acc = a;
    *pos = p;
  }

  llvm::GlobalVariable* SharedArray(const char* name, int64_t elements) {
    auto* ty = llvm::ArrayType::get(b_.getInt64Ty(), elements);
    return new llvm::GlobalVariable(  // owned by the module
        m_, ty, false, llvm::GlobalValue::InternalLinkage,
        llvm::UndefValue::get(ty), absl::StrCat(kernel_.name, "_", name),
        nullptr, llvm::GlobalValue::NotThreadLocal, kShared);
  }

  // One reduction stage over this thread's elements lt_, lt_ + step, ... of
  // the row (of `row_size` elements), `unroll` of them per iteration (all
  // but the first checked against the row's end), then across the row's
  // threads (FinishReduce).
  void LoopedReduce(const Stage& st, int slot, DType vdtype, Value* acc0,
                    Value* pos0, Value* row_size, int64_t step, int unroll) {
    llvm::AllocaInst* acc = EntryAlloca(acc0->getType(), "acc");
    llvm::AllocaInst* pos = EntryAlloca(b_.getInt64Ty(), "pos");
    b_.CreateStore(acc0, acc);
    b_.CreateStore(pos0, pos);
    EmitStridedLoop(lt_, row_size, step * unroll, [&](Value* i) {
      Value* a = b_.CreateLoad(acc0->getType(), acc);
      Value* p = b_.CreateLoad(b_.getInt64Ty(), pos);
      for (int k = 0; k < unroll; ++k) {
        Value* e = k == 0 ? i : b_.CreateAdd(i, b_.getInt64(k * step));
        Value* in = k == 0 ? nullptr : b_.CreateICmpULT(e, row_size);
        memo_.emplace_back();
        Decompose(in ? b_.CreateSelect(in, e, b_.getInt64(0)) : e, inner_dims_);
        Accumulate(st, vdtype, in, &a, &p);
        memo_.pop_back();
      }
      b_.CreateStore(a, acc);
      b_.CreateStore(p, pos);
    });
    FinishReduce(st, slot, vdtype, b_.CreateLoad(acc0->getType(), acc),
                 b_.CreateLoad(b_.getInt64Ty(), pos));
  }

  llvm::AllocaInst* EntryAlloca(llvm::Type* ty, const char* name) {
    llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
    b_.SetInsertPoint(entry_, entry_->begin());
    llvm::AllocaInst* a = b_.CreateAlloca(ty, nullptr, name);
    b_.restoreIP(saved);
    return a;
  }

  // for (i = lo; i < hi; i += step) body(i), unsigned
  void EmitStridedLoop(Value* lo, Value* hi, int64_t step,
                       const std::function<void(Value*)>& body) {
    EmitLoopSkeleton(lo, hi, /*is_signed=*/false,
                     {"loop", "loop.body", "loop.exit", "i"}, [&](Value* i) {
                       body(i);
                       return b_.CreateAdd(i, b_.getInt64(step));
                     });
  }

  // Once per row: every thread computes the value (cheap), thread 0 stores
  // (of a row that exists: row_valid_ in the column form).
  void StoreOuter(const Stage& st) {
    Value* v = ToStorage(
        ConvertValue(EmitExpr(st.value), st.value->dtype, st.store_dtype),
        st.store_dtype);
    Value* off = EmitExpr(st.offset);
    Value* first = b_.CreateICmpEQ(lt_, b_.getInt64(0));
    if (row_valid_) first = b_.CreateAnd(first, row_valid_);
    EmitIf(first, [&] { StoreRaw(st.buffer_slot, off, v, st.store_dtype); });
  }

  // ---- reductions ----

  // A reduction stage's emitter: the stage, its accumulator slot, the dtype
  // it reduces in, and the accumulator and position to start from (the
  // reduction's identity, position 0).
  using ReduceStageFn = std::function<void(
      const Stage& st, int slot, DType vdtype, Value* acc, Value* pos)>;

  // The stages in order (ForEachStage), each reduction started.
  void EmitStages(const ReduceStageFn& reduce,
                  const std::function<void(const Stage&, size_t)>& store) {
    ForEachStage(
        [&](const Stage& st, int slot) {
          const DType vdtype =
              IsArgReduce(st.reduce) ? st.value->dtype : st.acc_dtype;
          reduce(st, slot, vdtype, InitValue(st.reduce, vdtype),
                 b_.getInt64(0));
        },
        store);
  }

  // `position`: what an argmax/argmin records for this element; null: its
  // row position (InnerPosition).
  void Accumulate(const Stage& st, DType vdtype, Value* valid, Value** acc,
                  Value** pos, Value* position = nullptr) {
    Value* v = ConvertValue(EmitExpr(st.value), st.value->dtype, vdtype);
    Value* take = nullptr;
    Value* next = CombineStep(st.reduce, vdtype, *acc, v, &take);
    Value* next_pos = *pos;
    if (IsArgReduce(st.reduce))
      next_pos =
          b_.CreateSelect(take, position ? position : InnerPosition(), *pos);
    if (valid) {
      next = b_.CreateSelect(valid, next, *acc);
      next_pos = b_.CreateSelect(valid, next_pos, *pos);
    }
    *acc = next;
    *pos = next_pos;
  }

  // Combines partial results of two threads; for argmax/argmin equal values
  // (or two NaNs) keep the smaller position.
  void TreeCombine(ReduceKind k, DType d, Value** a, Value** pa, Value* b,
                   Value* pb) {
    Value* take = nullptr;
    Value* v = CombineStep(k, d, *a, b, &take);
    if (!IsArgReduce(k)) {
      *a = v;
      return;
    }
    Value* eq = IsFloating(d)
                    ? b_.CreateOr(b_.CreateFCmpOEQ(*a, b),
                                  b_.CreateAnd(b_.CreateFCmpUNO(*a, *a),
                                               b_.CreateFCmpUNO(b, b)))
                    : b_.CreateICmpEQ(*a, b);
    take = b_.CreateOr(take, b_.CreateAnd(eq, b_.CreateICmpSLT(pb, *pa)));
    *a = b_.CreateSelect(take, b, *a);
    *pa = b_.CreateSelect(take, pb, *pa);
  }

  Value* ShuffleXor(Value* v, int lane_mask) {
    auto shfl32 = [&](Value* x) {
      return b_.CreateIntrinsic(
          llvm::Intrinsic::nvvm_shfl_sync_bfly_i32, {},
          {b_.getInt32(-1), x, b_.getInt32(lane_mask), b_.getInt32(0x1f)});
    };
    llvm::Type* ty = v->getType();
    if (ty->isFloatTy()) {
      return b_.CreateBitCast(shfl32(b_.CreateBitCast(v, b_.getInt32Ty())), ty);
    }
    if (ty->isIntegerTy(64)) {
      Value* lo = shfl32(b_.CreateTrunc(v, b_.getInt32Ty()));
      Value* hi = shfl32(b_.CreateTrunc(b_.CreateLShr(v, 32), b_.getInt32Ty()));
      return b_.CreateOr(b_.CreateZExt(lo, ty),
                         b_.CreateShl(b_.CreateZExt(hi, ty), 32));
    }
    if (ty->isIntegerTy(32)) return shfl32(v);
    return b_.CreateTrunc(shfl32(b_.CreateZExt(v, b_.getInt32Ty())), ty);
  }

  Value* ToBits64(Value* v) {
    llvm::Type* ty = v->getType();
    if (ty->isFloatTy())
      return b_.CreateZExt(b_.CreateBitCast(v, b_.getInt32Ty()),
                           b_.getInt64Ty());
    return b_.CreateZExtOrTrunc(v, b_.getInt64Ty());
  }
  Value* FromBits64(Value* bits, llvm::Type* ty) {
    if (ty->isFloatTy())
      return b_.CreateBitCast(b_.CreateTrunc(bits, b_.getInt32Ty()), ty);
    return b_.CreateTrunc(bits, ty);
  }

  llvm::GlobalVariable* SharedSlots(const char* name) {
    return SharedArray(name, 32);
  }

  void Barrier() { b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {}); }

  // Reduces (acc, pos) across the row's threads; every thread gets the
  // result.
  void CrossThreadReduce(ReduceKind k, DType d, Value** acc, Value** pos) {
    if (plan_.form == Form::kColumn) {
      ColumnReduce(k, d, acc, pos);
      return;
    }
    if (plan_.threads_per_row == 1) return;  // the row is this thread's
    const bool arg = IsArgReduce(k);
    auto warp_reduce = [&] {
      for (int m = 16; m >= 1; m /= 2) {
        Value* other = ShuffleXor(*acc, m);
        Value* other_pos = arg ? ShuffleXor(*pos, m) : nullptr;
        TreeCombine(k, d, acc, pos, other, other_pos);
      }
    };
    warp_reduce();
    if (plan_.threads_per_row <= 32) return;
    if (!smem_val_) {
      smem_val_ = SharedSlots("smem_val");
      smem_pos_ = SharedSlots("smem_pos");
    }
    auto* slots_ty = llvm::ArrayType::get(b_.getInt64Ty(), 32);
    auto slot_ptr = [&](llvm::GlobalVariable* g, Value* i) {
      return b_.CreateInBoundsGEP(slots_ty, g, {b_.getInt64(0), i});
    };
    Value* warp = b_.CreateLShr(lt_, 5);
    Value* lane = b_.CreateAnd(lt_, 31);
    Barrier();  // the previous reduction's readers are done
    Value* a = *acc;
    Value* p = *pos;
    EmitIf(b_.CreateICmpEQ(lane, b_.getInt64(0)), [&] {
      b_.CreateStore(ToBits64(a), slot_ptr(smem_val_, warp));
      if (arg) b_.CreateStore(p, slot_ptr(smem_pos_, warp));
    });
    Barrier();
    // Every warp reduces the per-warp partials itself: no second broadcast.
    Value* in = b_.CreateICmpULT(lane, b_.getInt64(plan_.threads_per_row / 32));
    Value* idx = b_.CreateSelect(in, lane, b_.getInt64(0));
    llvm::Type* ty = (*acc)->getType();
    Value* v = FromBits64(
        b_.CreateLoad(b_.getInt64Ty(), slot_ptr(smem_val_, idx)), ty);
    *acc = b_.CreateSelect(in, v, InitValue(k, d));
    if (arg) {
      Value* pv = b_.CreateLoad(b_.getInt64Ty(), slot_ptr(smem_pos_, idx));
      *pos = b_.CreateSelect(in, pv, b_.getInt64(0));
    }
    warp_reduce();
  }

  void FinishReduce(const Stage& st, int slot, DType vdtype, Value* acc,
                    Value* pos) {
    CrossThreadReduce(st.reduce, vdtype, &acc, &pos);
    SetReduceResult(st, slot, acc, pos);
  }

  void SetReduceResult(const Stage& st, int slot, Value* acc, Value* pos) {
    const bool arg = IsArgReduce(st.reduce);
    SetAccValue(slot, arg ? pos : acc, arg ? DType::kInt64 : st.acc_dtype);
    if (st.finalize)
      SetAccValue(slot, EmitExpr(st.finalize), st.finalize->dtype);
  }

  struct PendingStore {
    Value* offset = nullptr;
    std::vector<Value*> lanes;
    std::vector<llvm::AllocaInst*> lane_slots;  // lane loops
  };

  const CudaCodegenOptions& options_;
  // The 16-bit bits each converted float came from (the conversions above;
  // no emitter erases an instruction, so a key names one value throughout).
  absl::flat_hash_map<Value*, Value*> half_bits_, bfloat16_bits_;
  const GpuKernelPlan& plan_;
  const int V_;  // group size (plan_.vector_width)
  Value* tid_ = nullptr;
  Value* bid_ = nullptr;
  Value* lt_ = nullptr;  // thread index within the row
  int group_var_ = -1;   // the var consecutive lanes of a group step along
  Value* vec_ok_ = nullptr;
  // A scatter kernel's ScatterTargetNonEmpty (entry block), or null.
  Value* scatter_nonempty_ = nullptr;
  absl::flat_hash_map<const ExprNode*, bool> vector_loads_;
  std::vector<bool> vector_store_;  // per stage
  int lane_ = -1;                   // lane within the current group; -1: none
  Value* loop_lane_ = nullptr;      // lane index in a lane loop (lane_ is 0)
  std::vector<Expr> vector_load_order_;  // vector candidates, first use order
  int group_ = 0;
  std::vector<absl::flat_hash_map<const ExprNode*, Value*>> group_loads_;
  absl::flat_hash_map<size_t, PendingStore> pending_;
  std::vector<Value*> valid_;  // per group of the thread (null: always)
  std::vector<std::vector<Value*>> elem_vars_;
  std::vector<absl::flat_hash_map<const ExprNode*, Value*>> elem_memo_;
  llvm::GlobalVariable* smem_val_ = nullptr;
  llvm::GlobalVariable* smem_pos_ = nullptr;
  // The column form: the thread's lane (its row within the block), whether
  // that row exists, and the shared partials.
  Value* column_lane_ = nullptr;
  Value* row_valid_ = nullptr;
  llvm::GlobalVariable* column_val_ = nullptr;
  llvm::GlobalVariable* column_pos_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<llvm::Module>> EmitCudaModule(
    const FusedProgram& program, const std::vector<GpuKernelPlan>& plans,
    llvm::LLVMContext& context, const CudaCodegenOptions& options) {
  if (plans.size() != program.kernels.size()) {
    return absl::InternalError(
        absl::StrCat("EmitCudaModule: ", plans.size(), " plans for ",
                     program.kernels.size(), " kernels"));
  }
  return EmitKernelModule(
      context, program.kernels.size(), [&](llvm::Module& module, size_t k) {
        if (program.kernels[k].is_extern()) return absl::OkStatus();
        return CudaKernelEmitter(module, program, program.kernels[k], options,
                                 plans[k])
            .Emit();
      });
}

}  // namespace kiln
