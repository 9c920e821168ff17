// Shared pieces of the per-op suites (ops_pointwise_test.cc,
// ops_reduction_test.cc, ops_shape_test.cc, ops_composite_test.cc,
// ops_indexing_test.cc, ops_sort_test.cc):
//
//  * the list of ops each suite covers: the one place that says which suite
//    tests an op. OpCoverage.EveryRegisteredOpIsCovered (in
//    ops_pointwise_test.cc) fails when a registered op is in no list, and
//    each suite binary fails at exit when an op on its list was never run
//    successfully by one of its tests (see CoverageEnvironment);
//  * RunTracked(): RunOp() recording which ops ran;
//  * checks of an output's dtype, sizes and values against hand-worked
//    numbers with a tolerance suited to the dtype.
#ifndef KILN_TESTS_UNIT_OPS_TEST_UTIL_H_
#define KILN_TESTS_UNIT_OPS_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/unit/op_harness.h"

namespace kiln::testing {

// Dtype shorthands for the tables of the per-op suites.
inline constexpr DType kF32 = DType::kFloat32;
inline constexpr DType kF16 = DType::kFloat16;
inline constexpr DType kBF16 = DType::kBFloat16;
inline constexpr DType kI32 = DType::kInt32;
inline constexpr DType kI64 = DType::kInt64;
inline constexpr DType kBool = DType::kBool;

// [[1, 2, 3], [4, 5, 6]]
inline HostTensor M23() { return F32({2, 3}, {1, 2, 3, 4, 5, 6}); }

// ---- which suite covers which op ----

inline const std::vector<std::string>& PointwiseSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      // unary, floating results
      "aten.exp.default", "aten.exp2.default", "aten.expm1.default",
      "aten.log.default", "aten.log2.default", "aten.log1p.default",
      "aten.sqrt.default", "aten.rsqrt.default", "aten.reciprocal.default",
      "aten.sin.default", "aten.cos.default", "aten.tan.default",
      "aten.tanh.default", "aten.sigmoid.default", "aten.erf.default",
      // unary, dtype-preserving
      "aten.abs.default", "aten.neg.default", "aten.relu.default",
      "aten.floor.default", "aten.ceil.default", "aten.round.default",
      "aten.trunc.default", "aten.sign.default",
      // unary, bool or integral
      "aten.logical_not.default", "aten.isnan.default",
      "aten.bitwise_not.default",
      // binary arithmetic
      "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor",
      "aten.sub.Scalar", "aten.mul.Tensor", "aten.mul.Scalar",
      "aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode",
      "aten.div.Scalar_mode", "aten.remainder.Tensor", "aten.remainder.Scalar",
      "aten.fmod.Tensor", "aten.fmod.Scalar", "aten.bitwise_and.Tensor",
      "aten.bitwise_and.Scalar", "aten.bitwise_or.Tensor",
      "aten.bitwise_or.Scalar", "aten.pow.Tensor_Tensor",
      "aten.pow.Tensor_Scalar", "aten.pow.Scalar", "aten.maximum.default",
      "aten.minimum.default", "aten.atan2.default", "aten.logical_and.default",
      "aten.logical_or.default",
      // comparisons
      "aten.eq.Tensor", "aten.eq.Scalar", "aten.ne.Tensor", "aten.ne.Scalar",
      "aten.lt.Tensor", "aten.lt.Scalar", "aten.le.Tensor", "aten.le.Scalar",
      "aten.gt.Tensor", "aten.gt.Scalar", "aten.ge.Tensor", "aten.ge.Scalar",
      // selection and clamping
      "aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
      "aten.where.Scalar", "aten.clamp.default", "aten.clamp.Tensor",
      "aten.clamp_min.default", "aten.clamp_max.default",
      // casts
      "aten._to_copy.default", "prims.convert_element_type.default",
      // activations
      "aten.gelu.default", "aten.leaky_relu.default", "aten.hardtanh.default",
      "aten.silu.default", "aten.lerp.Scalar", "aten.lerp.Tensor"};
  return *ops;
}

inline const std::vector<std::string>& ReductionSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.sum.default",    "aten.sum.dim_IntList", "aten.mean.default",
      "aten.mean.dim",       "aten.prod.default",    "aten.prod.dim_int",
      "aten.amax.default",   "aten.amin.default",    "aten.var.correction",
      "aten.argmax.default", "aten.argmin.default",  "aten.any.default",
      "aten.any.dim",        "aten.any.dims",        "aten.all.default",
      "aten.all.dim",        "aten.all.dims"};
  return *ops;
}

inline const std::vector<std::string>& ShapeSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.view.default",         "aten.reshape.default",
      "aten._unsafe_view.default", "aten.permute.default",
      "aten.transpose.int",        "aten.t.default",
      "aten.expand.default",       "aten.unsqueeze.default",
      "aten.squeeze.default",      "aten.squeeze.dim",
      "aten.squeeze.dims",         "aten.slice.Tensor",
      "aten.select.int",           "aten.clone.default",
      "aten.alias.default",        "aten.copy.default",
      "aten.split.Tensor",         "aten.split_with_sizes.default",
      "aten.unbind.int",           "aten.cat.default",
      "aten.full.default",         "aten.scalar_tensor.default",
      "aten.arange.default",       "aten.arange.start",
      "aten.arange.start_step",    "aten.full_like.default",
      "aten.zeros_like.default",   "aten.ones_like.default",
      "aten.empty_like.default",   "aten.empty.memory_format",
      "aten.empty_strided.default", "aten.slice_scatter.default",
      "aten.select_scatter.default", "aten.as_strided.default",
      "aten.as_strided_scatter.default", "aten.lift_fresh_copy.default",
      "aten.repeat.default"};
  return *ops;
}

inline const std::vector<std::string>& CompositeSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten._softmax.default", "aten._log_softmax.default",
      "aten.native_layer_norm.default"};
  return *ops;
}

// The norm and pooling families and the activation backward ops
// (ops_norm_test.cc).
inline const std::vector<std::string>& NormSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.threshold_backward.default",
      "aten.gelu_backward.default",
      "aten.sigmoid_backward.default",
      "aten.tanh_backward.default",
      "aten.silu_backward.default",
      "aten._softmax_backward_data.default",
      "aten._log_softmax_backward_data.default",
      "aten.native_layer_norm_backward.default",
      "aten._native_batch_norm_legit_functional.default",
      "aten._native_batch_norm_legit_no_training.default",
      "aten._native_batch_norm_legit.no_stats",
      "aten.native_batch_norm_backward.default",
      "aten.native_group_norm.default",
      "aten.native_group_norm_backward.default",
      "aten.max_pool2d_with_indices.default",
      "aten.max_pool2d_with_indices_backward.default",
      "aten.avg_pool2d.default",
      "aten.avg_pool2d_backward.default",
      "aten._adaptive_avg_pool2d.default",
      "aten._adaptive_avg_pool2d_backward.default"};
  return *ops;
}

// The matrix products (ops_matmul_test.cc).
inline const std::vector<std::string>& MatmulSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.mm.default", "aten.addmm.default", "aten.bmm.default",
      "aten.baddbmm.default"};
  return *ops;
}

// The convolutions (ops_conv_test.cc).
inline const std::vector<std::string>& ConvSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.convolution.default", "aten.convolution_backward.default"};
  return *ops;
}

// Kiln's fused attention (ops_attention_test.cc).
inline const std::vector<std::string>& AttentionSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "kiln.attention.default",
      "kiln.attention_backward.default",
      "kiln.attention_dropout.default",
      "kiln.attention_dropout_backward.default",
      "kiln.attention_backward_dbias.default",
      "kiln.attention_dropout_backward_dbias.default"};
  return *ops;
}

// The gather/scatter family (ops_indexing_test.cc).
inline const std::vector<std::string>& IndexingSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.embedding.default",        "aten.index_select.default",
      "aten.gather.default",           "aten.index.Tensor",
      "aten.masked_fill.Scalar",       "aten.masked_fill.Tensor",
      "aten.constant_pad_nd.default",  "aten.nll_loss_forward.default",
      "aten.nll_loss_backward.default",
      "aten.embedding_dense_backward.default",
      "aten.scatter_add.default",      "aten.scatter.src",
      "aten.scatter.value",            "aten.index_put.default",
      "aten.cumsum.default",           "aten.flip.default"};
  return *ops;
}

// The random ops (ops_random_test.cc).
inline const std::vector<std::string>& RandomSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.native_dropout.default", "aten.native_dropout_backward.default",
      "aten.rand.default",           "aten.rand_like.default",
      "aten.randn.default",          "aten.randn_like.default",
      "aten.bernoulli.p",            "aten.bernoulli.default"};
  return *ops;
}

// The sort family (ops_sort_test.cc).
inline const std::vector<std::string>& SortSuiteOps() {
  static const auto* ops = new std::vector<std::string>{
      "aten.sort.default", "aten.sort.stable", "aten.topk.default"};
  return *ops;
}

// ---- running ops, recording coverage ----

// Ops that some test in this binary ran successfully.
inline std::set<std::string>& ExercisedOps() {
  static auto* ops = new std::set<std::string>;
  return *ops;
}

// RunOp, recording `op` when import and evaluation succeed.
inline absl::StatusOr<OpResult> RunTracked(
    const std::string& op, const std::vector<HostTensor>& inputs,
    const std::vector<v1::Argument>& args, int num_outputs = -1) {
  auto r = RunOp(op, inputs, args, num_outputs);
  if (r.ok()) ExercisedOps().insert(op);
  return r;
}

// At the end of an unfiltered run, fails when an op of `ops` was never run
// successfully: every op a suite claims must have a test there.
class CoverageEnvironment : public ::testing::Environment {
 public:
  CoverageEnvironment(std::string suite, std::vector<std::string> ops)
      : suite_(std::move(suite)), ops_(std::move(ops)) {}
  void TearDown() override {
    if (::testing::GTEST_FLAG(filter) != "*") return;  // a partial run
    for (const std::string& op : ops_) {
      if (!ExercisedOps().count(op)) {
        ADD_FAILURE() << op << " is listed in the " << suite_
                      << " suite but no test there ran it";
      }
    }
  }

 private:
  std::string suite_;
  std::vector<std::string> ops_;
};

inline ::testing::Environment* RegisterCoverage(
    std::string suite, const std::vector<std::string>& ops) {
  return ::testing::AddGlobalTestEnvironment(
      new CoverageEnvironment(std::move(suite), ops));
}

// ---- checks ----

// Relative tolerance for values stored in `dtype`: float32 results are
// compared with 1e-6 relative error; float16/bfloat16 results, whose exact
// rounding tests spell out, with about one unit in the last place.
inline double DefaultRelTol(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-6;
    case DType::kFloat16:
      return 1e-3;
    case DType::kBFloat16:
      return 8e-3;
    default:
      return 0;
  }
}

// Expected NaN matches NaN; infinities match exactly; everything else within
// rel * |expected| (or `abs_tol` near zero).
inline void ExpectValuesNear(const HostTensor& t,
                             const std::vector<double>& expected,
                             double rel = -1, double abs_tol = 1e-30) {
  if (rel < 0) rel = DefaultRelTol(t.dtype());
  ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size())) << t.ToString();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double got = t.GetDoubleAt(i), want = expected[i];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "element " << i << ": got " << got
                                   << ", want NaN in " << t.ToString();
    } else if (std::isinf(want) || rel == 0) {
      EXPECT_EQ(got, want) << "element " << i << " of " << t.ToString();
    } else {
      EXPECT_NEAR(got, want, std::max(abs_tol, rel * std::fabs(want)))
          << "element " << i << " of " << t.ToString();
    }
  }
}

// Output `o`: inferred dtype and sizes, the reference output agreeing with
// them, and its values.
inline void ExpectOutput(const OpResult& r, int o, DType dtype,
                         const std::vector<int64_t>& sizes,
                         const std::vector<double>& values, double rel = -1) {
  const std::string op = r.graph.nodes.empty() || !r.graph.nodes[0].op
                             ? "?"
                             : r.graph.nodes[0].op->name;
  SCOPED_TRACE(absl::StrCat(op, " output ", o));
  EXPECT_EQ(DTypeName(r.type(o).dtype), DTypeName(dtype));
  EXPECT_EQ(r.sizes(o), sizes);
  ASSERT_LT(o, static_cast<int>(r.outputs.size()));
  EXPECT_EQ(DTypeName(r.outputs[o].dtype()), DTypeName(dtype));
  EXPECT_EQ(r.outputs[o].sizes(), sizes);
  ExpectValuesNear(r.outputs[o], values, rel);
}
inline void ExpectOutput(const OpResult& r, DType dtype,
                         const std::vector<int64_t>& sizes,
                         const std::vector<double>& values, double rel = -1) {
  ExpectOutput(r, 0, dtype, sizes, values, rel);
}

// Runs `op` and checks its single output.
inline void CheckOp(const std::string& op, const std::vector<HostTensor>& in,
                    const std::vector<v1::Argument>& args, DType dtype,
                    const std::vector<int64_t>& sizes,
                    const std::vector<double>& values, double rel = -1) {
  SCOPED_TRACE(op);
  auto r = RunTracked(op, in, args);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, dtype, sizes, values, rel);
}

// Runs `op` and checks only the inferred output dtype (and that it runs).
inline void CheckDType(const std::string& op, const std::vector<HostTensor>& in,
                       const std::vector<v1::Argument>& args, DType dtype) {
  SCOPED_TRACE(op);
  auto r = RunTracked(op, in, args);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(DTypeName(r->type().dtype), DTypeName(dtype));
  EXPECT_EQ(DTypeName(r->outputs[0].dtype()), DTypeName(dtype));
}

// Runs `op` expecting INVALID_ARGUMENT whose message contains every one of
// `parts`.
inline void ExpectInvalid(const std::string& op,
                          const std::vector<HostTensor>& in,
                          const std::vector<v1::Argument>& args,
                          std::initializer_list<std::string> parts = {}) {
  SCOPED_TRACE(op);
  auto r = RunOp(op, in, args);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << (r.ok() ? std::string("ok") : r.status().ToString());
  for (const std::string& p : parts) {
    EXPECT_NE(r.status().message().find(p), std::string::npos)
        << "'" << p << "' not in: " << r.status().message();
  }
}

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace kiln::testing

#endif  // KILN_TESTS_UNIT_OPS_TEST_UTIL_H_
