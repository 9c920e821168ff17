// The CPU back end end to end with real LLVM, real lld and real execution:
// hand-built IR -> MakeTargetMachine -> OptimizeModule -> EmitObject ->
// LinkSharedObject -> LoadedLibrary -> call.
#include "compiler/cpu_backend.h"

#include <dirent.h>
#include <link.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compiler/promote_half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/Intrinsics.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Support/raw_ostream.h"
#include "runtime/cpu_loader.h"
#include "support/half.h"
#include "support/sha256.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// ---------------------------------------------------------------------------
// Hand-built kernels.

using BodyFn = std::function<llvm::Value*(llvm::IRBuilder<>&,
                                          const std::vector<llvm::Value*>&)>;

// void name(float* in0, ..., float* in{arity-1}, float* out, int64 n):
//   for (i = 0; i < n; ++i) out[i] = body(in0[i], ...);
void AddMap(llvm::Module& module, const std::string& name, int arity,
            const BodyFn& body, bool fast = false) {
  llvm::LLVMContext& ctx = module.getContext();
  llvm::IRBuilder<> b(ctx);
  std::vector<llvm::Type*> params(arity + 1, b.getPtrTy());
  params.push_back(b.getInt64Ty());
  llvm::Function* fn = llvm::Function::Create(
      llvm::FunctionType::get(b.getVoidTy(), params, false),
      llvm::Function::ExternalLinkage, name, module);
  for (int i = 0; i <= arity; ++i) {
    fn->addParamAttr(i, llvm::Attribute::NoAlias);
  }
  llvm::BasicBlock* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  llvm::BasicBlock* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  llvm::Value* n = fn->getArg(arity + 1);
  b.SetInsertPoint(entry);
  b.CreateCondBr(b.CreateICmpSGT(n, b.getInt64(0)), loop, exit);
  b.SetInsertPoint(loop);
  if (fast) b.setFastMathFlags(llvm::FastMathFlags::getFast());
  llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2, "i");
  i->addIncoming(b.getInt64(0), entry);
  std::vector<llvm::Value*> args;
  for (int k = 0; k < arity; ++k) {
    args.push_back(b.CreateLoad(
        b.getFloatTy(), b.CreateInBoundsGEP(b.getFloatTy(), fn->getArg(k), i)));
  }
  b.CreateStore(body(b, args),
                b.CreateInBoundsGEP(b.getFloatTy(), fn->getArg(arity), i));
  llvm::Value* next = b.CreateAdd(i, b.getInt64(1), "", true, true);
  i->addIncoming(next, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, n), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
}

// float name(float* in, int64 n): sum of in[0..n).
void AddSum(llvm::Module& module, const std::string& name) {
  llvm::LLVMContext& ctx = module.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Function* fn = llvm::Function::Create(
      llvm::FunctionType::get(b.getFloatTy(), {b.getPtrTy(), b.getInt64Ty()},
                              false),
      llvm::Function::ExternalLinkage, name, module);
  llvm::BasicBlock* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  llvm::BasicBlock* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  llvm::Value* n = fn->getArg(1);
  b.SetInsertPoint(entry);
  b.CreateCondBr(b.CreateICmpSGT(n, b.getInt64(0)), loop, exit);
  b.SetInsertPoint(loop);
  llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2, "i");
  llvm::PHINode* acc = b.CreatePHI(b.getFloatTy(), 2, "acc");
  i->addIncoming(b.getInt64(0), entry);
  acc->addIncoming(llvm::ConstantFP::get(b.getFloatTy(), 0.0), entry);
  llvm::Value* x = b.CreateLoad(
      b.getFloatTy(), b.CreateInBoundsGEP(b.getFloatTy(), fn->getArg(0), i));
  llvm::Value* sum = b.CreateFAdd(acc, x);
  llvm::Value* next = b.CreateAdd(i, b.getInt64(1), "", true, true);
  i->addIncoming(next, loop);
  acc->addIncoming(sum, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, n), loop, exit);
  b.SetInsertPoint(exit);
  llvm::PHINode* result = b.CreatePHI(b.getFloatTy(), 2);
  result->addIncoming(llvm::ConstantFP::get(b.getFloatTy(), 0.0), entry);
  result->addIncoming(sum, loop);
  b.CreateRet(result);
}

// int64 name(): returns value.
void AddConstant(llvm::Module& module, const std::string& name, int64_t value) {
  llvm::IRBuilder<> b(module.getContext());
  llvm::Function* fn =
      llvm::Function::Create(llvm::FunctionType::get(b.getInt64Ty(), false),
                             llvm::Function::ExternalLinkage, name, module);
  b.SetInsertPoint(llvm::BasicBlock::Create(module.getContext(), "", fn));
  b.CreateRet(b.getInt64(value));
}

// A libm function `name` of `arity` floats, declared as clang does with
// -fno-math-errno.
llvm::FunctionCallee MathFunction(llvm::Module& module, const std::string& name,
                                  int arity) {
  llvm::Type* f32 = llvm::Type::getFloatTy(module.getContext());
  llvm::FunctionCallee callee = module.getOrInsertFunction(
      name, llvm::FunctionType::get(f32, std::vector<llvm::Type*>(arity, f32),
                                    false));
  auto* fn = llvm::cast<llvm::Function>(callee.getCallee());
  fn->setDoesNotAccessMemory();
  fn->setDoesNotThrow();
  fn->setWillReturn();
  return callee;
}

llvm::Value* Intrinsic1(llvm::IRBuilder<>& b, llvm::Intrinsic::ID id,
                        llvm::Value* x) {
  return b.CreateUnaryIntrinsic(id, x);
}

// add_arrays, exp_arrays, zero_fill, sum_array.
std::unique_ptr<llvm::Module> BasicKernels(llvm::LLVMContext& ctx) {
  auto module = std::make_unique<llvm::Module>("basic_kernels", ctx);
  AddMap(*module, "add_arrays", 2,
         [](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& x) {
           return b.CreateFAdd(x[0], x[1]);
         });
  AddMap(
      *module, "exp_arrays", 1,
      [](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& x) {
        return Intrinsic1(b, llvm::Intrinsic::exp, x[0]);
      },
      /*fast=*/true);
  AddMap(*module, "zero_fill", 0,
         [](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>&) {
           return llvm::ConstantFP::get(b.getFloatTy(), 0.0);
         });
  AddSum(*module, "sum_array");
  return module;
}

std::string FunctionIr(const llvm::Module& module, const std::string& name) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module.getFunction(name)->print(os);
  os.flush();
  return text;
}

v1::CpuTarget Target(const std::string& cpu, const std::string& features) {
  v1::CpuTarget target;
  target.set_triple(HostCpuTarget().triple());
  target.set_cpu(cpu);
  target.set_features(features);
  return target;
}

// Wall-clock and this thread's CPU time of a phase, in milliseconds. The CPU
// time is what the phase costs on an idle machine (all phases are
// single-threaded; lld runs with --threads=1).
struct Phase {
  double wall = 0, cpu = 0;
};

class Stopwatch {
 public:
  Stopwatch() { Restart(); }
  // Returns the time since the last Restart() and restarts.
  Phase Lap() {
    const Phase phase = {std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - wall_)
                             .count(),
                         (ThreadCpuNs() - cpu_ns_) / 1e6};
    Restart();
    return phase;
  }

 private:
  static int64_t ThreadCpuNs() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  }
  void Restart() {
    wall_ = std::chrono::steady_clock::now();
    cpu_ns_ = ThreadCpuNs();
  }
  std::chrono::steady_clock::time_point wall_;
  int64_t cpu_ns_;
};

struct Timings {
  Phase target_machine, optimize, emit, link, load;
};

// Optimise, emit and link `module` for `target`; returns the .so bytes.
absl::StatusOr<std::string> CompileToSo(llvm::Module& module,
                                        const v1::CpuTarget& target,
                                        bool fast_math = true,
                                        Timings* timings = nullptr,
                                        const LinkOptions& link = {}) {
  Timings ignored;
  if (timings == nullptr) timings = &ignored;
  Stopwatch watch;
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(target);
  if (!tm.ok()) return tm.status();
  timings->target_machine = watch.Lap();
  if (absl::Status s = OptimizeModule(module, **tm, fast_math); !s.ok()) {
    return s;
  }
  timings->optimize = watch.Lap();
  absl::StatusOr<std::string> object = EmitObject(module, **tm);
  if (!object.ok()) return object.status();
  timings->emit = watch.Lap();
  absl::StatusOr<std::string> so = LinkSharedObject({*object}, link);
  timings->link = watch.Lap();
  return so;
}

LoadedLibrary LoadOrDie(const std::string& so) {
  absl::StatusOr<LoadedLibrary> lib = LoadedLibrary::Load(so, Sha256(so));
  EXPECT_TRUE(lib.ok()) << lib.status();
  return *std::move(lib);
}

template <typename Fn>
Fn* FunctionOrDie(const LoadedLibrary& lib, const std::string& name) {
  absl::StatusOr<void*> sym = lib.Symbol(name);
  EXPECT_TRUE(sym.ok()) << sym.status();
  return reinterpret_cast<Fn*>(sym.ok() ? *sym : nullptr);
}

using MapFn1 = void(const float*, float*, int64_t);
using MapFn2 = void(const float*, const float*, float*, int64_t);

int LoadedObjectCount() {
  int count = 0;
  dl_iterate_phdr(
      [](dl_phdr_info*, size_t, void* data) {
        ++*static_cast<int*>(data);
        return 0;
      },
      &count);
  return count;
}

int DirEntryCount(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") ++count;
  }
  closedir(dir);
  return count;
}

// ---------------------------------------------------------------------------
// MakeTargetMachine.

TEST(MakeTargetMachineTest, HostTargetWorks) {
  const v1::CpuTarget host = HostCpuTarget();
  EXPECT_FALSE(host.triple().empty());
  EXPECT_FALSE(host.cpu().empty());
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(host);
  ASSERT_TRUE(tm.ok()) << tm.status();
  EXPECT_EQ((*tm)->getTargetCPU(), host.cpu());
  EXPECT_TRUE((*tm)->isPositionIndependent());
  EXPECT_EQ((*tm)->getOptLevel(), llvm::CodeGenOpt::Aggressive);
}

TEST(MakeTargetMachineTest, BadTripleIsInvalidArgument) {
  v1::CpuTarget target = Target("x86-64-v3", "");
  target.set_triple("nonsense-kiln-triple");
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(target);
  EXPECT_EQ(tm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tm.status().message(), HasSubstr("nonsense-kiln-triple"));

  target.set_triple("aarch64-unknown-linux-gnu");  // not registered
  tm = MakeTargetMachine(target);
  EXPECT_EQ(tm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tm.status().message(), HasSubstr("aarch64-unknown-linux-gnu"));

  target.set_triple("x86_64-apple-macosx");  // Mach-O
  tm = MakeTargetMachine(target);
  EXPECT_EQ(tm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tm.status().message(), HasSubstr("ELF"));
}

TEST(MakeTargetMachineTest, BadCpuOrFeatureIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(Target("pentium-kiln-9000", ""));
  EXPECT_EQ(tm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tm.status().message(), HasSubstr("pentium-kiln-9000"));

  tm = MakeTargetMachine(Target("x86-64-v3", "+avx2,+kiln-turbo"));
  EXPECT_EQ(tm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tm.status().message(), HasSubstr("+kiln-turbo"));

  tm = MakeTargetMachine(Target("x86-64-v3", "avx2"));
  EXPECT_EQ(tm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tm.status().message(), HasSubstr("+name or -name"));

  EXPECT_TRUE(MakeTargetMachine(Target("", "")).ok());
  EXPECT_TRUE(MakeTargetMachine(Target("skylake-avx512", "-avx512f")).ok());
}

// ---------------------------------------------------------------------------
// OptimizeModule.

// The O3 pipeline with libmvec turns the scalar llvm.exp.f32 loop into calls
// of the vector variant the target can run.
TEST(OptimizeModuleTest, VectorisesExpWithLibmvec) {
  struct Case {
    std::string cpu, features, expect, reject;
  };
  const Case cases[] = {
      {"x86-64-v3", "", "_ZGVdN8v_expf", "_ZGVeN"},
      {"x86-64", "+avx2,+fma", "_ZGVdN8v_expf", "_ZGVeN"},
      {"x86-64", "", "_ZGVbN4v_expf", "_ZGVdN"},
      // AVX without AVX2: the AVX ('c') variant, never the AVX2 one.
      {"sandybridge", "", "_ZGVcN8v_expf", "_ZGVdN"},
      // 512-bit vectors (the epilogue loop may use the AVX2 variant).
      {"x86-64-v4", "-prefer-256-bit", "_ZGVeN16v_expf", "_ZGVcN"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.cpu + " " + c.features);
    llvm::LLVMContext ctx;
    std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
    absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
        MakeTargetMachine(Target(c.cpu, c.features));
    ASSERT_TRUE(tm.ok()) << tm.status();
    ASSERT_TRUE(OptimizeModule(*module, **tm, /*fast_math=*/false).ok());
    const std::string ir = FunctionIr(*module, "exp_arrays");
    EXPECT_THAT(ir, HasSubstr(c.expect)) << ir;
    EXPECT_THAT(ir, Not(HasSubstr(c.reject))) << ir;
    EXPECT_EQ(module->getTargetTriple(), (*tm)->getTargetTriple().str());
  }
}

// fast_math adds `reassoc`: the float sum vectorises only with it.
TEST(OptimizeModuleTest, FastMathVectorisesFloatReductions) {
  for (bool fast_math : {false, true}) {
    llvm::LLVMContext ctx;
    std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
    absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
        MakeTargetMachine(Target("x86-64-v3", ""));
    ASSERT_TRUE(tm.ok()) << tm.status();
    ASSERT_TRUE(OptimizeModule(*module, **tm, fast_math).ok());
    const std::string ir = FunctionIr(*module, "sum_array");
    EXPECT_EQ(absl::StrContains(ir, "fadd reassoc"), fast_math) << ir;
    EXPECT_EQ(absl::StrContains(ir, "<8 x float>"), fast_math) << ir;
  }
}

TEST(OptimizeModuleTest, InvalidIrIsInvalidArgument) {
  llvm::LLVMContext ctx;
  llvm::Module module("broken", ctx);
  llvm::IRBuilder<> b(ctx);
  llvm::Function* fn = llvm::Function::Create(
      llvm::FunctionType::get(b.getVoidTy(), false),
      llvm::Function::ExternalLinkage, "no_terminator", module);
  llvm::BasicBlock::Create(ctx, "entry", fn);
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(HostCpuTarget());
  ASSERT_TRUE(tm.ok());
  absl::Status s = OptimizeModule(module, **tm, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("broken"));
  EXPECT_THAT(s.message(), HasSubstr("terminator"));
}

// ---------------------------------------------------------------------------
// Float16 operations (promote_half.h).

// void name(half* a, half* b, half* out, int64 n): out[i] = body(a[i], b[i])
// computed in float32, as Kiln's kernels compute float16 values.
void AddHalfMap(llvm::Module& module, const std::string& name,
                const BodyFn& body) {
  llvm::LLVMContext& ctx = module.getContext();
  llvm::IRBuilder<> b(ctx);
  llvm::Function* fn = llvm::Function::Create(
      llvm::FunctionType::get(
          b.getVoidTy(),
          {b.getPtrTy(), b.getPtrTy(), b.getPtrTy(), b.getInt64Ty()}, false),
      llvm::Function::ExternalLinkage, name, module);
  for (int i = 0; i < 3; ++i) fn->addParamAttr(i, llvm::Attribute::NoAlias);
  llvm::BasicBlock* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  llvm::BasicBlock* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  b.SetInsertPoint(entry);
  b.CreateCondBr(b.CreateICmpSGT(fn->getArg(3), b.getInt64(0)), loop, exit);
  b.SetInsertPoint(loop);
  llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2, "i");
  i->addIncoming(b.getInt64(0), entry);
  std::vector<llvm::Value*> args;
  for (int k = 0; k < 2; ++k) {
    args.push_back(b.CreateFPExt(
        b.CreateLoad(b.getHalfTy(),
                     b.CreateInBoundsGEP(b.getHalfTy(), fn->getArg(k), i)),
        b.getFloatTy()));
  }
  b.CreateStore(b.CreateFPTrunc(body(b, args), b.getHalfTy()),
                b.CreateInBoundsGEP(b.getHalfTy(), fn->getArg(2), i));
  llvm::Value* next = b.CreateAdd(i, b.getInt64(1), "", true, true);
  i->addIncoming(next, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, fn->getArg(3)), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
}

// The instructions of `fn` that compute on float16 values: anything of
// float16 type or operands but loads, stores, conversions and selects.
int HalfArithmetic(const llvm::Function& fn) {
  int n = 0;
  for (const llvm::Instruction& inst : llvm::instructions(fn)) {
    if (llvm::isa<llvm::LoadInst, llvm::StoreInst, llvm::FPExtInst,
                  llvm::FPTruncInst, llvm::BitCastInst, llvm::SelectInst,
                  llvm::PHINode, llvm::ReturnInst, llvm::ShuffleVectorInst,
                  llvm::ExtractElementInst, llvm::InsertElementInst>(inst)) {
      continue;
    }
    bool half = inst.getType()->getScalarType()->isHalfTy();
    for (const llvm::Value* op : inst.operands())
      half |= op->getType()->getScalarType()->isHalfTy();
    n += half;
  }
  return n;
}

using HalfMapFn = void(const uint16_t*, const uint16_t*, uint16_t*, int64_t);

// Every float16 operation PromoteHalfPass rewrites, written as Kiln writes
// it (in float32, which InstCombine narrows to float16): on every float16
// value (against two others), compiled for x86-64-v4 (the clients' level:
// F16C, no AVX512-FP16) the results are float32's rounded to float16, the
// loops are vectorised, and no float16 arithmetic is left for x86 to do
// lane by lane.
TEST(PromoteHalfTest, Float16OperationsAreExactAndVectorised) {
  using Fn2 = std::function<llvm::Value*(llvm::IRBuilder<>&, llvm::Value*,
                                         llvm::Value*)>;
  struct Op {
    std::string name;
    Fn2 emit;
    std::function<float(float, float)> reference;
  };
  const std::vector<Op> ops = {
      {"gt",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
         return b.CreateSelect(b.CreateFCmpOGT(x, y), x, y);
       },
       [](float x, float y) { return x > y ? x : y; }},
      {"le_zero",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
         return b.CreateSelect(
             b.CreateFCmpULE(x, llvm::ConstantFP::get(x->getType(), 0.0)), y,
             x);
       },
       [](float x, float y) { return !(x > 0.0f) ? y : x; }},
      {"isnan",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
         return b.CreateSelect(b.CreateFCmpUNO(x, x), y, x);
       },
       [](float x, float y) { return std::isnan(x) ? y : x; }},
      {"maxnum",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
         return b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, x, y);
       },
       // x86's: a signalling NaN is a NaN like any other.
       [](float x, float y) {
         return std::isnan(y) ? x : std::isnan(x) ? y : std::fmax(x, y);
       }},
      {"minnum",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
         return b.CreateBinaryIntrinsic(llvm::Intrinsic::minnum, x, y);
       },
       [](float x, float y) {
         return std::isnan(y) ? x : std::isnan(x) ? y : std::fmin(x, y);
       }},
      {"copysign",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
         return b.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, x, y);
       },
       [](float x, float y) { return std::copysign(x, y); }},
      {"frem",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
         return b.CreateFRem(x, y);
       },
       [](float x, float y) { return std::fmod(x, y); }},
      {"fneg",
       [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*) {
         return b.CreateFNeg(x);
       },
       [](float x, float) { return -x; }},
#define KILN_UNARY(id, fn)                                           \
  {                                                                  \
#id,                                                               \
   [](llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value*) {           \
     return b.CreateUnaryIntrinsic(llvm::Intrinsic::id, x);           \
   },                                                                 \
   [](float x, float) { return fn(x); } \
  }
      KILN_UNARY(fabs, std::fabs),
      KILN_UNARY(floor, std::floor),
      KILN_UNARY(ceil, std::ceil),
      KILN_UNARY(trunc, std::trunc),
      KILN_UNARY(rint, std::rint),
      KILN_UNARY(nearbyint, std::nearbyint),
      KILN_UNARY(round, std::round),
      KILN_UNARY(roundeven, std::nearbyint),
      KILN_UNARY(sqrt, std::sqrt),
#undef KILN_UNARY
  };
  // Every float16 value against a scramble of the others, then against its
  // own negation (signed zeros, copysign).
  constexpr int64_t kN = 2 * 65536;
  std::vector<uint16_t> a(kN), b(kN);
  for (int64_t i = 0; i < 65536; ++i) {
    a[i] = a[i + 65536] = static_cast<uint16_t>(i);
    b[i] = static_cast<uint16_t>((i * 40503 + 12345) & 0xffff);
    b[i + 65536] = static_cast<uint16_t>(i ^ 0x8000);
  }
  for (bool fast_math : {false, true}) {
    SCOPED_TRACE(fast_math ? "fast_math" : "strict");
    llvm::LLVMContext ctx;
    llvm::Module module("half_ops", ctx);
    for (const Op& op : ops) {
      AddHalfMap(module, op.name,
                 [&](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& x) {
                   return op.emit(b, x[0], x[1]);
                 });
    }
    absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
        MakeTargetMachine(Target("x86-64-v4", ""));
    ASSERT_TRUE(tm.ok()) << tm.status();
    ASSERT_TRUE(OptimizeModule(module, **tm, fast_math).ok());
    for (const Op& op : ops) {
      const std::string ir = FunctionIr(module, op.name);
      EXPECT_EQ(HalfArithmetic(*module.getFunction(op.name)), 0)
          << op.name << ": float16 arithmetic left\n"
          << ir;
      EXPECT_THAT(ir, HasSubstr("x float>")) << op.name << " not vectorised";
    }
    absl::StatusOr<std::string> object = EmitObject(module, **tm);
    ASSERT_TRUE(object.ok()) << object.status();
    absl::StatusOr<std::string> so = LinkSharedObject({*object});
    ASSERT_TRUE(so.ok()) << so.status();
    LoadedLibrary lib = LoadOrDie(*so);
    for (const Op& op : ops) {
      std::vector<uint16_t> out(kN, 0x7e00);
      FunctionOrDie<HalfMapFn>(lib, op.name)(a.data(), b.data(), out.data(),
                                             kN);
      int wrong = 0;
      for (int64_t i = 0; i < kN && wrong < 5; ++i) {
        const uint16_t want =
            FloatToHalf(op.reference(HalfToFloat(a[i]), HalfToFloat(b[i])));
        const float got = HalfToFloat(out[i]);
        const bool same = out[i] == want ||
                          (std::isnan(got) && std::isnan(HalfToFloat(want)))
                          // maxnum/minnum of +0 and -0 may return either.
                          || (got == 0.0f && HalfToFloat(want) == 0.0f &&
                              (op.name == "maxnum" || op.name == "minnum"));
        if (!same) {
          ++wrong;
          ADD_FAILURE() << op.name << "(0x" << std::hex << a[i] << ", 0x"
                        << b[i] << ") = 0x" << out[i] << ", want 0x" << want;
        }
      }
    }
  }
}

// Promotion rewrites exactly the float16 operations x86 would scalarise,
// and leaves float16 arithmetic x86 promotes itself (fadd) alone.
TEST(PromoteHalfTest, RewritesOnlyTheListedOperations) {
  llvm::LLVMContext ctx;
  llvm::Module module("m", ctx);
  llvm::IRBuilder<> b(ctx);
  llvm::Type* v = llvm::FixedVectorType::get(b.getHalfTy(), 8);
  llvm::Function* fn =
      llvm::Function::Create(llvm::FunctionType::get(v, {v, v}, false),
                             llvm::Function::ExternalLinkage, "f", module);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
  llvm::Value* x = fn->getArg(0);
  llvm::Value* y = fn->getArg(1);
  llvm::Value* sum = b.CreateFAdd(x, y);
  llvm::Value* max = b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, sum, y);
  llvm::Value* neg = b.CreateFNeg(max);
  b.CreateRet(b.CreateSelect(b.CreateFCmpOLT(neg, x), neg, sum));
  EXPECT_EQ(PromoteHalfOperations(*fn), 3);
  EXPECT_EQ(HalfArithmetic(*fn), 1) << FunctionIr(module, "f");  // the fadd
  EXPECT_FALSE(llvm::verifyFunction(*fn, &llvm::errs()));
  EXPECT_EQ(PromoteHalfOperations(*fn), 0);
}

// ---------------------------------------------------------------------------
// End to end on this machine.

// Runs BasicKernels' add_arrays on 1003 elements (not a multiple of any
// vector width) and checks the sums exactly.
void ExpectAddArraysAdds(const LoadedLibrary& lib) {
  constexpr int64_t kN = 1003;
  std::vector<float> a(kN), b(kN), out(kN, -1.0f);
  for (int64_t i = 0; i < kN; ++i) {
    a[i] = static_cast<float>(i) * 0.25f - 100.0f;
    b[i] = static_cast<float>(i % 17) * 0.5f;
  }
  FunctionOrDie<MapFn2>(lib, "add_arrays")(a.data(), b.data(), out.data(), kN);
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
}

TEST(CpuBackendEndToEndTest, AddExpZeroSumRunCorrectly) {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
  absl::StatusOr<std::string> so = CompileToSo(*module, HostCpuTarget());
  ASSERT_TRUE(so.ok()) << so.status();
  EXPECT_EQ(so->substr(0, 4),
            "\x7f"
            "ELF");
  // DT_NEEDED (--as-needed): libmvec for the vectorised exp, libc for the
  // memset that zero_fill became. No trace of lld's temporary directory.
  EXPECT_TRUE(absl::StrContains(*so, "libmvec.so.1"));
  EXPECT_TRUE(absl::StrContains(*so, "libc.so.6"));
  EXPECT_FALSE(absl::StrContains(*so, "kiln-lld"));
  EXPECT_TRUE(absl::StrContains(*so, "libkiln_kernels.so"));  // DT_SONAME
  LoadedLibrary lib = LoadOrDie(*so);
  ASSERT_NO_FATAL_FAILURE(ExpectAddArraysAdds(lib));

  constexpr int64_t kN = 1003;  // not a multiple of any vector width
  std::vector<float> out(kN, -1.0f);
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = -20.0f + 40.0f * i / kN;
  FunctionOrDie<MapFn1>(lib, "exp_arrays")(x.data(), out.data(), kN);
  for (int64_t i = 0; i < kN; ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    ASSERT_LE(std::abs(out[i] - want), 1e-6 * want) << "exp(" << x[i] << ")";
  }

  using ZeroFn = void(float*, int64_t);
  FunctionOrDie<ZeroFn>(lib, "zero_fill")(out.data(), kN);
  EXPECT_TRUE(
      std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));

  using SumFn = float(const float*, int64_t);
  std::vector<float> ones(kN, 1.0f);
  EXPECT_EQ(FunctionOrDie<SumFn>(lib, "sum_array")(ones.data(), kN),
            static_cast<float>(kN));
  EXPECT_EQ(FunctionOrDie<SumFn>(lib, "sum_array")(ones.data(), 0), 0.0f);
}

// OptimizeAndEmitObjects deals the four kernels into three objects, which
// link (-z defs: nothing undefined, nothing twice) into a library whose
// kernels compute what the one-module library's do.
TEST(CpuBackendEndToEndTest, KernelsInPartsLinkAndRun) {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
  absl::StatusOr<std::vector<std::string>> objects =
      OptimizeAndEmitObjects(*module, HostCpuTarget(), /*fast_math=*/true, 3);
  ASSERT_TRUE(objects.ok()) << objects.status();
  ASSERT_EQ(objects->size(), 3u);
  absl::StatusOr<std::string> so = LinkSharedObject(*objects);
  ASSERT_TRUE(so.ok()) << so.status();
  LoadedLibrary lib = LoadOrDie(*so);
  ASSERT_NO_FATAL_FAILURE(ExpectAddArraysAdds(lib));
  constexpr int64_t kN = 1003;
  std::vector<float> out(kN, -1.0f);
  using SumFn = float(const float*, int64_t);
  std::vector<float> ones(kN, 1.0f);
  EXPECT_EQ(FunctionOrDie<SumFn>(lib, "sum_array")(ones.data(), kN),
            static_cast<float>(kN));
  using ZeroFn = void(float*, int64_t);
  FunctionOrDie<ZeroFn>(lib, "zero_fill")(out.data(), kN);
  EXPECT_TRUE(
      std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));
  // More parts than kernels: one object, as without parts.
  std::unique_ptr<llvm::Module> again = BasicKernels(ctx);
  objects = OptimizeAndEmitObjects(*again, HostCpuTarget(), true, 16);
  ASSERT_TRUE(objects.ok()) << objects.status();
  EXPECT_EQ(objects->size(), 1u);
}

// Every libmvec mapping the back end registers must exist in glibc: the link
// runs with -z defs, so a wrong vector function name fails here; the values
// check the calling convention.
TEST(CpuBackendEndToEndTest, VectorMathFunctionsLinkAndAgreeWithLibm) {
  struct Case {
    const char* name;
    int arity;
    double (*reference)(double, double);
    float lo, hi;
  };
  const Case cases[] = {
      {"tanhf", 1, [](double x, double) { return std::tanh(x); }, -5, 5},
      {"erff", 1, [](double x, double) { return std::erf(x); }, -3, 3},
      {"log1pf", 1, [](double x, double) { return std::log1p(x); }, 0, 10},
      {"sinf", 1, [](double x, double) { return std::sin(x); }, -3, 3},
      {"exp2f", 1, [](double x, double) { return std::exp2(x); }, -10, 10},
      {"atanf", 1, [](double x, double) { return std::atan(x); }, -5, 5},
      {"powf", 2, [](double x, double y) { return std::pow(x, y); }, 0.5, 3},
      {"atan2f", 2, [](double x, double y) { return std::atan2(x, y); }, 1, 4},
  };
  for (const v1::CpuTarget& target : {HostCpuTarget(), Target("x86-64", "")}) {
    SCOPED_TRACE(target.cpu());
    llvm::LLVMContext ctx;
    // Rebuild per target: OptimizeModule changes the module in place.
    auto copy = std::make_unique<llvm::Module>("math_kernels", ctx);
    for (const Case& c : cases) {
      llvm::FunctionCallee callee = MathFunction(*copy, c.name, c.arity);
      AddMap(*copy, absl::StrCat("map_", c.name), c.arity,
             [callee](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& x)
                 -> llvm::Value* { return b.CreateCall(callee, x); });
    }
    absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
        MakeTargetMachine(target);
    ASSERT_TRUE(tm.ok()) << tm.status();
    ASSERT_TRUE(OptimizeModule(*copy, **tm, /*fast_math=*/true).ok());
    EXPECT_THAT(FunctionIr(*copy, "map_tanhf"), HasSubstr("_ZGV"));
    absl::StatusOr<std::string> object = EmitObject(*copy, **tm);
    ASSERT_TRUE(object.ok()) << object.status();
    absl::StatusOr<std::string> so = LinkSharedObject({*object});
    ASSERT_TRUE(so.ok()) << so.status();
    LoadedLibrary lib = LoadOrDie(*so);
    constexpr int64_t kN = 1001;
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      std::vector<float> x(kN), y(kN), out(kN);
      for (int64_t i = 0; i < kN; ++i) {
        x[i] = c.lo + (c.hi - c.lo) * i / (kN - 1);
        y[i] = c.lo + (c.hi - c.lo) * ((i * 7) % kN) / (kN - 1);
      }
      const std::string fn = absl::StrCat("map_", c.name);
      if (c.arity == 1) {
        FunctionOrDie<MapFn1>(lib, fn)(x.data(), out.data(), kN);
      } else {
        FunctionOrDie<MapFn2>(lib, fn)(x.data(), y.data(), out.data(), kN);
      }
      for (int64_t i = 0; i < kN; ++i) {
        const double want = c.reference(x[i], y[i]);
        ASSERT_NEAR(out[i], want, 4e-6 * std::max(1.0, std::abs(want)))
            << c.name << "(" << x[i] << ", " << y[i] << ")";
      }
    }
  }
}

TEST(CpuBackendEndToEndTest, AssemblyThenObject) {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(Target("x86-64-v3", ""));
  ASSERT_TRUE(tm.ok());
  ASSERT_TRUE(OptimizeModule(*module, **tm, true).ok());
  absl::StatusOr<std::string> assembly = EmitAssembly(*module, **tm);
  ASSERT_TRUE(assembly.ok()) << assembly.status();
  EXPECT_THAT(*assembly, HasSubstr("add_arrays:"));
  EXPECT_THAT(*assembly, HasSubstr("_ZGVdN8v_expf"));
  EXPECT_THAT(*assembly, HasSubstr("ymm"));
  absl::StatusOr<std::string> object = EmitObject(*module, **tm);
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_TRUE(LinkSharedObject({*object}).ok());
}

TEST(CpuBackendEndToEndTest, MismatchedDataLayoutIsFailedPrecondition) {
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
  module->setDataLayout("e-p:32:32");
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(HostCpuTarget());
  ASSERT_TRUE(tm.ok());
  EXPECT_EQ(EmitObject(*module, **tm).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------
// LinkSharedObject.

TEST(LinkSharedObjectTest, UndefinedSymbolIsInternalWithLldMessage) {
  llvm::LLVMContext ctx;
  llvm::Module module("undefined", ctx);
  llvm::IRBuilder<> b(ctx);
  llvm::FunctionCallee missing =
      module.getOrInsertFunction("kiln_missing_function", b.getVoidTy());
  llvm::Function* fn = llvm::Function::Create(
      llvm::FunctionType::get(b.getVoidTy(), false),
      llvm::Function::ExternalLinkage, "calls_missing", module);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "", fn));
  b.CreateCall(missing);
  b.CreateRetVoid();
  absl::StatusOr<std::string> so = CompileToSo(module, HostCpuTarget());
  EXPECT_EQ(so.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(so.status().message(),
              HasSubstr("undefined symbol: kiln_missing_function"));

  // A later link still works (lld's state was reset).
  llvm::LLVMContext ctx2;
  std::unique_ptr<llvm::Module> good = BasicKernels(ctx2);
  EXPECT_TRUE(CompileToSo(*good, HostCpuTarget()).ok());
}

TEST(LinkSharedObjectTest, BadInputsAreErrors) {
  EXPECT_EQ(LinkSharedObject({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> so =
      LinkSharedObject({std::string("this is not an object file")});
  EXPECT_EQ(so.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(so.status().message(), HasSubstr("in0.o"));
  LinkOptions options;
  options.library_dirs = {"/nonexistent-kiln-dir"};
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
  so = CompileToSo(*module, HostCpuTarget(), true, nullptr, options);
  EXPECT_EQ(so.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(so.status().message(), HasSubstr("-lmvec"));
}

// lld reports a malformed object with fatal(), which would exit the process;
// LinkSharedObject turns it into an error and later links still work (and
// give the same bytes as before).
TEST(LinkSharedObjectTest, MalformedObjectIsInternalAndLinkingGoesOn) {
  llvm::LLVMContext ctx;
  llvm::Module module("constant", ctx);
  AddConstant(module, "kiln_value", 5);
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(HostCpuTarget());
  ASSERT_TRUE(tm.ok());
  absl::StatusOr<std::string> object = EmitObject(module, **tm);
  ASSERT_TRUE(object.ok());
  absl::StatusOr<std::string> before = LinkSharedObject({*object});
  ASSERT_TRUE(before.ok()) << before.status();

  const std::string truncated = object->substr(0, 64);  // ELF header only
  absl::StatusOr<std::string> so = LinkSharedObject({truncated});
  EXPECT_EQ(so.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(so.status().message(), HasSubstr("fatal error"));
  EXPECT_THAT(so.status().message(), HasSubstr("section header table"));

  absl::StatusOr<std::string> after = LinkSharedObject({*object});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
}

// Inputs and output live in a private directory under $TMPDIR that is gone
// afterwards, on success and on failure.
TEST(LinkSharedObjectTest, LeavesNothingInTmpdir) {
  char dir_template[] = "/tmp/kiln-cpu-backend-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string tmpdir = dir_template;
  const char* old = getenv("TMPDIR");
  const std::string old_value = old != nullptr ? old : "";
  ASSERT_EQ(setenv("TMPDIR", tmpdir.c_str(), 1), 0);

  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
  absl::StatusOr<std::unique_ptr<llvm::TargetMachine>> tm =
      MakeTargetMachine(HostCpuTarget());
  ASSERT_TRUE(tm.ok());
  ASSERT_TRUE(OptimizeModule(*module, **tm, true).ok());
  absl::StatusOr<std::string> object = EmitObject(*module, **tm);
  ASSERT_TRUE(object.ok());
  EXPECT_EQ(DirEntryCount(tmpdir), 0);
  EXPECT_TRUE(LinkSharedObject({*object}).ok());
  EXPECT_EQ(DirEntryCount(tmpdir), 0);
  EXPECT_FALSE(LinkSharedObject({*object, *object}).ok());  // duplicates
  EXPECT_EQ(DirEntryCount(tmpdir), 0);
  EXPECT_FALSE(LinkSharedObject({std::string("garbage")}).ok());
  EXPECT_EQ(DirEntryCount(tmpdir), 0);
  EXPECT_FALSE(LinkSharedObject({object->substr(0, 64)}).ok());  // fatal()
  EXPECT_EQ(DirEntryCount(tmpdir), 0);

  if (old != nullptr) {
    setenv("TMPDIR", old_value.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  EXPECT_EQ(rmdir(tmpdir.c_str()), 0);
}

// ---------------------------------------------------------------------------
// LoadedLibrary.

absl::StatusOr<std::string> ConstantSo(int64_t value,
                                       std::vector<std::string> extra = {}) {
  llvm::LLVMContext ctx;
  llvm::Module module("constant", ctx);
  AddConstant(module, "kiln_value", value);
  LinkOptions options;
  options.extra_args = std::move(extra);
  return CompileToSo(module, HostCpuTarget(), false, nullptr, options);
}

TEST(LoadedLibraryTest, TamperedBytesAreDataLossAndNothingIsLoaded) {
  absl::StatusOr<std::string> so = ConstantSo(7);
  ASSERT_TRUE(so.ok()) << so.status();
  const Sha256Digest good = Sha256(*so);
  std::string tampered = *so;
  tampered[tampered.size() / 2] ^= 0x01;
  const int objects_before = LoadedObjectCount();
  const int fds_before = DirEntryCount("/proc/self/fd");
  absl::StatusOr<LoadedLibrary> lib = LoadedLibrary::Load(tampered, good);
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(lib.status().message(), HasSubstr(DigestToHex(good)));
  EXPECT_THAT(lib.status().message(), HasSubstr(DigestToHex(Sha256(tampered))));
  EXPECT_EQ(LoadedObjectCount(), objects_before);
  EXPECT_EQ(DirEntryCount("/proc/self/fd"), fds_before);
}

TEST(LoadedLibraryTest, NotElfIsFailedPrecondition) {
  const std::string bytes = "definitely not ELF";
  absl::StatusOr<LoadedLibrary> lib = LoadedLibrary::Load(bytes, Sha256(bytes));
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lib.status().message(), HasSubstr("dlopen"));
}

TEST(LoadedLibraryTest, SymbolAndMoveSemantics) {
  absl::StatusOr<std::string> so = ConstantSo(42);
  ASSERT_TRUE(so.ok()) << so.status();
  // --as-needed: no math, no libc calls, no DT_NEEDED entries for them.
  EXPECT_FALSE(absl::StrContains(*so, "libmvec"));
  EXPECT_FALSE(absl::StrContains(*so, "libm.so"));
  LoadedLibrary lib = LoadOrDie(*so);
  absl::StatusOr<void*> missing = lib.Symbol("kiln_no_such_symbol");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("kiln_no_such_symbol"));
  using ValueFn = int64_t();
  EXPECT_EQ(FunctionOrDie<ValueFn>(lib, "kiln_value")(), 42);
  LoadedLibrary moved = std::move(lib);
  EXPECT_EQ(lib.Symbol("kiln_value").status().code(),  // NOLINT(use-after-move)
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FunctionOrDie<ValueFn>(moved, "kiln_value")(), 42);
}

// Libraries with the same symbols are independent (RTLD_LOCAL), and a new
// library never aliases an earlier one whose /proc/self/fd/N name it reuses,
// even one that dlclose cannot unload (-z nodelete).
TEST(LoadedLibraryTest, LibrariesAreIndependent) {
  using ValueFn = int64_t();
  absl::StatusOr<std::string> one = ConstantSo(1, {"-z", "nodelete"});
  absl::StatusOr<std::string> two = ConstantSo(2);
  absl::StatusOr<std::string> three = ConstantSo(3);
  ASSERT_TRUE(one.ok() && two.ok() && three.ok());
  {
    LoadedLibrary a = LoadOrDie(*one);
    LoadedLibrary b = LoadOrDie(*two);
    EXPECT_EQ(FunctionOrDie<ValueFn>(a, "kiln_value")(), 1);
    EXPECT_EQ(FunctionOrDie<ValueFn>(b, "kiln_value")(), 2);
  }
  // Both fds are closed; the next memfd gets the number `one` had, and
  // `one` is still mapped (nodelete).
  LoadedLibrary c = LoadOrDie(*three);
  EXPECT_EQ(FunctionOrDie<ValueFn>(c, "kiln_value")(), 3);
  LoadedLibrary d = LoadOrDie(*two);
  EXPECT_EQ(FunctionOrDie<ValueFn>(d, "kiln_value")(), 2);
}

// ---------------------------------------------------------------------------
// Concurrency and determinism.

TEST(CpuBackendConcurrencyTest, FourThreadsCompileLinkAndLoadIdentically) {
  constexpr int kThreads = 4;
  std::vector<std::string> sos(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<float> sums(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &sos, &errors, &sums] {
      llvm::LLVMContext ctx;
      std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
      absl::StatusOr<std::string> so = CompileToSo(*module, HostCpuTarget());
      if (!so.ok()) {
        errors[t] = so.status().ToString();
        return;
      }
      absl::StatusOr<LoadedLibrary> lib = LoadedLibrary::Load(*so, Sha256(*so));
      if (!lib.ok()) {
        errors[t] = lib.status().ToString();
        return;
      }
      absl::StatusOr<void*> add = lib->Symbol("add_arrays");
      if (!add.ok()) {
        errors[t] = add.status().ToString();
        return;
      }
      std::vector<float> a(1000, 1.5f), b(1000, static_cast<float>(t)),
          out(1000);
      reinterpret_cast<MapFn2*> (*add)(a.data(), b.data(), out.data(), 1000);
      sums[t] = out[999];
      sos[t] = *std::move(so);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(sums[t], 1.5f + t);
    EXPECT_EQ(sos[t], sos[0]) << "thread " << t << " linked different bytes";
  }
}

// ---------------------------------------------------------------------------
// Timing (printed, not asserted): the product's goal is <= 50 ms per compile.

TEST(CpuBackendTimingTest, PrintOptimizeEmitLinkSplit) {
  constexpr int kRuns = 9;
  std::vector<Timings> runs;
  for (int run = 0; run < kRuns; ++run) {
    llvm::LLVMContext ctx;
    std::unique_ptr<llvm::Module> module = BasicKernels(ctx);
    Timings timings;
    absl::StatusOr<std::string> so =
        CompileToSo(*module, HostCpuTarget(), true, &timings);
    ASSERT_TRUE(so.ok()) << so.status();
    Stopwatch watch;
    { LoadedLibrary lib = LoadOrDie(*so); }
    timings.load = watch.Lap();
    if (run > 0) runs.push_back(timings);  // run 0 warms up
  }
  auto median = [&](Phase Timings::*phase, double Phase::*field) {
    std::vector<double> v;
    for (const Timings& t : runs) v.push_back(t.*phase.*field);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (double Phase::*field : {&Phase::wall, &Phase::cpu}) {
    const double total = median(&Timings::target_machine, field) +
                         median(&Timings::optimize, field) +
                         median(&Timings::emit, field) +
                         median(&Timings::link, field);
    std::printf(
        "cpu_backend %s ms (add/exp/zero/sum kernels, host target, median of "
        "%d): target machine %.2f, optimize %.2f, emit %.2f, link %.2f, "
        "total %.2f; load %.2f\n",
        field == &Phase::wall ? "wall" : "thread-cpu", kRuns - 1,
        median(&Timings::target_machine, field),
        median(&Timings::optimize, field), median(&Timings::emit, field),
        median(&Timings::link, field), total, median(&Timings::load, field));
  }
}

}  // namespace
}  // namespace kiln
