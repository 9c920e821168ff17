// The matrix products (graph/ops/matmul.cc, compiler/ops/matmul_*.cc):
// mm, addmm, bmm, baddbmm. Hand-worked values through the reference;
// then compiled CPU programs (an extern BLAS call plus Kiln kernels around
// it) against the reference on random inputs over odd sizes, transposed
// and strided operands, batch 1, k = 1, k = 0, empty dims, reduced
// precision and dynamic sizes; operands that are read in place (no copy
// kernel) and those that must be written contiguously first; and the
// runtime's checks of malformed GEMM steps.
#include <array>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/reference.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "runtime/program_plan.h"
#include "tests/unit/numerics.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("matmul", MatmulSuiteOps());

// ---- reference semantics, by hand ----

TEST(Matmul, HandWorked) {
  // [[1, 2], [3, 4]] @ [[5, 6], [7, 8]] = [[19, 22], [43, 50]].
  CheckOp("aten.mm.default",
          {F32({2, 2}, {1, 2, 3, 4}), F32({2, 2}, {5, 6, 7, 8})},
          {In(0), In(1)}, kF32, {2, 2}, {19, 22, 43, 50});
  // [1, 2, 3] (1x3) @ [[1], [1], [1]] (3x1) = [[6]].
  CheckOp("aten.mm.default", {F32({1, 3}, {1, 2, 3}), F32({3, 1}, {1, 1, 1})},
          {In(0), In(1)}, kF32, {1, 1}, {6});
  // addmm: 2 * [10, 20] + 0.5 * [[19, 22], [43, 50]].
  CheckOp("aten.addmm.default",
          {F32({2}, {10, 20}), F32({2, 2}, {1, 2, 3, 4}),
           F32({2, 2}, {5, 6, 7, 8})},
          {In(0), In(1), In(2), Kw("beta", I(2)), Kw("alpha", F(0.5))}, kF32,
          {2, 2}, {29.5, 51, 41.5, 65});
  // beta = 0 ignores the bias, NaN included (PyTorch's rule).
  CheckOp("aten.addmm.default",
          {F32({2}, {kNaN, kInf}), F32({2, 2}, {1, 2, 3, 4}),
           F32({2, 2}, {5, 6, 7, 8})},
          {In(0), In(1), In(2), Kw("beta", I(0))}, kF32, {2, 2},
          {19, 22, 43, 50});
  // bmm: batch of two 1x2 @ 2x1.
  CheckOp("aten.bmm.default",
          {F32({2, 1, 2}, {1, 2, 3, 4}), F32({2, 2, 1}, {5, 6, 7, 8})},
          {In(0), In(1)}, kF32, {2, 1, 1}, {17, 53});
  CheckOp("aten.baddbmm.default",
          {F32({1}, {100}), F32({2, 1, 2}, {1, 2, 3, 4}),
           F32({2, 2, 1}, {5, 6, 7, 8})},
          {In(0), In(1), In(2)}, kF32, {2, 1, 1}, {117, 153});
  // k = 0: a sum over nothing.
  CheckOp("aten.mm.default", {F32({2, 0}, {}), F32({0, 3}, {})}, {In(0), In(1)},
          kF32, {2, 3}, {0, 0, 0, 0, 0, 0});
  // A transposed view reads element (i, j) = values[j * cols + i].
  CheckOp(
      "aten.mm.default",
      {TransposedView(F32({2, 2}, {1, 3, 2, 4})), F32({2, 2}, {5, 6, 7, 8})},
      {In(0), In(1)}, kF32, {2, 2}, {19, 22, 43, 50});
  // bfloat16 rounds the result once: 1.5 * 1.5 * 3 = 6.75 is exact.
  CheckOp("aten.mm.default",
          {BF16({1, 3}, {1.5, 1.5, 1.5}), BF16({3, 1}, {1.5, 1.5, 1.5})},
          {In(0), In(1)}, kBF16, {1, 1}, {6.75}, 0);
}

TEST(Matmul, InvalidArguments) {
  ExpectInvalid("aten.mm.default", {F32({2, 3}, {}), F32({2, 3}, {})},
                {In(0), In(1)},
                {"node 0", "aten.mm.default", "cannot be multiplied", "2x3"});
  ExpectInvalid("aten.mm.default", {F32({2, 3, 1}, {}), F32({3, 2}, {})},
                {In(0), In(1)}, {"2-D operands"});
  ExpectInvalid("aten.bmm.default", {F32({2, 2, 3}, {}), F32({3, 3, 2}, {})},
                {In(0), In(1)}, {"cannot be multiplied"});
  ExpectInvalid("aten.mm.default", {F32({2, 2}, {}), F16({2, 2}, {})},
                {In(0), In(1)}, {"one dtype", "float32", "float16"});
  ExpectInvalid("aten.mm.default", {I64({2, 2}, {}), I64({2, 2}, {})},
                {In(0), In(1)}, {"int64", "floating dtypes only"});
  ExpectInvalid("aten.addmm.default",
                {F32({3}, {}), F32({2, 2}, {}), F32({2, 2}, {})},
                {In(0), In(1), In(2)}, {"do not broadcast"});
}

// ---- compiled against the reference ----

// One input of a test graph: its dtype, sizes (a symbol name instead of a
// size makes the dim dynamic, bound to the value given) and, for static
// inputs, strides (empty: contiguous) and a storage offset.
struct TestInput {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  std::vector<std::string> symbols;  // per dim, "" for static
};

TestInput Dense(std::vector<int64_t> sizes, DType dtype = DType::kFloat32) {
  return TestInput{dtype, std::move(sizes), {}, 0, {}};
}
// The transpose of a dense [.., cols, rows] storage: [.., rows, cols] with
// the last two strides swapped.
TestInput Transposed(std::vector<int64_t> sizes,
                     DType dtype = DType::kFloat32) {
  const size_t r = sizes.size();
  std::vector<int64_t> strides(r);
  strides[r - 2] = 1;
  strides[r - 1] = sizes[r - 2];
  if (r == 3) strides[0] = sizes[1] * sizes[2];
  return TestInput{dtype, std::move(sizes), std::move(strides), 0, {}};
}

struct Case {
  std::string op;
  std::vector<TestInput> inputs;
  std::vector<v1::Argument> extra;  // after the tensor arguments
};

v1::Graph CaseGraph(const Case& c) {
  v1::Graph g;
  std::set<std::string> symbols;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const TestInput& t = c.inputs[i];
    v1::Input* in = g.add_inputs();
    in->set_name(absl::StrCat("x", i));
    v1::TensorMeta* m = in->mutable_meta();
    m->set_dtype(static_cast<v1::DType>(t.dtype));
    m->set_device(v1::CPU);
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      if (d < t.symbols.size() && !t.symbols[d].empty()) {
        m->add_sizes()->set_symbol(t.symbols[d]);
        symbols.insert(t.symbols[d]);
      } else {
        m->add_sizes()->set_value(t.sizes[d]);
      }
    }
    for (int64_t s : t.strides) m->add_strides()->set_value(s);
    m->set_storage_offset(t.offset);
  }
  for (const std::string& s : symbols) g.add_symbols()->set_name(s);
  v1::Node* node = g.add_nodes();
  node->set_op(c.op);
  for (size_t i = 0; i < c.inputs.size(); ++i)
    node->add_args()->set_ref(absl::StrCat("x", i));
  for (const v1::Argument& a : c.extra) *node->add_args() = a;
  node->add_outputs("y");
  g.add_outputs("y");
  return g;
}

std::vector<HostTensor> CaseInputs(const Case& c, std::mt19937_64& rng) {
  std::vector<HostTensor> out;
  for (const TestInput& t : c.inputs) {
    std::vector<int64_t> strides = t.strides;
    if (strides.empty()) {
      strides.assign(t.sizes.size(), 1);
      for (size_t d = t.sizes.size(); d-- > 1;)
        strides[d - 1] = strides[d] * t.sizes[d];
    }
    int64_t extent = t.offset + 1;
    for (size_t d = 0; d < t.sizes.size(); ++d)
      extent += (t.sizes[d] - 1) * strides[d];
    HostTensor x = HostTensor::Strided(t.dtype, t.sizes, strides, t.offset,
                                       std::max<int64_t>(extent, 1));
    FillRandom(x, rng);
    out.push_back(std::move(x));
  }
  return out;
}

// Compiles the case for this CPU, runs it and compares with the reference;
// returns the artifact for further checks.
v1::Artifact CheckCompiled(const Case& c, uint64_t seed = 1) {
  SCOPED_TRACE(c.op);
  v1::CompileRequest req;
  *req.mutable_graph() = CaseGraph(c);
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto graph = ImportGraph(req.graph());
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  auto artifact = Compile(req);
  EXPECT_TRUE(artifact.ok()) << artifact.status();
  if (!artifact.ok()) return {};
  auto exe = CpuExecutable::Load(*artifact);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  std::mt19937_64 rng(seed);
  const std::vector<HostTensor> inputs = CaseInputs(c, rng);
  auto want = EvaluateReference(*graph, inputs);
  EXPECT_TRUE(want.ok()) << want.status();
  auto got = (*exe)->Run(inputs);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!want.ok() || !got.ok()) return *artifact;
  ExercisedOps().insert(c.op);
  const std::string diff = Compare((*got)[0], (*want)[0]);
  EXPECT_TRUE(diff.empty()) << diff << "\n  got:  " << (*got)[0].ToString(16)
                            << "\n  want: " << (*want)[0].ToString(16);
  return *artifact;
}

int CountLaunches(const v1::Artifact& a) {
  int n = 0;
  for (const v1::Step& s : a.program().steps()) n += s.has_launch();
  return n;
}
int CountCalls(const v1::Artifact& a) {
  int n = 0;
  for (const v1::Step& s : a.program().steps()) n += s.has_call();
  return n;
}

v1::Argument Beta(double v) { return Kw("beta", F(v)); }
v1::Argument Alpha(double v) { return Kw("alpha", F(v)); }

TEST(MatmulCompiled, ShapesAndLayouts) {
  // Odd sizes, m / n / k = 1, k = 0, empty m and n.
  for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{5, 7, 3},
                                                                   {1, 9, 4},
                                                                   {6, 1, 5},
                                                                   {7, 8, 1},
                                                                   {1, 1, 1},
                                                                   {33, 65, 17},
                                                                   {4, 0, 3},
                                                                   {0, 5, 3},
                                                                   {4, 5, 0}}) {
    SCOPED_TRACE(absl::StrCat(m, "x", k, " @ ", k, "x", n));
    const v1::Artifact a =
        CheckCompiled({"aten.mm.default", {Dense({m, k}), Dense({k, n})}, {}});
    EXPECT_EQ(CountCalls(a), 1);
    EXPECT_EQ(CountLaunches(a), 0) << "a product of inputs needs no kernel";
    CheckCompiled(
        {"aten.mm.default", {Transposed({m, k}), Transposed({k, n})}, {}});
    CheckCompiled({"aten.mm.default", {Dense({m, k}), Transposed({k, n})}, {}});
  }
}

TEST(MatmulCompiled, StridedAndOffsetOperandsAreReadInPlace) {
  // Every other row of a 10x7 storage, from element 3: row stride 14.
  TestInput rows{DType::kFloat32, {5, 7}, {14, 1}, 3, {}};
  // A column-major 7x4 inside a larger storage: leading dim 9.
  TestInput cols{DType::kFloat32, {7, 4}, {1, 9}, 2, {}};
  const v1::Artifact a = CheckCompiled({"aten.mm.default", {rows, cols}, {}});
  EXPECT_EQ(CountLaunches(a), 0);
  // No unit stride (every other element): written contiguously first.
  TestInput sparse{DType::kFloat32, {5, 7}, {14, 2}, 0, {}};
  const v1::Artifact b =
      CheckCompiled({"aten.mm.default", {sparse, Dense({7, 3})}, {}});
  EXPECT_EQ(CountLaunches(b), 1);
  // A broadcast operand (stride 0) likewise.
  TestInput broadcast{DType::kFloat32, {5, 7}, {0, 1}, 0, {}};
  CheckCompiled({"aten.mm.default", {broadcast, Dense({7, 3})}, {}});
}

TEST(MatmulCompiled, BiasBetaAlpha) {
  for (double beta : {0.0, 1.0, 0.5}) {
    for (double alpha : {1.0, -2.0}) {
      SCOPED_TRACE(absl::StrCat("beta ", beta, " alpha ", alpha));
      CheckCompiled({"aten.addmm.default",
                     {Dense({6}), Dense({5, 9}), Transposed({9, 6})},
                     {Beta(beta), Alpha(alpha)}});
      CheckCompiled({"aten.addmm.default",
                     {Dense({5, 6}), Dense({5, 9}), Dense({9, 6})},
                     {Beta(beta), Alpha(alpha)}});
      CheckCompiled({"aten.baddbmm.default",
                     {Dense({3, 1, 6}), Dense({3, 5, 9}), Dense({3, 9, 6})},
                     {Beta(beta), Alpha(alpha)}});
    }
  }
}

TEST(MatmulCompiled, Batched) {
  CheckCompiled({"aten.bmm.default", {Dense({4, 5, 7}), Dense({4, 7, 3})}, {}});
  CheckCompiled(
      {"aten.bmm.default", {Dense({1, 5, 7}), Transposed({1, 7, 3})}, {}});
  CheckCompiled(
      {"aten.bmm.default", {Transposed({3, 5, 7}), Dense({3, 7, 1})}, {}});
  CheckCompiled({"aten.bmm.default", {Dense({0, 5, 7}), Dense({0, 7, 3})}, {}});
  // The same batch read through a broadcast (batch stride 0).
  TestInput shared{DType::kFloat32, {3, 7, 4}, {0, 4, 1}, 0, {}};
  const v1::Artifact a =
      CheckCompiled({"aten.bmm.default", {Dense({3, 5, 7}), shared}, {}});
  EXPECT_EQ(CountLaunches(a), 0) << "a batch stride of 0 is read in place";
}

TEST(MatmulCompiled, ReducedPrecision) {
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(d));
    CheckCompiled(
        {"aten.mm.default", {Dense({6, 11}, d), Transposed({11, 5}, d)}, {}});
    CheckCompiled({"aten.addmm.default",
                   {Dense({5}, d), Dense({6, 11}, d), Dense({11, 5}, d)},
                   {Beta(1), Alpha(1)}});
    CheckCompiled(
        {"aten.bmm.default", {Dense({2, 6, 11}, d), Dense({2, 11, 5}, d)}, {}});
  }
}

// bfloat16 on the CPU: the operands are read in place in bfloat16 (no
// widening kernel) and C is float32 (Gemm.c_dtype), rounded by the one
// kernel after it; strided, transposed, batched, k = 1 and k = 0 alike.
// ops_matmul_test_openblas runs this with OpenBLAS, which has no bfloat16
// GEMM: the runtime widens the operands itself.
TEST(MatmulCompiled, BFloat16OperandsIntoAFloat32C) {
  const DType bf = DType::kBFloat16;
  // oneDNN's bfloat16 GEMM needs AVX-512 (the x86-64-v4 level).
  const bool avx512 = CpuTargetHasAvx512(HostCpuTarget());
  const v1::Artifact a = CheckCompiled(
      {"aten.mm.default", {Dense({6, 11}, bf), Transposed({11, 5}, bf)}, {}});
  EXPECT_EQ(CountCalls(a), 1);
  EXPECT_EQ(CountLaunches(a), avx512 ? 1 : 3) << "only C's rounding";
  const v1::Gemm* g = nullptr;
  for (const v1::Step& s : a.program().steps())
    if (s.has_call()) g = &s.call().gemm();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->dtype(), avx512 ? v1::BFLOAT16 : v1::FLOAT32);
  EXPECT_EQ(g->c_dtype(), avx512 ? v1::FLOAT32 : v1::DTYPE_UNSPECIFIED);
  TestInput rows{bf, {5, 7}, {14, 1}, 3, {}};
  TestInput cols{bf, {7, 4}, {1, 9}, 2, {}};
  EXPECT_EQ(CountLaunches(CheckCompiled({"aten.mm.default", {rows, cols}, {}})),
            avx512 ? 1 : 3);
  CheckCompiled({"aten.bmm.default",
                 {Transposed({3, 5, 7}, bf), Dense({3, 7, 4}, bf)},
                 {}});
  CheckCompiled(
      {"aten.baddbmm.default",
       {Dense({3, 1, 6}, bf), Dense({3, 5, 9}, bf), Dense({3, 9, 6}, bf)},
       {Beta(0.5), Alpha(-2)}});
  CheckCompiled(
      {"aten.mm.default", {Dense({33, 1}, bf), Dense({1, 17}, bf)}, {}});
  CheckCompiled(
      {"aten.mm.default", {Dense({4, 0}, bf), Dense({0, 3}, bf)}, {}});
  // Below AVX-512 (oneDNN has no bfloat16 GEMM there) the operands are
  // widened by a Kiln kernel, as float16's always are (no CPU library
  // takes it).
  {
    v1::CompileRequest req;
    *req.mutable_graph() = CaseGraph(
        {"aten.mm.default", {Dense({6, 11}, bf), Dense({11, 5}, bf)}, {}});
    v1::CpuTarget v3 = HostCpuTarget();
    if (CpuTargetHasAvx512(v3)) {
      v3.set_cpu("x86-64-v3");
      v3.set_features("");
      *req.mutable_target()->mutable_cpu() = v3;
      auto artifact = Compile(req);
      ASSERT_TRUE(artifact.ok()) << artifact.status();
      EXPECT_EQ(CountLaunches(*artifact), 3);
      for (const v1::Step& s : artifact->program().steps()) {
        if (s.has_call()) EXPECT_EQ(s.call().gemm().dtype(), v1::FLOAT32);
      }
    }
  }
  const DType h = DType::kFloat16;
  const v1::Artifact f = CheckCompiled(
      {"aten.mm.default", {Dense({6, 11}, h), Dense({11, 5}, h)}, {}});
  EXPECT_EQ(CountLaunches(f), 3);
}

TEST(MatmulCompiled, DynamicSizes) {
  // x: [s0, 8] @ w: [8, 5], bound to several values of s0.
  for (int64_t s0 : {2, 7, 31}) {
    TestInput x{DType::kFloat32, {s0, 8}, {}, 0, {"s0", ""}};
    CheckCompiled({"aten.mm.default", {x, Dense({8, 5})}, {}});
    TestInput xb{DType::kFloat32, {s0, 3, 8}, {}, 0, {"s0", "", ""}};
    TestInput wb{DType::kFloat32, {s0, 8, 5}, {}, 0, {"s0", "", ""}};
    CheckCompiled({"aten.bmm.default", {xb, wb}, {}});
  }
}

// nn.Linear on a 3-D input as AOTAutograd writes it: view to 2-D, addmm
// with the transposed weight, view back. The view of a contiguous input and
// the transposed weight are both read in place: the program is one call and
// the bias kernel.
TEST(MatmulCompiled, LinearOnA3DInputReadsInPlace) {
  v1::CompileRequest req;
  const std::string json = R"({
    "symbols": [{"name": "s0"}],
    "inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "device": "CPU",
        "sizes": [{"symbol": "s0"}, {"value": 6}, {"value": 16}]}},
      {"name": "w", "meta": {"dtype": "FLOAT32", "device": "CPU",
        "sizes": [{"value": 24}, {"value": 16}]}},
      {"name": "b", "meta": {"dtype": "FLOAT32", "device": "CPU",
        "sizes": [{"value": 24}]}}],
    "nodes": [
      {"op": "aten.view.default", "args": [{"ref": "x"},
        {"dims": {"values": [{"value": -1}, {"value": 16}]}}],
       "outputs": ["x2"]},
      {"op": "aten.t.default", "args": [{"ref": "w"}], "outputs": ["wt"]},
      {"op": "aten.addmm.default", "args": [{"ref": "b"}, {"ref": "x2"},
        {"ref": "wt"}], "outputs": ["y2"]},
      {"op": "aten.view.default", "args": [{"ref": "y2"},
        {"dims": {"values": [{"symbol": "s0"}, {"value": 6}, {"value": 24}]}}],
       "outputs": ["y"]}],
    "outputs": ["y"]})";
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(json, req.mutable_graph())
          .ok());
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  EXPECT_EQ(CountCalls(*artifact), 1);
  EXPECT_EQ(CountLaunches(*artifact), 1) << artifact->program().DebugString();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::mt19937_64 rng(3);
  for (int64_t s0 : {2, 5}) {
    std::vector<HostTensor> in = {
        HostTensor::Empty(DType::kFloat32, {s0, 6, 16}),
        HostTensor::Empty(DType::kFloat32, {24, 16}),
        HostTensor::Empty(DType::kFloat32, {24})};
    for (HostTensor& t : in) FillRandom(t, rng);
    auto want = EvaluateReference(*graph, in);
    auto got = (*exe)->Run(in);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(Compare((*got)[0], (*want)[0]), "");
  }
}

// ---- the runtime's checks of GEMM steps ----

// A compiled mm whose GEMM step the test then damages.
v1::Artifact MmArtifact() {
  v1::CompileRequest req;
  *req.mutable_graph() =
      CaseGraph({"aten.mm.default", {Dense({4, 5}), Dense({5, 3})}, {}});
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  EXPECT_TRUE(artifact.ok()) << artifact.status();
  return *artifact;
}

v1::Gemm* GemmOf(v1::Artifact& a) {
  for (v1::Step& s : *a.mutable_program()->mutable_steps()) {
    if (s.has_call()) return s.mutable_call()->mutable_gemm();
  }
  return nullptr;
}

void ExpectLoadRefused(const v1::Artifact& a, const std::string& part) {
  auto exe = CpuExecutable::Load(a);
  ASSERT_FALSE(exe.ok());
  EXPECT_EQ(exe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(exe.status().message().find(part), std::string::npos)
      << exe.status();
}

void ExpectRunRefused(const v1::Artifact& a, const std::string& part) {
  auto exe = CpuExecutable::Load(a);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::vector<HostTensor> in = {HostTensor::Empty(DType::kFloat32, {4, 5}),
                                HostTensor::Empty(DType::kFloat32, {5, 3})};
  auto out = (*exe)->Run(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find(part), std::string::npos)
      << out.status();
}

TEST(MatmulRuntime, MalformedGemmStepsAreRefused) {
  {
    v1::Artifact a = MmArtifact();
    a.mutable_program()->mutable_steps(0)->mutable_call()->set_library(
        v1::ExternCall::CUBLASLT);
    ExpectLoadRefused(a, "calls cuBLASLt; this runtime calls BLAS");
  }
  {
    v1::Artifact a = MmArtifact();
    GemmOf(a)->mutable_c()->set_buffer(0);  // write an input
    ExpectLoadRefused(a, "input or an operand");
  }
  {
    v1::Artifact a = MmArtifact();
    GemmOf(a)->mutable_a()->set_buffer(17);
    ExpectLoadRefused(a, "passes buffer 17");
  }
  {
    v1::Artifact a = MmArtifact();
    GemmOf(a)->set_dtype(v1::FLOAT16);
    ExpectLoadRefused(a, "multiplies float16");
  }
  {
    // Another C dtype only where the library takes the pair (bfloat16
    // operands into float32), and its buffer must be of that dtype.
    v1::Artifact a = MmArtifact();
    GemmOf(a)->set_c_dtype(v1::FLOAT16);
    ExpectLoadRefused(a, "multiplies float32 into a float16 C");
    v1::Artifact b = MmArtifact();
    GemmOf(b)->set_c_dtype(v1::FLOAT32);  // the same dtype: allowed
    ASSERT_TRUE(CpuExecutable::Load(b).ok());
    v1::Artifact c = MmArtifact();
    GemmOf(c)->set_dtype(v1::BFLOAT16);
    GemmOf(c)->set_c_dtype(v1::FLOAT32);
    ExpectLoadRefused(c, "is not of the call's dtype");  // A is float32
    v1::Artifact d = MmArtifact();
    GemmOf(d)->set_c_dtype(static_cast<v1::DType>(99));
    ExpectLoadRefused(d, "unknown dtype for C");
  }
  {
    // A read from an offset past its data: reaches past the buffer's end.
    v1::Artifact a = MmArtifact();
    GemmOf(a)->mutable_a()->mutable_offset()->add_terms()->set_coeff(10);
    ExpectRunRefused(a, "past the end of buffer 0");
  }
  {
    // Epilogues and TF32 are cuBLASLt's; a CPU runtime refuses them.
    v1::Artifact a = MmArtifact();
    GemmOf(a)->set_epilogue(v1::Gemm::RELU);
    ExpectLoadRefused(a, "for an epilogue, TF32 or a strict reduction");
    v1::Artifact b = MmArtifact();
    GemmOf(b)->set_tf32(true);
    ExpectLoadRefused(b, "for an epilogue, TF32 or a strict reduction");
    v1::Artifact c = MmArtifact();
    GemmOf(c)->mutable_bias()->set_buffer(0);
    ExpectLoadRefused(c, "a bias without a bias epilogue");
  }
  {
    // No unit stride.
    v1::Artifact a = MmArtifact();
    GemmOf(a)->mutable_b()->mutable_col_stride()->mutable_terms(0)->set_coeff(
        2);
    ExpectRunRefused(a, "unit stride");
  }
}

}  // namespace
}  // namespace kiln::testing
