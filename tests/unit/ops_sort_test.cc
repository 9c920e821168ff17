// The sort family (graph/ops/sort.h): sort, sort.stable and topk through
// the reference evaluator and through kernels compiled for this machine:
// hand-worked values (PyTorch's, NaN ordered above every number, ties in
// index order), every dtype, negative dims, 0-d and empty tensors,
// non-contiguous inputs, random inputs with many ties and NaNs (compiled
// output equal to the reference's, bit for bit), the size limit of the
// quadratic lowering, argument errors, and topk's backward (a scatter into
// zeros) in one graph.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "graph/import.h"
#include "graph/ops/sort.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "runtime/thread_pool.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/numerics.h"
#include "tests/unit/op_harness.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("sort", SortSuiteOps());

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr DType kAllSortDTypes[] = {kF32, kF16, kBF16, kI32, kI64};

const std::string kSort = "aten.sort.default";
const std::string kStable = "aten.sort.stable";
const std::string kTopK = "aten.topk.default";

// The one-op graph with each input's strides in its metadata, compiled for
// this machine.
absl::StatusOr<std::unique_ptr<CpuExecutable>> CompileOneOp(
    const std::string& op, const std::vector<HostTensor>& in,
    const std::vector<v1::Argument>& args) {
  v1::CompileRequest req;
  *req.mutable_graph() = OneOpGraph(op, in, args);
  for (size_t i = 0; i < in.size(); ++i) {
    v1::TensorMeta* m = req.mutable_graph()->mutable_inputs(i)->mutable_meta();
    for (int64_t s : in[i].strides()) m->add_strides()->set_value(s);
  }
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  if (!artifact.ok()) return artifact.status();
  return CpuExecutable::Load(*artifact);
}

std::vector<HostTensor> RunCompiled(const std::string& op,
                                    const std::vector<HostTensor>& in,
                                    const std::vector<v1::Argument>& args) {
  auto exe = CompileOneOp(op, in, args);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  ThreadPool pool(2);
  auto got = (*exe)->Run(in, &pool);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return {};
  return *std::move(got);
}

// "" when `got` equals `want` element for element: same dtype and sizes,
// NaN where NaN, the same sign of zero, exact values.
std::string ExactDiff(const HostTensor& got, const HostTensor& want) {
  if (got.dtype() != want.dtype() || got.sizes() != want.sizes())
    return absl::StrCat(got.ToString(0), " vs ", want.ToString(0));
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.GetDoubleAt(i), w = want.GetDoubleAt(i);
    const bool same = std::isnan(w)
                          ? std::isnan(g)
                          : g == w && std::signbit(g) == std::signbit(w);
    if (!same) {
      return absl::StrCat("element ", i, ": got ", g, ", want ", w, " in ",
                          got.ToString(64), " vs ", want.ToString(64));
    }
  }
  return "";
}

// The reference gives `values` and `indices` (of `sizes`, values in
// `dtype`), and the compiled kernels give exactly the reference's outputs.
void CheckBoth(const std::string& op, const std::vector<HostTensor>& in,
               const std::vector<v1::Argument>& args, DType dtype,
               const std::vector<int64_t>& sizes,
               const std::vector<double>& values,
               const std::vector<double>& indices) {
  SCOPED_TRACE(op);
  auto r = RunTracked(op, in, args);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, dtype, sizes, values, 0);
  ExpectOutput(*r, 1, kI64, sizes, indices, 0);
  std::vector<HostTensor> got = RunCompiled(op, in, args);
  ASSERT_EQ(got.size(), 2u);
  for (int o = 0; o < 2; ++o)
    EXPECT_EQ(ExactDiff(got[o], r->outputs[o]), "") << "compiled output " << o;
}

// ---- hand-worked values (PyTorch 2.x's results) ----

TEST(SortValues, NanLastAscendingFirstDescendingTiesInIndexOrder) {
  const std::vector<double> x = {1, kNan, -2, kNan, kInf, 0, -0.0};
  for (DType dt : {kF32, kF16, kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const HostTensor t = MakeTensor(dt, {7}, x);
    CheckBoth(kSort, {t}, {In(0)}, dt, {7}, {-2, 0, -0.0, 1, kInf, kNan, kNan},
              {2, 5, 6, 0, 4, 1, 3});
    CheckBoth(kSort, {t}, {In(0), I(-1), B(true)}, dt, {7},
              {kNan, kNan, kInf, 1, 0, -0.0, -2}, {1, 3, 4, 0, 5, 6, 2});
    CheckBoth(kStable, {t}, {In(0), Kw("stable", B(true)), Kw("dim", I(0))}, dt,
              {7}, {-2, 0, -0.0, 1, kInf, kNan, kNan}, {2, 5, 6, 0, 4, 1, 3});
    CheckBoth(kTopK, {t}, {In(0), I(3)}, dt, {3}, {kNan, kNan, kInf},
              {1, 3, 4});
    // PyTorch leaves the order of topk's ties open; Kiln's is index order.
    CheckBoth(kTopK, {t}, {In(0), I(3), I(0), B(false)}, dt, {3}, {-2, 0, -0.0},
              {2, 5, 6});
  }
}

TEST(SortValues, IntegersAndBools) {
  for (DType dt : {kI32, kI64}) {
    SCOPED_TRACE(DTypeName(dt));
    const HostTensor t = MakeTensor(dt, {4}, {1, 3, 3, 1});
    CheckBoth(kStable, {t},
              {In(0), Kw("stable", B(true)), Kw("descending", B(true))}, dt,
              {4}, {3, 3, 1, 1}, {1, 2, 0, 3});
    CheckBoth(kSort, {t}, {In(0)}, dt, {4}, {1, 1, 3, 3}, {0, 3, 1, 2});
    CheckBoth(kTopK, {MakeTensor(dt, {8}, {3, 1, 4, 1, 5, 9, 2, 6})},
              {In(0), I(3)}, dt, {3}, {9, 6, 5}, {5, 7, 4});
    CheckBoth(kTopK, {MakeTensor(dt, {8}, {3, 1, 4, 1, 5, 9, 2, 6})},
              {In(0), I(3), I(-1), B(false), B(false)}, dt, {3}, {1, 1, 2},
              {1, 3, 6});
  }
  CheckBoth(kSort, {Bool({3}, {1, 0, 1})}, {In(0)}, kBool, {3}, {0, 1, 1},
            {1, 0, 2});
  CheckBoth(kSort, {Bool({3}, {1, 0, 1})}, {In(0), I(0), B(true)}, kBool, {3},
            {1, 1, 0}, {0, 2, 1});
}

TEST(SortValues, DimsNegativeDimsAndNonContiguousInputs) {
  // [[1, 2, 3], [4, 5, 6]] along dim 0 (dim -2), descending.
  CheckBoth(kSort, {M23()}, {In(0), I(-2), B(true)}, kF32, {2, 3},
            {4, 5, 6, 1, 2, 3}, {1, 1, 1, 0, 0, 0});
  // [[3, 1, 2], [0, 5, 4]]: top 2 of each row, then of each column.
  const HostTensor m = F32({2, 3}, {3, 1, 2, 0, 5, 4});
  CheckBoth(kTopK, {m}, {In(0), I(2)}, kF32, {2, 2}, {3, 2, 5, 4},
            {0, 2, 1, 2});
  CheckBoth(kTopK, {m}, {In(0), I(1), I(-2)}, kF32, {1, 3}, {3, 5, 4},
            {0, 1, 1});
  // The transposed view [[3, 0], [1, 5], [2, 4]] along its last dim.
  CheckBoth(kSort, {TransposedView(m)}, {In(0), I(-1)}, kF32, {3, 2},
            {0, 3, 1, 5, 2, 4}, {1, 0, 0, 1, 0, 1});
  CheckBoth(kTopK, {TransposedView(m)}, {In(0), I(2), I(0), B(false)}, kF32,
            {2, 2}, {1, 0, 2, 4}, {1, 0, 2, 2});
  // Rank 3, the middle dim.
  const HostTensor t = F32({2, 3, 2}, {5, 0, 1, 9, 3, 4, 8, 8, 7, 6, 8, 7});
  CheckBoth(kSort, {t}, {In(0), I(1)}, kF32, {2, 3, 2},
            {1, 0, 3, 4, 5, 9, 7, 6, 8, 7, 8, 8},
            {1, 0, 2, 2, 0, 1, 1, 1, 0, 2, 2, 0});
}

TEST(SortValues, ZeroDimAndEmptyTensors) {
  for (DType dt : kAllSortDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    const HostTensor s = MakeTensor(dt, {}, {3});
    CheckBoth(kSort, {s}, {In(0)}, dt, {}, {3}, {0});
    CheckBoth(kSort, {s}, {In(0), I(0), B(true)}, dt, {}, {3}, {0});
    // PyTorch keeps a 0-d result for a 0-d input, k = 0 or 1.
    CheckBoth(kTopK, {s}, {In(0), I(1)}, dt, {}, {3}, {0});
    CheckBoth(kTopK, {s}, {In(0), I(0), I(-1)}, dt, {}, {3}, {0});
  }
  CheckBoth(kSort, {F32({0, 3}, {})}, {In(0), I(0)}, kF32, {0, 3}, {}, {});
  CheckBoth(kSort, {F32({2, 0}, {})}, {In(0)}, kF32, {2, 0}, {}, {});
  CheckBoth(kTopK, {F32({2, 0}, {})}, {In(0), I(0)}, kF32, {2, 0}, {}, {});
  CheckBoth(kTopK, {M23()}, {In(0), I(0)}, kF32, {2, 0}, {}, {});
  CheckBoth(kTopK, {F32({0, 4}, {})}, {In(0), I(2)}, kF32, {0, 2}, {}, {});
}

TEST(SortValues, ArgumentErrorsNameNodeOpAndArgument) {
  ExpectInvalid(
      kTopK, {M23()}, {In(0), I(4)},
      {"node 0 (aten.topk.default)", "'k'", "out of range", "k = 4", "size 3"});
  ExpectInvalid(kTopK, {M23()}, {In(0), I(-1)}, {"'k'", "k = -1"});
  ExpectInvalid(kTopK, {M23()}, {In(0), I(3), I(0)}, {"'k'", "size 2"});
  ExpectInvalid(kTopK, {F32({}, {1})}, {In(0), I(2)}, {"'k'", "size 1"});
  ExpectInvalid(kTopK, {Bool({2}, {1, 0})}, {In(0), I(1)},
                {"node 0 (aten.topk.default)", "'self'", "bool"});
  ExpectInvalid(kSort, {M23()}, {In(0), I(2)},
                {"node 0 (aten.sort.default)", "dim 2"});
  ExpectInvalid(kStable, {M23()}, {In(0), Kw("dim", I(-3))}, {"dim -3"});
  ExpectInvalid(kTopK, {M23()}, {In(0), I(1), I(5)}, {"dim 5"});
}

// ---- random inputs: many ties, NaNs, infinities, signed zeros ----

// Values drawn from a small set (ties in every row), NaN, +-inf and -0.0
// among them for floating dtypes.
void FillTies(HostTensor& t, std::mt19937_64& rng) {
  static const double kFloats[] = {-1.5, -0.0, 0.0,   0.25, 2, 7,
                                   kNan, kInf, -kInf, 1e4,  -3};
  std::uniform_int_distribution<int> pick(0, std::size(kFloats) - 1);
  std::uniform_int_distribution<int> small(-3, 3);
  std::uniform_real_distribution<double> real(-4, 4);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!IsFloating(t.dtype())) {
      t.SetIntAt(i, t.dtype() == kBool ? small(rng) > 0 : small(rng));
    } else if (rng() % 3 == 0) {
      t.SetDoubleAt(i, real(rng));
    } else {
      t.SetDoubleAt(i, kFloats[pick(rng)]);
    }
  }
}

// A [d0, d1, d2] tensor stored permuted (dims reversed in memory) or
// contiguous.
HostTensor RandomInput(DType dt, const std::vector<int64_t>& sizes,
                       bool permuted, std::mt19937_64& rng) {
  HostTensor t;
  if (permuted) {
    std::vector<int64_t> strides(sizes.size());
    int64_t s = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      strides[d] = s;
      s *= sizes[d];
    }
    t = HostTensor::Strided(dt, sizes, strides, 0, s);
  } else {
    t = HostTensor::Empty(dt, sizes);
  }
  FillTies(t, rng);
  return t;
}

TEST(SortRandom, CompiledEqualsReferenceForEveryDTypeDimAndDirection) {
  std::mt19937_64 rng(17);
  int cases = 0;
  for (DType dt : kAllSortDTypes) {
    for (const std::vector<int64_t>& sizes :
         std::vector<std::vector<int64_t>>{{37}, {5, 9}, {3, 4, 6}}) {
      const int rank = static_cast<int>(sizes.size());
      for (int dim = -rank; dim < rank; ++dim) {
        const int64_t n = sizes[dim < 0 ? dim + rank : dim];
        for (bool descending : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dt), " sizes ", sizes.size(),
                                    "-d dim ", dim, " descending ",
                                    descending));
          const HostTensor x = RandomInput(dt, sizes, rng() % 2 == 1, rng);
          const int64_t k = static_cast<int64_t>(rng() % (n + 1));
          for (const auto& [op, args] :
               std::vector<std::pair<std::string, std::vector<v1::Argument>>>{
                   {kSort, {In(0), I(dim), B(descending)}},
                   {kStable,
                    {In(0), Kw("stable", B(true)), Kw("dim", I(dim)),
                     Kw("descending", B(descending))}},
                   {kTopK, {In(0), I(k), I(dim), B(descending)}}}) {
            SCOPED_TRACE(op);
            auto want = RunTracked(op, {x}, args);
            ASSERT_TRUE(want.ok()) << want.status();
            std::vector<HostTensor> got = RunCompiled(op, {x}, args);
            ASSERT_EQ(got.size(), 2u);
            EXPECT_EQ(ExactDiff(got[0], want->outputs[0]), "");
            EXPECT_EQ(ExactDiff(got[1], want->outputs[1]), "");
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * (2 + 4 + 6) * 2 * 3);  // dtypes, dims, directions, ops
}

// The reference agrees with a plain std::sort of distinct values (no ties,
// so any correct sort gives the same permutation).
TEST(SortRandom, ReferenceMatchesStdSortOnDistinctValues) {
  std::mt19937_64 rng(5);
  std::vector<double> v(50);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) - 20;
  std::shuffle(v.begin(), v.end(), rng);
  auto r = RunTracked(kSort, {F32({50}, v)}, {In(0), I(0), B(true)});
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> sorted = v;
  std::sort(sorted.rbegin(), sorted.rend());
  ExpectValuesNear(r->outputs[0], sorted, 0);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(v[r->outputs[1].GetIntAt(i)], sorted[i]);
}

// ---- the size limit of the quadratic lowering ----

TEST(SortLimit, LongestDimCompilesLongerIsUnimplemented) {
  const int64_t n = ops::kMaxSortSize;
  std::mt19937_64 rng(3);
  HostTensor x = HostTensor::Empty(kF32, {2, n});
  FillTies(x, rng);
  for (const std::string& op : {kSort, kTopK}) {
    SCOPED_TRACE(op);
    const std::vector<v1::Argument> args =
        op == kTopK ? std::vector<v1::Argument>{In(0), I(8)}
                    : std::vector<v1::Argument>{In(0)};
    auto want = RunTracked(op, {x}, args);
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<HostTensor> got = RunCompiled(op, {x}, args);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(ExactDiff(got[0], want->outputs[0]), "");
    EXPECT_EQ(ExactDiff(got[1], want->outputs[1]), "");
  }
  // One more: UNIMPLEMENTED naming node, op, dim and size (the reference
  // still evaluates it).
  const HostTensor longer = HostTensor::Empty(kF32, {n + 1, 2});
  for (const auto& [op, args] :
       std::vector<std::pair<std::string, std::vector<v1::Argument>>>{
           {kSort, {In(0), I(0)}},
           {kStable, {In(0), Kw("dim", I(-2))}},
           {kTopK, {In(0), I(1), I(0)}}}) {
    SCOPED_TRACE(op);
    auto exe = CompileOneOp(op, {longer}, args);
    ASSERT_EQ(exe.status().code(), absl::StatusCode::kUnimplemented)
        << exe.status();
    const std::string msg(exe.status().message());
    EXPECT_NE(msg.find("node 0 (" + op + "): "), std::string::npos) << msg;
    EXPECT_NE(msg.find("dim 0 of size 4097"), std::string::npos) << msg;
    EXPECT_NE(msg.find("quadratic"), std::string::npos) << msg;
    EXPECT_TRUE(RunOp(op, {longer}, args).ok());
  }
}

TEST(SortLimit, SymbolicSortedDimIsUnimplementedOtherDimsMayBeSymbolic) {
  // x: [s0, 6]. Sorting along dim 1 compiles; along dim 0 it does not.
  auto request = [](int dim) {
    v1::CompileRequest req;
    *req.mutable_graph() =
        OneOpGraph(kTopK, {F32({4, 6}, {})}, {In(0), I(2), I(dim)});
    req.mutable_graph()->add_symbols()->set_name("s0");
    req.mutable_graph()
        ->mutable_inputs(0)
        ->mutable_meta()
        ->mutable_sizes(0)
        ->set_symbol("s0");
    *req.mutable_target()->mutable_cpu() = HostCpuTarget();
    return req;
  };
  auto ok = Compile(request(1));
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto exe = CpuExecutable::Load(*ok);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::mt19937_64 rng(9);
  for (int64_t rows : {2, 5}) {
    HostTensor x = HostTensor::Empty(kF32, {rows, 6});
    FillTies(x, rng);
    auto want = RunOp(kTopK, {x}, {In(0), I(2), I(1)});
    ASSERT_TRUE(want.ok()) << want.status();
    ThreadPool pool(2);
    auto got = (*exe)->Run({x}, &pool);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(ExactDiff((*got)[0], want->outputs[0]), "");
    EXPECT_EQ(ExactDiff((*got)[1], want->outputs[1]), "");
  }
  auto refused = Compile(request(0));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented)
      << refused.status();
  EXPECT_NE(refused.status().message().find(
                "node 0 (aten.topk.default): sorts along dim 0 of symbolic "
                "size"),
            std::string::npos)
      << refused.status();
}

// ---- in a graph: topk and its backward (AOTAutograd's scatter into zeros),
// sort, sort.stable and topk(largest=False) of another input ----

TEST(SortGraphs, TopKForwardBackwardAndSorts) {
  SCOPED_TRACE("topk_sort.json");
  v1::CompileRequest req = Request("topk_sort.json");
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(11);
  ThreadPool pool(2);
  for (int round = 0; round < 3; ++round) {
    std::vector<HostTensor> in = RandomInputs(*graph, {}, rng);
    if (round > 0) FillTies(in[2], rng);
    auto want = EvaluateReference(*graph, in);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*exe)->Run(in, &pool);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t o = 0; o < got->size(); ++o)
      EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
    // The gradient: g at the top 4 of each row, 0 elsewhere.
    const HostTensor& dx = (*got)[2];
    const double g = in[1].GetDouble({});
    for (int64_t row = 0; row < 32; ++row) {
      int hits = 0;
      for (int64_t c = 0; c < 16; ++c) {
        const double v = dx.GetDouble({row, c});
        if (v != 0) {
          ++hits;
          EXPECT_EQ(v, static_cast<float>(g));
        }
      }
      EXPECT_EQ(hits, g == 0 ? 0 : 4) << "row " << row;
    }
  }
}

}  // namespace
}  // namespace kiln::testing
