// Per-op tests of the norm family (graph/ops/norm.cc, compiler/ops/norm_*.cc),
// the pooling ops (graph/ops/pooling.cc, compiler/ops/pooling_*.cc)
// and of the activation backward ops (graph/ops/pointwise.cc): numbers worked
// out by hand through the reference evaluator, then each op compiled for this
// machine's CPU against the reference on random inputs in every float dtype,
// contiguous and not.
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/reference.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "runtime/thread_pool.h"
#include "tests/unit/numerics.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("norm", NormSuiteOps());

constexpr DType kFloatDTypes[] = {DType::kFloat32, DType::kFloat16,
                                  DType::kBFloat16};

// A tensor of `dtype` and `sizes` with seeded random values in [lo, hi].
HostTensor Random(DType dtype, std::vector<int64_t> sizes, std::mt19937_64& rng,
                  double lo = -2, double hi = 2) {
  HostTensor t = HostTensor::Empty(dtype, std::move(sizes));
  FillRandom(t, rng, lo, hi);
  return t;
}

// `t` with its last two dims stored transposed: same values, not
// contiguous.
HostTensor NonContiguous(const HostTensor& t) {
  std::vector<int64_t> sizes = t.sizes();
  const int r = t.rank();
  std::swap(sizes[r - 1], sizes[r - 2]);
  HostTensor store = HostTensor::Empty(t.dtype(), sizes);
  std::vector<int64_t> strides = store.strides();
  std::swap(strides[r - 1], strides[r - 2]);
  HostTensor view = HostTensor::View(store, t.sizes(), strides, 0);
  for (int64_t i = 0; i < t.numel(); ++i) view.SetDoubleAt(i, t.GetDoubleAt(i));
  return view;
}

// Compiles the one-op graph for this machine's CPU (inputs declared with
// their strides), runs it and compares every output with the reference.
void ExpectCompiledMatchesReference(const std::string& op,
                                    const std::vector<HostTensor>& inputs,
                                    const std::vector<v1::Argument>& args) {
  SCOPED_TRACE(op);
  v1::CompileRequest req;
  *req.mutable_graph() = OneOpGraph(op, inputs, args);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].IsContiguous()) continue;
    v1::TensorMeta* m = req.mutable_graph()->mutable_inputs(i)->mutable_meta();
    for (int64_t s : inputs[i].strides()) m->add_strides()->set_value(s);
  }
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto want = EvaluateReference(*graph, inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  ThreadPool pool(2);
  auto got = (*exe)->Run(inputs, &pool);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t o = 0; o < want->size(); ++o) {
    EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
  }
  ExercisedOps().insert(op);
}

v1::Argument Mask(bool a, bool b, bool c) {
  return Ints({a ? 1 : 0, b ? 1 : 0, c ? 1 : 0});
}

// ---- activation backward ops ----

TEST(ActivationBackward, HandWorkedValues) {
  CheckOp("aten.threshold_backward.default",
          {F32({4}, {1, 2, 3, 4}), F32({4}, {-1, 0, 0.5, 2})},
          {In(0), In(1), I(0)}, kF32, {4}, {0, 0, 3, 4});
  // Integers too, and self == threshold gives 0.
  CheckOp("aten.threshold_backward.default",
          {I64({4}, {1, 2, 3, 4}), I64({4}, {-1, 0, 1, 2})},
          {In(0), In(1), I(1)}, kI64, {4}, {0, 0, 0, 4});
  // A NaN self passes the gradient (ATen: self <= threshold ? 0 : grad).
  CheckOp("aten.threshold_backward.default",
          {F32({2}, {5, 6}), F32({2}, {kNaN, -3})}, {In(0), In(1), F(0.0)},
          kF32, {2}, {5, 0});
  // grad * (1 - y) * y; grad * (1 - y^2).
  CheckOp("aten.sigmoid_backward.default",
          {F32({2}, {1, 2}), F32({2}, {0.5, 0.25})}, {In(0), In(1)}, kF32, {2},
          {0.25, 0.375});
  CheckOp("aten.tanh_backward.default", {F32({2}, {1, 2}), F32({2}, {0.5, 0})},
          {In(0), In(1)}, kF32, {2}, {0.75, 2});
  // Values from torch.ops.aten.*_backward in float64.
  CheckOp("aten.silu_backward.default",
          {F32({3}, {1, 1, 1}), F32({3}, {0, 1, -1})}, {In(0), In(1)}, kF32,
          {3}, {0.5, 0.9276705118714869, 0.07232948812851325});
  CheckOp("aten.gelu_backward.default",
          {F32({3}, {1, 1, 2}), F32({3}, {0, 1, -1})}, {In(0), In(1)}, kF32,
          {3}, {0.5, 1.0833154705876864, 2 * -0.08331547058768635});
  CheckOp("aten.gelu_backward.default",
          {F32({3}, {1, 1, 1}), F32({3}, {0, 1, -1})},
          {In(0), In(1), Kw("approximate", S("tanh"))}, kF32, {3},
          {0.5, 1.0829640838457826, -0.08296408384578252});
  // Broadcasting and an empty tensor.
  CheckOp("aten.tanh_backward.default",
          {F32({2, 1}, {1, 2}), F32({2}, {0, 0.5})}, {In(0), In(1)}, kF32,
          {2, 2}, {1, 0.75, 2, 1.5});
  CheckOp("aten.sigmoid_backward.default", {F32({0}, {}), F32({0}, {})},
          {In(0), In(1)}, kF32, {0}, {});
}

TEST(ActivationBackward, DTypesAndErrors) {
  CheckOp("aten.tanh_backward.default", {BF16({1}, {1}), BF16({1}, {0.5})},
          {In(0), In(1)}, kBF16, {1}, {0.75}, 0);
  CheckOp("aten.sigmoid_backward.default", {F16({1}, {1}), F32({1}, {0.5})},
          {In(0), In(1)}, kF32, {1}, {0.25});
  ExpectInvalid("aten.sigmoid_backward.default", {I32({1}, {1}), I32({1}, {1})},
                {In(0), In(1)});
  ExpectInvalid("aten.gelu_backward.default", {F32({1}, {1}), F32({1}, {1})},
                {In(0), In(1), Kw("approximate", S("fast"))}, {"approximate"});
}

TEST(ActivationBackward, CompiledMatchesReference) {
  std::mt19937_64 rng(1);
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    for (bool strided : {false, true}) {
      HostTensor g = Random(dt, {5, 7}, rng), x = Random(dt, {5, 7}, rng);
      if (strided) x = NonContiguous(x);
      for (const char* op :
           {"aten.sigmoid_backward.default", "aten.tanh_backward.default",
            "aten.silu_backward.default", "aten.gelu_backward.default"}) {
        ExpectCompiledMatchesReference(op, {g, x}, {In(0), In(1)});
      }
      ExpectCompiledMatchesReference(
          "aten.gelu_backward.default", {g, x},
          {In(0), In(1), Kw("approximate", S("tanh"))});
      ExpectCompiledMatchesReference("aten.threshold_backward.default", {g, x},
                                     {In(0), In(1), F(0.25)});
    }
  }
}

// ---- softmax backward ----

TEST(SoftmaxBackward, HandWorkedValues) {
  // y = [0.5, 0.5], g = [1, 0]: sum(g * y) = 0.5, y * (g - 0.5).
  CheckOp("aten._softmax_backward_data.default",
          {F32({2}, {1, 0}), F32({2}, {0.5, 0.5})},
          {In(0), In(1), I(0), DT(v1::FLOAT32)}, kF32, {2}, {0.25, -0.25});
  // log: g - exp(y) * sum(g) with exp(y) = [0.5, 0.5], sum(g) = 1.
  CheckOp(
      "aten._log_softmax_backward_data.default",
      {F32({2}, {1, 0}), F32({2}, {-0.6931471805599453, -0.6931471805599453})},
      {In(0), In(1), I(-1), DT(v1::FLOAT32)}, kF32, {2}, {0.5, -0.5});
  // Over dim 0 of [[1, 0], [0, 1]] with y = 0.5 everywhere: columns.
  CheckOp("aten._softmax_backward_data.default",
          {F32({2, 2}, {1, 0, 0, 1}), F32({2, 2}, {0.5, 0.5, 0.5, 0.5})},
          {In(0), In(1), I(0), DT(v1::FLOAT32)}, kF32, {2, 2},
          {0.25, -0.25, -0.25, 0.25});
  // An empty row dim and the gradient in input_dtype.
  CheckOp("aten._softmax_backward_data.default",
          {F32({2, 0}, {}), F32({2, 0}, {})},
          {In(0), In(1), I(1), DT(v1::FLOAT32)}, kF32, {2, 0}, {});
  CheckOp("aten._softmax_backward_data.default",
          {F32({2}, {1, 0}), F32({2}, {0.5, 0.5})},
          {In(0), In(1), I(0), DT(v1::FLOAT16)}, kF16, {2}, {0.25, -0.25});
  ExpectInvalid("aten._softmax_backward_data.default",
                {F32({2}, {1, 0}), F32({3}, {0.5, 0.5, 0})},
                {In(0), In(1), I(0), DT(v1::FLOAT32)}, {"same shape"});
}

TEST(SoftmaxBackward, CompiledMatchesReference) {
  std::mt19937_64 rng(2);
  const v1::DType names[] = {v1::FLOAT32, v1::FLOAT16, v1::BFLOAT16};
  for (int k = 0; k < 3; ++k) {
    const DType dt = kFloatDTypes[k];
    SCOPED_TRACE(DTypeName(dt));
    for (bool strided : {false, true}) {
      HostTensor g = Random(dt, {6, 9}, rng), y = Random(dt, {6, 9}, rng, 0, 1);
      if (strided) g = NonContiguous(g);
      for (int dim : {-1, 0}) {
        for (const char* op : {"aten._softmax_backward_data.default",
                               "aten._log_softmax_backward_data.default"}) {
          ExpectCompiledMatchesReference(op, {g, y},
                                         {In(0), In(1), I(dim), DT(names[k])});
        }
      }
    }
  }
}

// ---- native_layer_norm_backward ----

// Rows [0, 1, 2] (mean 1, rstd sqrt(1.5)) with g = [1, 0, 0] and [0, 0, 1];
// values from torch.ops.aten.native_layer_norm_backward in float64.
constexpr double kR = 1.224744871391589;

TEST(LayerNormBackward, HandWorkedValues) {
  const HostTensor g = F32({2, 3}, {1, 0, 0, 0, 0, 1});
  const HostTensor x = F32({2, 3}, {0, 1, 2, 0, 1, 2});
  const HostTensor mean = F32({2, 1}, {1, 1}), rstd = F32({2, 1}, {kR, kR});
  {
    auto r =
        RunTracked("aten.native_layer_norm_backward.default",
                   {g, x, mean, rstd, F32({3}, {2, 1, 1}), F32({3}, {0, 0, 0})},
                   {In(0), In(1), Ints({3}), In(2), In(3), In(4), In(5),
                    Mask(true, true, true)});
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectOutput(*r, 0, kF32, {2, 3},
                 {kR / 3, -2 * kR / 3, kR / 3, kR / 6, -kR / 3, kR / 6});
    ExpectOutput(*r, 1, kF32, {3}, {-kR, 0, kR});
    ExpectOutput(*r, 2, kF32, {3}, {1, 0, 1});
  }
  {
    // No weight or bias: grad_input only.
    auto r = RunTracked("aten.native_layer_norm_backward.default",
                        {g, x, mean, rstd},
                        {In(0), In(1), Ints({3}), In(2), In(3), NoneArg(),
                         NoneArg(), Mask(true, false, false)});
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectOutput(*r, 0, kF32, {2, 3},
                 {kR / 6, -kR / 3, kR / 6, kR / 6, -kR / 3, kR / 6});
    ExpectOutput(*r, 1, kF32, {3}, {0, 0, 0});
  }
  ExpectInvalid("aten.native_layer_norm_backward.default",
                {g, x, F32({2}, {1, 1}), rstd},
                {In(0), In(1), Ints({3}), In(2), In(3), NoneArg(), NoneArg(),
                 Mask(true, false, false)},
                {"mean must have shape"});
}

TEST(LayerNormBackward, CompiledMatchesReference) {
  std::mt19937_64 rng(3);
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    for (bool strided : {false, true}) {
      HostTensor g = Random(dt, {3, 4, 5}, rng), x = Random(dt, {3, 4, 5}, rng);
      if (strided) x = NonContiguous(x);
      // One normalized dim and two; float32 statistics as the forward gives.
      HostTensor mean1 = Random(DType::kFloat32, {3, 4, 1}, rng);
      HostTensor rstd1 = Random(DType::kFloat32, {3, 4, 1}, rng, 0.5, 2);
      HostTensor w1 = Random(dt, {5}, rng), b1 = Random(dt, {5}, rng);
      ExpectCompiledMatchesReference("aten.native_layer_norm_backward.default",
                                     {g, x, mean1, rstd1, w1, b1},
                                     {In(0), In(1), Ints({5}), In(2), In(3),
                                      In(4), In(5), Mask(true, true, true)});
      HostTensor mean2 = Random(DType::kFloat32, {3, 1, 1}, rng);
      HostTensor rstd2 = Random(DType::kFloat32, {3, 1, 1}, rng, 0.5, 2);
      ExpectCompiledMatchesReference(
          "aten.native_layer_norm_backward.default", {g, x, mean2, rstd2},
          {In(0), In(1), Ints({4, 5}), In(2), In(3), NoneArg(), NoneArg(),
           Mask(true, false, false)});
    }
  }
  // Empty outer dims: zero gradients for weight and bias.
  ExpectCompiledMatchesReference(
      "aten.native_layer_norm_backward.default",
      {F32({0, 3}, {}), F32({0, 3}, {}), F32({0, 1}, {}), F32({0, 1}, {}),
       F32({3}, {1, 2, 3}), F32({3}, {0, 0, 0})},
      {In(0), In(1), Ints({3}), In(2), In(3), In(4), In(5),
       Mask(true, true, true)});
}

// ---- batch norm ----

// x = [[1, 2], [3, 6]] (N = 2, C = 2): channel 0 has mean 2, variance 1;
// channel 1 mean 4, variance 4. Values from torch.ops.aten in float64.
HostTensor BatchX() { return F32({2, 2}, {1, 2, 3, 6}); }

TEST(BatchNorm, TrainingHandWorkedValues) {
  auto r =
      RunTracked("aten._native_batch_norm_legit_functional.default",
                 {BatchX(), F32({2}, {1, 2}), F32({2}, {0, 1}),
                  F32({2}, {0, 1}), F32({2}, {1, 1})},
                 {In(0), In(1), In(2), In(3), In(4), B(true), F(0.1), F(0.0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 2}, {-1, -1, 1, 3});
  ExpectOutput(*r, 1, kF32, {2}, {2, 4});
  ExpectOutput(*r, 2, kF32, {2}, {1, 0.5});
  // momentum * mean + (1 - momentum) * running; the variance unbiased
  // (n / (n - 1) = 2): 0.1 * 2 + 0.9 * 1, 0.1 * 8 + 0.9 * 1.
  ExpectOutput(*r, 3, kF32, {2}, {0.2, 1.3});
  ExpectOutput(*r, 4, kF32, {2}, {1.1, 1.7});
  // No weight or bias, and no running statistics.
  auto s = RunTracked("aten._native_batch_norm_legit.no_stats", {BatchX()},
                      {In(0), NoneArg(), NoneArg(), B(true), F(0.1), F(0.0)});
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectOutput(*s, 0, kF32, {2, 2}, {-1, -1, 1, 1});
  ExpectOutput(*s, 2, kF32, {2}, {1, 0.5});
}

TEST(BatchNorm, EvalHandWorkedValues) {
  auto r = RunTracked("aten._native_batch_norm_legit_no_training.default",
                      {BatchX(), F32({2}, {1, 2}), F32({2}, {0, 1}),
                       F32({2}, {0, 1}), F32({2}, {1, 1})},
                      {In(0), In(1), In(2), In(3), In(4), F(0.1), F(0.0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {2, 2}, {1, 3, 3, 11});
  ExpectOutput(*r, 1, kF32, {0}, {});
  ExpectInvalid(
      "aten._native_batch_norm_legit_no_training.default",
      {BatchX(), F32({3}, {1, 2, 3}), F32({2}, {0, 1}), F32({2}, {1, 1})},
      {In(0), In(1), NoneArg(), In(2), In(3), F(0.1), F(0.0)}, {"shape [C]"});
}

TEST(BatchNorm, BackwardHandWorkedValues) {
  const std::vector<HostTensor> in = {
      F32({2, 2}, {1, 0, 0, 1}), BatchX(),         F32({2}, {1, 2}),
      F32({2}, {0, 1}),          F32({2}, {1, 1}), F32({2}, {2, 4}),
      F32({2}, {1, 0.5})};
  auto args = [](bool train) {
    return std::vector<v1::Argument>{
        In(0), In(1), In(2),    In(3),  In(4),
        In(5), In(6), B(train), F(0.0), Mask(true, true, true)};
  };
  {
    // Two elements per channel: the normalized output is +-1 whatever x
    // is, so grad_input is 0; grad_weight = sum(g * xhat), grad_bias = sum(g).
    auto r =
        RunTracked("aten.native_batch_norm_backward.default", in, args(true));
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectOutput(*r, 0, kF32, {2, 2}, {0, 0, 0, 0});
    ExpectOutput(*r, 1, kF32, {2}, {-1, 1});
    ExpectOutput(*r, 2, kF32, {2}, {1, 1});
  }
  {
    // Eval: g * rstd(running_var) * w; xhat from the running statistics.
    auto r =
        RunTracked("aten.native_batch_norm_backward.default", in, args(false));
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectOutput(*r, 0, kF32, {2, 2}, {1, 0, 0, 2});
    ExpectOutput(*r, 1, kF32, {2}, {1, 5});
    ExpectOutput(*r, 2, kF32, {2}, {1, 1});
  }
}

TEST(BatchNorm, CompiledMatchesReference) {
  std::mt19937_64 rng(4);
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    for (bool strided : {false, true}) {
      HostTensor x = Random(dt, {4, 3, 5, 2}, rng);
      if (strided) x = NonContiguous(x);
      HostTensor g = Random(dt, {4, 3, 5, 2}, rng);
      HostTensor w = Random(dt, {3}, rng), b = Random(dt, {3}, rng);
      HostTensor rm = Random(DType::kFloat32, {3}, rng);
      HostTensor rv = Random(DType::kFloat32, {3}, rng, 0.5, 2);
      for (bool train : {true, false}) {
        ExpectCompiledMatchesReference(
            "aten._native_batch_norm_legit_functional.default",
            {x, w, b, rm, rv},
            {In(0), In(1), In(2), In(3), In(4), B(train), F(0.1), F(1e-5)});
      }
      ExpectCompiledMatchesReference(
          "aten._native_batch_norm_legit_no_training.default",
          {x, w, b, rm, rv},
          {In(0), In(1), In(2), In(3), In(4), F(0.1), F(1e-5)});
      ExpectCompiledMatchesReference(
          "aten._native_batch_norm_legit.no_stats", {x},
          {In(0), NoneArg(), NoneArg(), B(true), F(0.1), F(1e-5)});
      HostTensor sm = Random(DType::kFloat32, {3}, rng);
      HostTensor si = Random(DType::kFloat32, {3}, rng, 0.5, 2);
      for (bool train : {true, false}) {
        ExpectCompiledMatchesReference(
            "aten.native_batch_norm_backward.default",
            {g, x, w, rm, rv, sm, si},
            {In(0), In(1), In(2), In(3), In(4), In(5), In(6), B(train), F(1e-5),
             Mask(true, true, true)});
      }
      ExpectCompiledMatchesReference(
          "aten.native_batch_norm_backward.default", {g, x, sm, si},
          {In(0), In(1), NoneArg(), NoneArg(), NoneArg(), In(2), In(3), B(true),
           F(1e-5), Mask(true, false, false)});
    }
  }
}

// ---- group norm ----

TEST(GroupNorm, HandWorkedValues) {
  // C = 4 in 2 groups: [1, 3] (mean 2, var 1) and [5, 9] (mean 7, var 4).
  const HostTensor x = F32({1, 4, 1}, {1, 3, 5, 9});
  auto r =
      RunTracked("aten.native_group_norm.default", {x},
                 {In(0), NoneArg(), NoneArg(), I(1), I(4), I(1), I(2), F(0.0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 4, 1}, {-1, 1, -1, 1});
  ExpectOutput(*r, 1, kF32, {1, 2}, {2, 7});
  ExpectOutput(*r, 2, kF32, {1, 2}, {1, 0.5});
  auto b = RunTracked("aten.native_group_norm_backward.default",
                      {F32({1, 4, 1}, {1, 0, 0, 1}), x, F32({1, 2}, {2, 7}),
                       F32({1, 2}, {1, 0.5}), F32({4}, {1, 1, 1, 1})},
                      {In(0), In(1), In(2), In(3), In(4), I(1), I(4), I(1),
                       I(2), Mask(true, true, true)});
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectOutput(*b, 0, kF32, {1, 4, 1}, {0, 0, 0, 0});
  ExpectOutput(*b, 1, kF32, {4}, {-1, 0, 0, 1});
  ExpectOutput(*b, 2, kF32, {4}, {1, 0, 0, 1});
  ExpectInvalid("aten.native_group_norm.default", {x},
                {In(0), NoneArg(), NoneArg(), I(1), I(4), I(1), I(3), F(0.0)},
                {"divisible"});
}

// HxW = 15 takes the one-step form, HxW = 40 (and 48 with a mean far
// from 0) the per-channel-first one (norm_lowering.cc, PerChannelFirst).
TEST(GroupNorm, CompiledMatchesReference) {
  std::mt19937_64 rng(6);
  struct Shape {
    int64_t h, w;
    double low, high;  // the input's range
  };
  for (const Shape& shape :
       {Shape{3, 5, -1, 1}, Shape{8, 5, -1, 1}, Shape{6, 8, 90, 110}}) {
    const int64_t hxw = shape.h * shape.w;
    SCOPED_TRACE(hxw);
    for (DType dt : kFloatDTypes) {
      SCOPED_TRACE(DTypeName(dt));
      for (bool strided : {false, true}) {
        const std::vector<int64_t> sizes = {2, 6, shape.h, shape.w};
        HostTensor x = Random(dt, sizes, rng, shape.low, shape.high);
        if (strided) x = NonContiguous(x);
        HostTensor g = Random(dt, sizes, rng);
        HostTensor w = Random(dt, {6}, rng), b = Random(dt, {6}, rng);
        ExpectCompiledMatchesReference(
            "aten.native_group_norm.default", {x, w, b},
            {In(0), In(1), In(2), I(2), I(6), I(hxw), I(3), F(1e-5)});
        ExpectCompiledMatchesReference(
            "aten.native_group_norm.default", {x},
            {In(0), NoneArg(), NoneArg(), I(2), I(6), I(hxw), I(6), F(1e-5)});
        HostTensor mean = Random(dt, {2, 3}, rng, shape.low, shape.high);
        HostTensor rstd = Random(dt, {2, 3}, rng, 0.5, 2);
        ExpectCompiledMatchesReference(
            "aten.native_group_norm_backward.default", {g, x, mean, rstd, w},
            {In(0), In(1), In(2), In(3), In(4), I(2), I(6), I(hxw), I(3),
             Mask(true, true, true)});
        ExpectCompiledMatchesReference(
            "aten.native_group_norm_backward.default", {g, x, mean, rstd},
            {In(0), In(1), In(2), In(3), NoneArg(), I(2), I(6), I(hxw), I(3),
             Mask(true, false, false)});
        ExpectCompiledMatchesReference(
            "aten.native_group_norm_backward.default", {g, x, mean, rstd, w},
            {In(0), In(1), In(2), In(3), In(4), I(2), I(6), I(hxw), I(3),
             Mask(false, true, false)});
        // 2 groups of 3 channels.
        HostTensor mean2 = Random(dt, {2, 2}, rng, shape.low, shape.high);
        HostTensor rstd2 = Random(dt, {2, 2}, rng, 0.5, 2);
        ExpectCompiledMatchesReference(
            "aten.native_group_norm_backward.default", {g, x, mean2, rstd2, w},
            {In(0), In(1), In(2), In(3), In(4), I(2), I(6), I(hxw), I(2),
             Mask(true, false, true)});
      }
    }
  }
  // A [N, C] input (HxW = 1) and an empty batch.
  ExpectCompiledMatchesReference(
      "aten.native_group_norm.default", {Random(DType::kFloat32, {3, 4}, rng)},
      {In(0), NoneArg(), NoneArg(), I(3), I(4), I(1), I(2), F(1e-5)});
  ExpectCompiledMatchesReference(
      "aten.native_group_norm.default", {F32({0, 4, 2}, {})},
      {In(0), NoneArg(), NoneArg(), I(0), I(4), I(2), I(2), F(1e-5)});
}

// ---- pooling ----

// [[0, 1, 2, 3], [4, 20, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]] as
// [1, 4, 4]; values from torch.ops.aten in float32.
HostTensor Plane() {
  return F32({1, 4, 4},
             {0, 1, 2, 3, 4, 20, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
}

TEST(Pooling, MaxPoolHandWorkedValues) {
  {
    auto r = RunTracked("aten.max_pool2d_with_indices.default", {Plane()},
                        {In(0), Ints({2, 2}), Ints({2, 2})});
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectOutput(*r, 0, kF32, {1, 2, 2}, {20, 7, 13, 15});
    ExpectOutput(*r, 1, kI64, {1, 2, 2}, {5, 7, 13, 15});
  }
  {
    // Padding 1, kernel 3, stride 2: every window holds the 20 at (1, 1).
    auto r = RunTracked("aten.max_pool2d_with_indices.default", {Plane()},
                        {In(0), Ints({3}), Ints({2}), Ints({1})});
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectOutput(*r, 0, kF32, {1, 2, 2}, {20, 20, 20, 20});
    ExpectOutput(*r, 1, kI64, {1, 2, 2}, {5, 5, 5, 5});
  }
  // Its backward sends all four gradients to (1, 1).
  CheckOp("aten.max_pool2d_with_indices_backward.default",
          {F32({1, 2, 2}, {1, 1, 1, 1}), Plane(), I64({1, 2, 2}, {5, 5, 5, 5})},
          {In(0), In(1), Ints({3, 3}), Ints({2, 2}), Ints({1, 1}), Ints({1, 1}),
           B(false), In(2)},
          kF32, {1, 4, 4}, {0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  ExpectInvalid("aten.max_pool2d_with_indices.default", {Plane()},
                {In(0), Ints({2}), Ints({2}), Ints({2})}, {"at most half"});
}

// Ties (the first position wins), NaN (the first NaN wins), and windows
// of -inf only, with and without padding (the index is the window's first
// input position, never the padding), compiled against the reference.
TEST(Pooling, MaxPoolTiesNanAndInfinities) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const HostTensor x = F32({1, 4, 4}, {1, 5, 5, 2,        //
                                       5, nan, 3, 3,      //
                                       -inf, -inf, 3, 4,  //
                                       -inf, -inf, 4, 4});
  ExpectCompiledMatchesReference("aten.max_pool2d_with_indices.default", {x},
                                 {In(0), Ints({2, 2}), Ints({2, 2})});
  ExpectCompiledMatchesReference(
      "aten.max_pool2d_with_indices.default", {x},
      {In(0), Ints({3, 3}), Ints({2, 2}), Ints({1, 1})});
  ExpectCompiledMatchesReference(
      "aten.max_pool2d_with_indices.default", {x},
      {In(0), Ints({2, 2}), Ints({1, 1}), Ints({1, 1}), Ints({2, 2})});
  auto r = RunTracked("aten.max_pool2d_with_indices.default", {x},
                      {In(0), Ints({2, 2}), Ints({2, 2})});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 1, kI64, {1, 2, 2}, {5, 2, 8, 11});
}

TEST(Pooling, AvgPoolHandWorkedValues) {
  CheckOp("aten.avg_pool2d.default", {Plane()},
          {In(0), Ints({3, 3}), Ints({2, 2}), Ints({1, 1})}, kF32, {1, 2, 2},
          {25.0 / 9, 39.0 / 9, 66.0 / 9, 105.0 / 9});
  // count_include_pad=False divides by the elements inside the input.
  CheckOp("aten.avg_pool2d.default", {Plane()},
          {In(0), Ints({3, 3}), Ints({2, 2}), Ints({1, 1}), B(false), B(false)},
          kF32, {1, 2, 2}, {6.25, 6.5, 11, 105.0 / 9});
  CheckOp(
      "aten.avg_pool2d.default", {Plane()},
      {In(0), Ints({2, 2}), Ints({2, 2}), Ints({0}), B(false), B(true), I(2)},
      kF32, {1, 2, 2}, {12.5, 9, 21, 25});
  CheckOp("aten.avg_pool2d_backward.default",
          {F32({1, 2, 2}, {1, 1, 1, 1}), Plane()},
          {In(0), In(1), Ints({3, 3}), Ints({2, 2}), Ints({1, 1}), B(false),
           B(false), NoneArg()},
          kF32, {1, 4, 4},
          {0.25, 5.0 / 12, 1.0 / 6, 1.0 / 6, 5.0 / 12, 25.0 / 36, 5.0 / 18,
           5.0 / 18, 1.0 / 6, 5.0 / 18, 1.0 / 9, 1.0 / 9, 1.0 / 6, 5.0 / 18,
           1.0 / 9, 1.0 / 9});
}

TEST(Pooling, AdaptiveAvgPoolHandWorkedValues) {
  // 5 -> 3: windows [0, 2), [1, 4), [3, 5).
  CheckOp("aten._adaptive_avg_pool2d.default",
          {F32({1, 1, 5}, {0, 1, 2, 3, 4})}, {In(0), Ints({1, 3})}, kF32,
          {1, 1, 3}, {0.5, 2, 3.5});
  CheckOp("aten._adaptive_avg_pool2d_backward.default",
          {F32({1, 1, 3}, {1, 1, 1}), F32({1, 1, 5}, {0, 1, 2, 3, 4})},
          {In(0), In(1)}, kF32, {1, 1, 5},
          {0.5, 0.5 + 1.0 / 3, 1.0 / 3, 1.0 / 3 + 0.5, 0.5});
  // Global pooling, 4-d.
  CheckOp("aten._adaptive_avg_pool2d.default",
          {F32({1, 2, 1, 2}, {1, 3, 5, 9})}, {In(0), Ints({1, 1})}, kF32,
          {1, 2, 1, 1}, {2, 7});
}

// Max pool's backward adds each output's gradient at its saved index
// wherever in the plane that is (PyTorch's kernels do not check the
// window), and nothing for an index outside the plane: on the CPU a
// scatter over the outputs, checked here with indices drawn at random
// (repeats, out-of-window and out-of-plane ones) over a 3-d and a 4-d
// input, in every float dtype.
TEST(Pooling, MaxPoolBackwardTakesAnyIndex) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int64_t> pick(-2, 7 * 6 + 1);
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    for (std::vector<int64_t> batch :
         {std::vector<int64_t>{3}, std::vector<int64_t>{2, 3}}) {
      std::vector<int64_t> in = batch, out = batch;
      in.insert(in.end(), {7, 6});
      out.insert(out.end(), {4, 4});  // kernel 3x2, stride 2x2, padding 1x1
      std::vector<double> idx(out.size() == 3 ? 48 : 96);
      for (double& v : idx) v = static_cast<double>(pick(rng));
      ExpectCompiledMatchesReference(
          "aten.max_pool2d_with_indices_backward.default",
          {Random(dt, out, rng), Random(dt, in, rng), I64(out, idx)},
          {In(0), In(1), Ints({3, 2}), Ints({2, 2}), Ints({1, 1}), Ints({1, 1}),
           B(false), In(2)});
    }
  }
}

TEST(Pooling, CompiledMatchesReference) {
  std::mt19937_64 rng(5);
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    for (bool strided : {false, true}) {
      HostTensor x = Random(dt, {2, 3, 7, 6}, rng);
      if (strided) x = NonContiguous(x);
      for (bool ceil : {false, true}) {
        const std::vector<v1::Argument> max_args = {In(0),        Ints({3, 2}),
                                                    Ints({2, 2}), Ints({1, 1}),
                                                    Ints({1, 1}), B(ceil)};
        auto fwd = RunOp("aten.max_pool2d_with_indices.default", {x}, max_args);
        ASSERT_TRUE(fwd.ok()) << fwd.status();
        ExpectCompiledMatchesReference("aten.max_pool2d_with_indices.default",
                                       {x}, max_args);
        const HostTensor& ind = fwd->outputs[1];
        HostTensor g = Random(dt, ind.sizes(), rng);
        ExpectCompiledMatchesReference(
            "aten.max_pool2d_with_indices_backward.default", {g, x, ind},
            {In(0), In(1), Ints({3, 2}), Ints({2, 2}), Ints({1, 1}),
             Ints({1, 1}), B(ceil), In(2)});
        for (bool pad_counts : {false, true}) {
          ExpectCompiledMatchesReference(
              "aten.avg_pool2d.default", {x},
              {In(0), Ints({3, 3}), Ints({2, 1}), Ints({1, 1}), B(ceil),
               B(pad_counts)});
          auto out = RunOp("aten.avg_pool2d.default", {x},
                           {In(0), Ints({3, 3}), Ints({2, 1}), Ints({1, 1}),
                            B(ceil), B(pad_counts)});
          ASSERT_TRUE(out.ok()) << out.status();
          ExpectCompiledMatchesReference(
              "aten.avg_pool2d_backward.default",
              {Random(dt, out->outputs[0].sizes(), rng), x},
              {In(0), In(1), Ints({3, 3}), Ints({2, 1}), Ints({1, 1}), B(ceil),
               B(pad_counts), NoneArg()});
        }
      }
      // Dilation, and max pool over a 3-d input.
      ExpectCompiledMatchesReference(
          "aten.max_pool2d_with_indices.default", {Random(dt, {3, 7, 6}, rng)},
          {In(0), Ints({2, 2}), Ints({1, 1}), Ints({1, 0}), Ints({2, 3})});
      // The backward enumerating candidate windows by output position with
      // a dilation (stride 3 > dilation 2: 2 candidates of 3 offsets, each
      // tested for divisibility by the dilation), over a larger input.
      {
        HostTensor big = Random(dt, {2, 2, 13, 11}, rng);
        if (strided) big = NonContiguous(big);
        const std::vector<v1::Argument> args = {
            In(0), Ints({3, 2}), Ints({3, 3}), Ints({1, 0}), Ints({2, 2})};
        auto fwd = RunOp("aten.max_pool2d_with_indices.default", {big}, args);
        ASSERT_TRUE(fwd.ok()) << fwd.status();
        ExpectCompiledMatchesReference(
            "aten.max_pool2d_with_indices_backward.default",
            {Random(dt, fwd->outputs[1].sizes(), rng), big, fwd->outputs[1]},
            {In(0), In(1), Ints({3, 2}), Ints({3, 3}), Ints({1, 0}),
             Ints({2, 2}), B(false), In(2)});
      }
      for (std::vector<int64_t> os :
           {std::vector<int64_t>{1, 1}, {3, 4}, {7, 6}, {5, 4}}) {
        ExpectCompiledMatchesReference("aten._adaptive_avg_pool2d.default", {x},
                                       {In(0), Ints(os)});
        ExpectCompiledMatchesReference(
            "aten._adaptive_avg_pool2d_backward.default",
            {Random(dt, {2, 3, os[0], os[1]}, rng), x}, {In(0), In(1)});
      }
    }
  }
}

}  // namespace
}  // namespace kiln::testing
