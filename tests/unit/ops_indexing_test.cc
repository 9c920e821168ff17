// The gather/scatter ops (graph/ops/gather_scatter.cc): hand-worked values
// through the reference evaluator and through kernels compiled for this
// machine (the same inputs, including non-contiguous ones), negative dims
// and indices, broadcasting, empty tensors, every dtype, int32 and int64
// indices, and what an out-of-range index does (OUT_OF_RANGE in the
// reference; in compiled code clamped, never outside a buffer, and
// OUT_OF_RANGE naming node, op, index and size after the run).
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "runtime/program_plan.h"
#include "runtime/thread_pool.h"
#include "tests/unit/example_graphs.h"
#include "tests/unit/numerics.h"
#include "tests/unit/op_harness.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("indexing", IndexingSuiteOps());

constexpr DType kF32 = DType::kFloat32, kI64 = DType::kInt64,
                kI32 = DType::kInt32, kBool = DType::kBool;
constexpr DType kFloatDTypes[] = {DType::kFloat32, DType::kFloat16,
                                  DType::kBFloat16};

HostTensor Iota(std::vector<int64_t> sizes, DType dtype = DType::kInt64) {
  HostTensor t = HostTensor::Empty(dtype, std::move(sizes));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (IsFloating(dtype))
      t.SetDoubleAt(i, static_cast<double>(i));
    else
      t.SetIntAt(i, i);
  }
  return t;
}

HostTensor Cast(const HostTensor& t, DType dtype) {
  HostTensor o = HostTensor::Empty(dtype, t.sizes());
  for (int64_t i = 0; i < t.numel(); ++i) o.SetDoubleAt(i, t.GetDoubleAt(i));
  return o;
}

// The one-op graph with each input's strides and offset in its metadata
// (OneOpGraph declares inputs contiguous), compiled for this machine.
absl::StatusOr<std::unique_ptr<CpuExecutable>> CompileOneOp(
    const std::string& op, const std::vector<HostTensor>& in,
    const std::vector<v1::Argument>& args, int num_outputs) {
  v1::CompileRequest req;
  *req.mutable_graph() = OneOpGraph(op, in, args, num_outputs);
  for (size_t i = 0; i < in.size(); ++i) {
    v1::TensorMeta* m = req.mutable_graph()->mutable_inputs(i)->mutable_meta();
    for (int64_t s : in[i].strides()) m->add_strides()->set_value(s);
  }
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  if (!artifact.ok()) return artifact.status();
  return CpuExecutable::Load(*artifact);
}

// Runs `op` compiled for this machine; expects success.
std::vector<HostTensor> RunCompiled(const std::string& op,
                                    const std::vector<HostTensor>& in,
                                    const std::vector<v1::Argument>& args,
                                    int num_outputs = -1) {
  auto exe = CompileOneOp(op, in, args, num_outputs);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  ThreadPool pool(2);
  auto got = (*exe)->Run(in, &pool);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return {};
  return *std::move(got);
}

// The reference and the compiled kernels both give `values` (output `o`),
// and the compiled outputs match the reference's within tolerance.
void CheckBoth(const std::string& op, const std::vector<HostTensor>& in,
               const std::vector<v1::Argument>& args, DType dtype,
               const std::vector<int64_t>& sizes,
               const std::vector<double>& values, int o = 0,
               int num_outputs = -1) {
  SCOPED_TRACE(op);
  auto r = RunTracked(op, in, args, num_outputs);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, o, dtype, sizes, values);
  std::vector<HostTensor> got = RunCompiled(op, in, args, num_outputs);
  ASSERT_EQ(got.size(), r->outputs.size());
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(Compare(got[k], r->outputs[k]), "") << "compiled output " << k;
  SCOPED_TRACE("compiled");
  EXPECT_EQ(got[o].sizes(), sizes);
  ExpectValuesNear(got[o], values);
}

// Runs the compiled `exe` over caller memory (RunInto), returning its
// status and leaving the outputs in `out`.
absl::Status RunIntoOutputs(const CpuExecutable& exe,
                            const std::vector<HostTensor>& in,
                            std::vector<HostTensor>& out) {
  std::vector<HostBufferView> views;
  for (const HostTensor& t : in) {
    views.push_back(
        {const_cast<uint8_t*>(t.data()), t.dtype(), t.sizes(), t.strides()});
  }
  auto sizes = exe.OutputSizes(views);
  if (!sizes.ok()) return sizes.status();
  out.clear();
  const v1::Artifact& a = exe.artifact();
  for (size_t o = 0; o < sizes->size(); ++o) {
    out.push_back(HostTensor::Empty(static_cast<DType>(a.outputs(o).dtype()),
                                    (*sizes)[o]));
  }
  std::vector<HostBufferView> outs;
  for (HostTensor& t : out)
    outs.push_back({t.data(), t.dtype(), t.sizes(), t.strides()});
  ThreadPool pool(2);
  return exe.RunInto(views, outs, &pool);
}

// An out-of-range index: OUT_OF_RANGE from the reference naming the op; the
// compiled program fails the same way, its message naming node 0, the op
// and `detail` ("index 7 is out of range for dimension 0 of size 2"),
// after kernels that clamp every index (never reading outside a buffer):
// output `o` holds `clamped`.
void CheckOutOfRange(const std::string& op, const std::vector<HostTensor>& in,
                     const std::vector<v1::Argument>& args,
                     const std::vector<double>& clamped,
                     const std::string& detail = "", int o = 0) {
  SCOPED_TRACE(op);
  auto r = RunOp(op, in, args);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  EXPECT_NE(r.status().message().find(op), std::string::npos);
  auto exe = CompileOneOp(op, in, args, -1);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::vector<HostTensor> got;
  const absl::Status s = RunIntoOutputs(**exe, in, got);
  ASSERT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("node 0 (" + op + "): "), std::string::npos) << s;
  EXPECT_NE(s.message().find(detail), std::string::npos) << s;
  ASSERT_GT(got.size(), static_cast<size_t>(o));
  ExpectValuesNear(got[o], clamped);
  // Run fails the same way.
  ThreadPool pool(2);
  EXPECT_EQ((*exe)->Run(in, &pool).status().code(),
            absl::StatusCode::kOutOfRange);
}

// ---- embedding ----

TEST(IndexingEmbedding, RowsOfEveryDTypeWithNegativeIndices) {
  for (DType dt : {kF32, DType::kFloat16, DType::kBFloat16, kI32, kI64}) {
    SCOPED_TRACE(DTypeName(dt));
    const HostTensor w = Iota({3, 2}, dt);  // [[0, 1], [2, 3], [4, 5]]
    for (DType it : {kI64, kI32}) {
      CheckBoth("aten.embedding.default",
                {w, MakeTensor(it, {2, 2}, {2, 0, 1, -1})}, {In(0), In(1)}, dt,
                {2, 2, 2}, {4, 5, 0, 1, 2, 3, 4, 5});
    }
  }
}

TEST(IndexingEmbedding, NonContiguousEmptyAndErrors) {
  // Rows of [[1, 4], [2, 5], [3, 6]] (a transposed view).
  CheckBoth("aten.embedding.default",
            {TransposedView(M23()), I64({3}, {2, 2, 0})},
            {In(0), In(1), I(-1), B(false), B(false)}, kF32, {3, 2},
            {3, 6, 3, 6, 1, 4});
  CheckBoth("aten.embedding.default", {M23(), I64({0}, {})}, {In(0), In(1)},
            kF32, {0, 3}, {});
  CheckBoth("aten.embedding.default", {M23(), I64({}, {1})}, {In(0), In(1)},
            kF32, {3}, {4, 5, 6});
  CheckOutOfRange("aten.embedding.default", {M23(), I64({2}, {7, -9})},
                  {In(0), In(1)}, {4, 5, 6, 1, 2, 3});
  ExpectInvalid("aten.embedding.default", {F32({3}, {}), I64({1}, {0})},
                {In(0), In(1)}, {"2-D"});
  ExpectInvalid("aten.embedding.default", {M23(), F32({1}, {0})},
                {In(0), In(1)}, {"int32 or int64"});
}

// ---- index_select ----

TEST(IndexingIndexSelect, ValuesDimsAndDTypes) {
  for (DType dt : kFloatDTypes) {
    CheckBoth("aten.index_select.default", {Cast(M23(), dt), I64({2}, {2, 0})},
              {In(0), I(1), In(1)}, dt, {2, 2}, {3, 1, 6, 4});
  }
  CheckBoth("aten.index_select.default", {M23(), I32({3}, {-1, 0, 1})},
            {In(0), I(-2), In(1)}, kF32, {3, 3}, {4, 5, 6, 1, 2, 3, 4, 5, 6});
  // A 0-dim index keeps the dim (size 1).
  CheckBoth("aten.index_select.default", {M23(), I64({}, {1})},
            {In(0), I(1), In(1)}, kF32, {2, 1}, {2, 5});
  // Non-contiguous self: [[1, 4], [2, 5], [3, 6]], columns 1, 1.
  CheckBoth("aten.index_select.default",
            {TransposedView(M23()), I64({2}, {1, 1})}, {In(0), I(1), In(1)},
            kF32, {3, 2}, {4, 4, 5, 5, 6, 6});
  CheckBoth("aten.index_select.default", {M23(), I64({0}, {})},
            {In(0), I(0), In(1)}, kF32, {0, 3}, {});
  CheckBoth("aten.index_select.default", {Iota({4}, kBool), I64({2}, {0, 3})},
            {In(0), I(0), In(1)}, kBool, {2}, {0, 1});
  CheckOutOfRange("aten.index_select.default", {M23(), I64({2}, {3, -4})},
                  {In(0), I(1), In(1)}, {3, 1, 6, 4});
  ExpectInvalid("aten.index_select.default", {M23(), I64({1, 1}, {0})},
                {In(0), I(0), In(1)}, {"vector"});
  ExpectInvalid("aten.index_select.default", {M23(), I64({1}, {0})},
                {In(0), I(2), In(1)});
}

// ---- gather ----

TEST(IndexingGather, ValuesDimsAndDTypes) {
  for (DType dt : {kF32, DType::kFloat16, DType::kBFloat16, kI32}) {
    CheckBoth("aten.gather.default",
              {Cast(M23(), dt), I64({2, 2}, {2, 0, 1, 1})},
              {In(0), I(1), In(1)}, dt, {2, 2}, {3, 1, 5, 5});
  }
  CheckBoth("aten.gather.default", {M23(), I32({1, 3}, {1, 0, -1})},
            {In(0), I(-2), In(1)}, kF32, {1, 3}, {4, 2, 6});
  CheckBoth("aten.gather.default",
            {TransposedView(M23()), I64({3, 1}, {1, 0, 1})},
            {In(0), I(1), In(1)}, kF32, {3, 1}, {4, 2, 6});
  CheckBoth("aten.gather.default", {M23(), I64({2, 0}, {})},
            {In(0), I(1), In(1)}, kF32, {2, 0}, {});
  CheckOutOfRange("aten.gather.default", {M23(), I64({1, 2}, {5, -7})},
                  {In(0), I(1), In(1)}, {3, 1});
  ExpectInvalid("aten.gather.default", {M23(), I64({2}, {0, 0})},
                {In(0), I(1), In(1)}, {"same number of dimensions"});
  ExpectInvalid("aten.gather.default", {M23(), I64({3, 1}, {0, 0, 0})},
                {In(0), I(1), In(1)}, {"no larger"});
}

// ---- index.Tensor ----

TEST(IndexingIndexTensor, OneAndTwoIndexTensorsBroadcast) {
  // Rows 2 and 0 of [[0..3], [4..7], [8..11]].
  CheckBoth("aten.index.Tensor", {Iota({3, 4}), I64({2}, {2, 0})},
            {In(0), Refs({1})}, kI64, {2, 4}, {8, 9, 10, 11, 0, 1, 2, 3});
  // idx0 [2, 1] and idx1 [3] broadcast to [2, 3]: self[r][c] = 4 r + c.
  CheckBoth("aten.index.Tensor",
            {Iota({3, 4}), I64({2, 1}, {0, 2}), I32({3}, {1, 2, -1})},
            {In(0), Refs({1, 2})}, kI64, {2, 3}, {1, 2, 3, 9, 10, 11});
  for (DType dt : kFloatDTypes) {
    CheckBoth("aten.index.Tensor", {Iota({2, 2, 2}, dt), I64({}, {-1})},
              {In(0), Refs({1})}, dt, {2, 2}, {4, 5, 6, 7});
  }
  CheckBoth("aten.index.Tensor", {TransposedView(M23()), I64({1}, {1})},
            {In(0), Refs({1})}, kF32, {1, 2}, {2, 5});
  CheckBoth("aten.index.Tensor", {Iota({3, 4}), I64({0}, {})},
            {In(0), Refs({1})}, kI64, {0, 4}, {});
  CheckOutOfRange("aten.index.Tensor", {Iota({3}), I64({2}, {3, -4})},
                  {In(0), Refs({1})}, {2, 0});
  ExpectInvalid("aten.index.Tensor", {Iota({3}), Bool({3}, {1, 0, 1})},
                {In(0), Refs({1})}, {"data-dependent"});
  ExpectInvalid("aten.index.Tensor", {Iota({3}), I64({1}, {0}), I64({1}, {0})},
                {In(0), Refs({1, 2})}, {"too many indices"});
}

// ---- masked_fill ----

TEST(IndexingMaskedFill, ScalarAndTensorValuesBroadcast) {
  for (DType dt : kFloatDTypes) {
    CheckBoth("aten.masked_fill.Scalar",
              {Cast(M23(), dt), Bool({3}, {1, 0, 1})}, {In(0), In(1), F(-1.5)},
              dt, {2, 3}, {-1.5, 2, -1.5, -1.5, 5, -1.5});
  }
  // self [3] and mask [2, 1] broadcast to [2, 3].
  CheckBoth("aten.masked_fill.Scalar",
            {I32({3}, {1, 2, 3}), Bool({2, 1}, {0, 1})}, {In(0), In(1), I(7)},
            kI32, {2, 3}, {1, 2, 3, 7, 7, 7});
  CheckBoth("aten.masked_fill.Scalar", {I64({2}, {1, 2}), Bool({2}, {1, 0})},
            {In(0), In(1), F(2.7)}, kI64, {2}, {2, 2});
  CheckBoth(
      "aten.masked_fill.Tensor",
      {TransposedView(M23()), Bool({3, 2}, {1, 0, 0, 0, 0, 1}), F32({}, {-9})},
      {In(0), In(1), In(2)}, kF32, {3, 2}, {-9, 4, 2, 5, 3, -9});
  CheckBoth("aten.masked_fill.Scalar", {Bool({2}, {0, 1}), Bool({2}, {1, 1})},
            {In(0), In(1), B(false)}, kBool, {2}, {0, 0});
  CheckBoth("aten.masked_fill.Scalar", {F32({0, 2}, {}), Bool({2}, {1, 1})},
            {In(0), In(1), F(1)}, kF32, {0, 2}, {});
  ExpectInvalid("aten.masked_fill.Scalar", {M23(), I64({3}, {1, 0, 1})},
                {In(0), In(1), F(0)}, {"boolean"});
  ExpectInvalid("aten.masked_fill.Tensor",
                {M23(), Bool({3}, {1, 0, 1}), F32({1}, {0})},
                {In(0), In(1), In(2)}, {"0-dimensional"});
}

// ---- constant_pad_nd ----

TEST(IndexingConstantPad, PadsCropsAndValues) {
  const HostTensor x = F32({2, 2}, {1, 2, 3, 4});
  CheckBoth("aten.constant_pad_nd.default", {x}, {In(0), Ints({1, 0})}, kF32,
            {2, 3}, {0, 1, 2, 0, 3, 4});
  // Last dim (1, 1); dim 0 cropped by one at the front.
  CheckBoth("aten.constant_pad_nd.default", {x},
            {In(0), Ints({1, 1, -1, 0}), F(9)}, kF32, {1, 4}, {9, 3, 4, 9});
  for (DType dt : {DType::kFloat16, DType::kBFloat16, kI32, kI64}) {
    CheckBoth("aten.constant_pad_nd.default", {Cast(x, dt)},
              {In(0), Ints({0, 0, 0, 1}), I(5)}, dt, {3, 2},
              {1, 2, 3, 4, 5, 5});
  }
  CheckBoth("aten.constant_pad_nd.default", {TransposedView(M23())},
            {In(0), Ints({-1, 1})}, kF32, {3, 2}, {4, 0, 5, 0, 6, 0});
  CheckBoth("aten.constant_pad_nd.default", {F32({0, 2}, {})},
            {In(0), Ints({0, 0, 1, 1}), F(3)}, kF32, {2, 2}, {3, 3, 3, 3});
  ExpectInvalid("aten.constant_pad_nd.default", {x}, {In(0), Ints({1})},
                {"even"});
  ExpectInvalid("aten.constant_pad_nd.default", {x},
                {In(0), Ints({1, 1, 1, 1, 1, 1})}, {"twice"});
  ExpectInvalid("aten.constant_pad_nd.default", {x}, {In(0), Ints({-2, -1})},
                {"negative output size"});
}

// ---- nll_loss ----

// log-probabilities of 3 samples over 2 classes; targets 1, 0, ignored.
HostTensor LogProbs(DType dt = kF32) {
  return Cast(F32({3, 2}, {-1, -2, -3, -4, -5, -6}), dt);
}

TEST(IndexingNllLoss, ForwardReductionsWeightsAndIgnoreIndex) {
  const HostTensor t = I64({3}, {1, 0, -100});
  const HostTensor w = F32({2}, {2, 3});
  const std::string op = "aten.nll_loss_forward.default";
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    // none: per sample; total_weight 0.
    CheckBoth(op, {LogProbs(dt), t}, {In(0), In(1), NoneArg(), I(0), I(-100)},
              dt, {3}, {2, 3, 0});
    // sum: 2 + 3, total 2; mean 2.5.
    CheckBoth(op, {LogProbs(dt), t}, {In(0), In(1), NoneArg(), I(2), I(-100)},
              dt, {}, {5});
    CheckBoth(op, {LogProbs(dt), t}, {In(0), In(1), NoneArg(), I(1), I(-100)},
              dt, {}, {2.5});
    CheckBoth(op, {LogProbs(dt), t}, {In(0), In(1), NoneArg(), I(1), I(-100)},
              dt, {}, {2}, /*o=*/1);
    // weights: 3 * 2 + 2 * 3 = 12 over 5.
    CheckBoth(op, {LogProbs(dt), t, Cast(w, dt)},
              {In(0), In(1), In(2), I(1), I(-100)}, dt, {}, {2.4});
    CheckBoth(op, {LogProbs(dt), t, Cast(w, dt)},
              {In(0), In(1), In(2), I(2), I(-100)}, dt, {}, {5}, /*o=*/1);
  }
  // ignore_index 0 (int32 targets); a 1-D input with a 0-dim target.
  CheckBoth(op, {LogProbs(), I32({3}, {1, 0, 1})},
            {In(0), In(1), NoneArg(), I(2), I(0)}, kF32, {}, {8});
  CheckBoth(op, {F32({3}, {-1, -2, -3}), I64({}, {2})},
            {In(0), In(1), NoneArg(), I(1), I(-100)}, kF32, {}, {3});
  // Non-contiguous input: [[1, 4], [2, 5], [3, 6]] negated? values as is.
  CheckBoth(op, {TransposedView(M23()), I64({3}, {1, 1, 0})},
            {In(0), In(1), NoneArg(), I(0), I(-100)}, kF32, {3}, {-4, -5, -3});
  // All ignored: mean is 0 / 0.
  CheckBoth(op, {LogProbs(), I64({3}, {-100, -100, -100})},
            {In(0), In(1), NoneArg(), I(1), I(-100)}, kF32, {}, {kNaN});
  CheckBoth(op, {F32({0, 2}, {}), I64({0}, {})},
            {In(0), In(1), NoneArg(), I(2), I(-100)}, kF32, {}, {0});
  auto r = RunOp(op, {LogProbs(), I64({3}, {1, 2, 0})},
                 {In(0), In(1), NoneArg(), I(1), I(-100)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  ExpectInvalid(op, {LogProbs(), I64({2}, {1, 0})},
                {In(0), In(1), NoneArg(), I(1), I(-100)}, {"batch size"});
}

TEST(IndexingNllLoss, BackwardReductionsAndWeights) {
  const std::string op = "aten.nll_loss_backward.default";
  const HostTensor t = I64({3}, {1, 0, -100});
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dt));
    // mean: -g / total at each target.
    CheckBoth(op,
              {Cast(F32({}, {1}), dt), LogProbs(dt), t, Cast(F32({}, {2}), dt)},
              {In(0), In(1), In(2), NoneArg(), I(1), I(-100), In(3)}, dt,
              {3, 2}, {0, -0.5, -0.5, 0, 0, 0});
    // none with weights: -w[t] * g[i].
    CheckBoth(op,
              {Cast(F32({3}, {1, 2, 3}), dt), LogProbs(dt), t,
               Cast(F32({2}, {2, 3}), dt), Cast(F32({}, {0}), dt)},
              {In(0), In(1), In(2), In(3), I(0), I(-100), In(4)}, dt, {3, 2},
              {0, -3, -4, 0, 0, 0});
  }
  // sum, 1-D input.
  CheckBoth(op,
            {F32({}, {2}), F32({3}, {-1, -2, -3}), I32({}, {2}), F32({}, {1})},
            {In(0), In(1), In(2), NoneArg(), I(2), I(-100), In(3)}, kF32, {3},
            {0, 0, -2});
}

// ---- accumulating scatters ----

TEST(IndexingEmbeddingBackward, SumsRowsPaddingAndFrequency) {
  const std::string op = "aten.embedding_dense_backward.default";
  const HostTensor g = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  for (DType dt : kFloatDTypes) {
    for (DType it : {kI64, kI32}) {
      CheckBoth(op, {Cast(g, dt), MakeTensor(it, {3}, {2, 0, 2})},
                {In(0), In(1), I(4), I(-1), B(false)}, dt, {4, 2},
                {3, 4, 0, 0, 6, 8, 0, 0});
    }
  }
  CheckBoth(op, {g, I64({3}, {2, 0, 2})}, {In(0), In(1), I(4), I(2), B(false)},
            kF32, {4, 2}, {3, 4, 0, 0, 0, 0, 0, 0});
  CheckBoth(op, {g, I64({3}, {2, 0, 2})}, {In(0), In(1), I(4), I(-1), B(true)},
            kF32, {4, 2}, {3, 4, 0, 0, 3, 4, 0, 0});
  // 2-D indices; a non-contiguous grad [[1, 4], [2, 5], [3, 6]].
  CheckBoth(op, {Iota({1, 3, 2}, kF32), I64({1, 3}, {1, 1, 0})},
            {In(0), In(1), I(2), I(-1), B(false)}, kF32, {2, 2}, {4, 5, 2, 4});
  CheckBoth(op, {TransposedView(M23()), I64({3}, {0, 0, 1})},
            {In(0), In(1), I(2), I(-1), B(false)}, kF32, {2, 2}, {3, 9, 3, 6});
  CheckBoth(op, {F32({0, 2}, {}), I64({0}, {})},
            {In(0), In(1), I(3), I(-1), B(false)}, kF32, {3, 2},
            {0, 0, 0, 0, 0, 0});
  ExpectInvalid(op, {g, I64({2}, {0, 1})},
                {In(0), In(1), I(4), I(-1), B(false)}, {"indices"});
}

TEST(IndexingScatter, AddSrcAndValue) {
  const HostTensor zeros = F32({2, 3}, {0, 0, 0, 0, 0, 0});
  const HostTensor base = F32({2, 3}, {10, 11, 12, 13, 14, 15});
  const HostTensor index = I64({2, 3}, {0, 1, 0, 2, 2, 1});
  for (DType dt : {kF32, DType::kFloat16, DType::kBFloat16, kI32, kI64}) {
    CheckBoth("aten.scatter_add.default",
              {Cast(zeros, dt), index, Cast(M23(), dt)},
              {In(0), I(1), In(1), In(2)}, dt, {2, 3}, {4, 2, 0, 0, 6, 9});
    // Duplicates: the last source wins (PyTorch leaves it unspecified).
    CheckBoth("aten.scatter.src", {Cast(base, dt), index, Cast(M23(), dt)},
              {In(0), I(-1), In(1), In(2)}, dt, {2, 3}, {3, 2, 12, 13, 6, 5});
  }
  // An index smaller than self (and src), negative index values, dim 0.
  CheckBoth("aten.scatter_add.default", {zeros, I64({1, 2}, {-1, 2}), M23()},
            {In(0), I(1), In(1), In(2)}, kF32, {2, 3}, {0, 0, 3, 0, 0, 0});
  CheckBoth("aten.scatter_add.default",
            {base, I32({2, 3}, {1, 1, 1, 1, 0, 1}), M23()},
            {In(0), I(0), In(1), In(2)}, kF32, {2, 3},
            {10, 16, 12, 18, 16, 24});
  CheckBoth("aten.scatter.value", {base, I64({2, 1}, {0, 2})},
            {In(0), I(1), In(1), F(7)}, kF32, {2, 3}, {7, 11, 12, 13, 14, 7});
  CheckBoth("aten.scatter_add.default",
            {TransposedView(M23()), I64({1, 2}, {1, 1}), F32({1, 2}, {5, 6})},
            {In(0), I(0), In(1), In(2)}, kF32, {3, 2}, {1, 4, 7, 11, 3, 6});
  CheckBoth("aten.scatter_add.default", {base, I64({0, 3}, {}), M23()},
            {In(0), I(0), In(1), In(2)}, kF32, {2, 3},
            {10, 11, 12, 13, 14, 15});
  CheckOutOfRange("aten.scatter.value", {F32({3}, {0, 0, 0}), I64({1}, {5})},
                  {In(0), I(0), In(1), F(1)}, {0, 0, 1});
  ExpectInvalid("aten.scatter_add.default", {zeros, I64({3}, {0, 0, 0}), M23()},
                {In(0), I(1), In(1), In(2)}, {"same number of dimensions"});
}

// Scatters are linear in their sources on the CPU (LoopNode::kScatter), and
// so is cumsum (a scan of ordered stores): sizes far above the bound of the
// quadratic form (2^18 steps) compile, match the reference on random inputs
// with duplicate and negative indices, and give the same bits with one thread
// or two and run after run (each element adds its sources in source order; of
// several replacing sources the last wins, as in the reference).
TEST(IndexingScatterLinear, LargeRandomScattersMatchAndRepeatBitForBit) {
  std::mt19937 rng(17);
  auto floats = [&](std::vector<int64_t> sizes, DType dt) {
    HostTensor t = HostTensor::Empty(dt, std::move(sizes));
    std::uniform_real_distribution<double> u(-1, 1);
    std::uniform_int_distribution<int64_t> k(-50, 50);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (IsFloating(dt))
        t.SetDoubleAt(i, u(rng));
      else
        t.SetIntAt(i, k(rng));
    }
    return t;
  };
  auto indices = [&](std::vector<int64_t> sizes, int64_t n, DType dt) {
    HostTensor t = HostTensor::Empty(dt, std::move(sizes));
    std::uniform_int_distribution<int64_t> u(-n, n - 1);
    for (int64_t i = 0; i < t.numel(); ++i) t.SetIntAt(i, u(rng));
    return t;
  };
  auto nonnegative = [&](std::vector<int64_t> sizes, int64_t n) {
    HostTensor t = HostTensor::Empty(kI64, std::move(sizes));
    std::uniform_int_distribution<int64_t> u(0, n - 1);
    for (int64_t i = 0; i < t.numel(); ++i) t.SetIntAt(i, u(rng));
    return t;
  };
  struct Case {
    std::string op;
    std::vector<HostTensor> in;
    std::vector<v1::Argument> args;
  };
  std::vector<Case> cases;
  // 1000 x 48 x 4096 = 2^27.6 steps as a quadratic reduction.
  for (bool freq : {false, true}) {
    cases.push_back({"aten.embedding_dense_backward.default",
                     {floats({8, 512, 48}, kF32), nonnegative({8, 512}, 1000)},
                     {In(0), In(1), I(1000), I(freq ? 7 : -1), B(freq)}});
  }
  cases.push_back(
      {"aten.embedding_dense_backward.default",
       {floats({4096, 32}, DType::kBFloat16), nonnegative({4096}, 300)},
       {In(0), In(1), I(300), I(-1), B(false)}});
  // src wider than index; negative indices along dim 0.
  for (DType dt : {kF32, DType::kBFloat16, kI64}) {
    cases.push_back({"aten.scatter_add.default",
                     {floats({300, 40}, dt), indices({2000, 40}, 300, kI64),
                      floats({2000, 41}, dt)},
                     {In(0), I(0), In(1), In(2)}});
  }
  cases.push_back({"aten.scatter_add.default",
                   {floats({64, 300}, kF32), indices({64, 900}, 300, kI32),
                    floats({64, 900}, kF32)},
                   {In(0), I(-1), In(1), In(2)}});
  for (DType dt : {kF32, DType::kFloat16, kI32}) {
    cases.push_back({"aten.scatter.src",
                     {floats({300, 40}, dt), indices({2000, 40}, 300, kI64),
                      floats({2000, 41}, dt)},
                     {In(0), I(0), In(1), In(2)}});
  }
  cases.push_back({"aten.scatter.value",
                   {floats({64, 300}, kF32), indices({64, 900}, 300, kI64)},
                   {In(0), I(1), In(1), F(2.5)}});
  cases.push_back(
      {"aten.index_put.default",
       {floats({500, 16}, DType::kBFloat16), indices({3000}, 500, kI64),
        floats({3000, 16}, DType::kBFloat16)},
       {In(0), Refs({1}), In(2), B(false)}});
  // One index tensor over rows, values broadcast along them; two index
  // tensors broadcast together.
  cases.push_back({"aten.index_put.default",
                   {floats({500, 16}, kF32), indices({3000}, 500, kI64),
                    floats({3000, 16}, kF32)},
                   {In(0), Refs({1}), In(2), B(true)}});
  cases.push_back({"aten.index_put.default",
                   {floats({500, 16}, kF32), indices({3000}, 500, kI64),
                    floats({16}, kF32)},
                   {In(0), Refs({1}), In(2), B(true)}});
  cases.push_back({"aten.index_put.default",
                   {floats({40, 30, 8}, kF32), indices({700, 1}, 40, kI64),
                    indices({5}, 30, kI64), floats({700, 5, 8}, kF32)},
                   {In(0), Refs({1, 2}), In(3), B(true)}});
  // cumsum is a scan (LinearCumsum): 8 x 4096 x 4096 = 2^27 steps as the
  // quadratic reduction; along the last, first and a middle dim, in float32,
  // bfloat16 and int64, through a transposed view.
  cases.push_back(
      {"aten.cumsum.default", {floats({8, 4096}, kF32)}, {In(0), I(-1)}});
  cases.push_back(
      {"aten.cumsum.default", {floats({5000, 24}, kF32)}, {In(0), I(0)}});
  cases.push_back({"aten.cumsum.default",
                   {floats({16, 3000}, DType::kBFloat16)},
                   {In(0), I(1)}});
  cases.push_back(
      {"aten.cumsum.default", {floats({20, 700, 9}, kI64)}, {In(0), I(1)}});
  cases.push_back({"aten.cumsum.default",
                   {TransposedView(floats({3000, 5}, kF32))},
                   {In(0), I(1)}});
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.op, " ", DTypeName(c.in[0].dtype()), " ",
                              c.in[0].ToString(0)));
    auto want = RunTracked(c.op, c.in, c.args, -1);
    ASSERT_TRUE(want.ok()) << want.status();
    auto exe = CompileOneOp(c.op, c.in, c.args, -1);
    ASSERT_TRUE(exe.ok()) << exe.status();
    ThreadPool pool(2);
    auto two = (*exe)->Run(c.in, &pool);
    auto one = (*exe)->Run(c.in, nullptr);
    auto again = (*exe)->Run(c.in, &pool);
    ASSERT_TRUE(two.ok() && one.ok() && again.ok());
    const HostTensor& got = (*two)[0];
    EXPECT_EQ(Compare(got, want->outputs[0]), "");
    for (const HostTensor* other : {&(*one)[0], &(*again)[0]}) {
      ASSERT_EQ(other->numel(), got.numel());
      EXPECT_EQ(0, std::memcmp(other->data(), got.data(),
                               got.numel() * DTypeSize(got.dtype())));
    }
  }
}

// A CompileRequest in JSON (its graph) compiled for this machine's CPU and
// loaded, with the imported graph for the reference evaluator.
struct CpuGraph {
  std::unique_ptr<CpuExecutable> exe;
  Graph graph;
};
absl::StatusOr<CpuGraph> CompileCpuJson(const char* json,
                                        const CompileEnv& env = {}) {
  v1::CompileRequest req;
  if (auto s = google::protobuf::util::JsonStringToMessage(json, &req);
      !s.ok()) {
    return absl::InvalidArgumentError(s.ToString());
  }
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req, env);
  if (!artifact.ok()) return artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  if (!exe.ok()) return exe.status();
  auto graph = ImportGraph(req.graph());
  if (!graph.ok()) return graph.status();
  return CpuGraph{*std::move(exe), *std::move(graph)};
}

// `inputs` through the compiled program and the reference evaluator:
// every output alike.
void ExpectMatchesReference(const CpuGraph& compiled,
                            const std::vector<HostTensor>& inputs,
                            ThreadPool& pool) {
  auto got = compiled.exe->Run(inputs, &pool);
  auto want = EvaluateReference(compiled.graph, inputs);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  for (size_t o = 0; o < got->size(); ++o)
    EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
}

// A scatter over symbolic sizes, one compile for every binding: the
// target is x[2:] (s0 - 2 rows) and the sources' count is s1, bound to
// sizes with duplicates, and to an empty target (s0 = 2): no index can be
// in range there, and the compiled program says OUT_OF_RANGE as the
// reference does, without touching the empty buffer (its clamped index
// would name element 0).
TEST(IndexingScatterLinear, SymbolicSizesIncludingEmpty) {
  const char* json = R"({"graph": {
    "symbols": [{"name": "s0"}, {"name": "s1"}],
    "inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"symbol": "s0"}, {"value": "4"}]}},
      {"name": "i", "meta": {"dtype": "INT64", "sizes": [{"symbol": "s1"}]}},
      {"name": "v", "meta": {"dtype": "FLOAT32", "sizes": [{"symbol": "s1"}, {"value": "4"}]}}],
    "nodes": [
      {"op": "aten.slice.Tensor",
       "args": [{"ref": "x"}, {"i": "0"}, {"i": "2"}], "outputs": ["t"]},
      {"op": "aten.index_put.default",
       "args": [{"ref": "t"}, {"refs": {"values": ["i"]}}, {"ref": "v"}, {"b": true}],
       "outputs": ["a"]},
      {"op": "aten.index_put.default",
       "args": [{"ref": "t"}, {"refs": {"values": ["i"]}}, {"ref": "v"}, {"b": false}],
       "outputs": ["r"]}],
    "outputs": ["a", "r"]}})";
  absl::StatusOr<CpuGraph> compiled = CompileCpuJson(json);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (const auto& [rows, n] :
       std::vector<std::pair<int64_t, int64_t>>{{7, 40}, {2, 3}, {0, 5}}) {
    SCOPED_TRACE(absl::StrCat(rows, " target rows, ", n, " sources"));
    HostTensor x = HostTensor::Empty(kF32, {rows + 2, 4});
    HostTensor i = HostTensor::Empty(kI64, {n});
    HostTensor v = HostTensor::Empty(kF32, {n, 4});
    std::uniform_real_distribution<double> u(-1, 1);
    for (int64_t e = 0; e < x.numel(); ++e) x.SetDoubleAt(e, u(rng));
    for (int64_t e = 0; e < v.numel(); ++e) v.SetDoubleAt(e, u(rng));
    std::uniform_int_distribution<int64_t> k(-rows,
                                             std::max<int64_t>(rows - 1, 0));
    for (int64_t e = 0; e < n; ++e) i.SetIntAt(e, rows > 0 ? k(rng) : 0);
    if (rows == 0) {
      auto got = compiled->exe->Run({x, i, v}, &pool);
      auto want = EvaluateReference(compiled->graph, {x, i, v});
      EXPECT_EQ(want.status().code(), absl::StatusCode::kOutOfRange);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange)
          << got.status();
      continue;
    }
    ExpectMatchesReference(*compiled, {x, i, v}, pool);
  }
}

// cumsum is a scan on the CPU (LinearCumsum), so sizes may be symbolic:
// one compile, run for several bindings (down to 2, the least a symbol
// takes), along the symbolic dim and across it, against the reference.
TEST(IndexingCumsum, LinearOverSymbolicSizes) {
  const char* json = R"({"graph": {
    "symbols": [{"name": "s0"}],
    "inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"symbol": "s0"}, {"value": "5"}]}},
      {"name": "m", "meta": {"dtype": "INT64", "sizes": [{"value": "3"}, {"symbol": "s0"}]}}],
    "nodes": [
      {"op": "aten.cumsum.default", "args": [{"ref": "x"}, {"i": "0"}], "outputs": ["a"]},
      {"op": "aten.cumsum.default", "args": [{"ref": "x"}, {"i": "1"}], "outputs": ["b"]},
      {"op": "aten.cumsum.default", "args": [{"ref": "m"}, {"i": "-1"}], "outputs": ["c"]}],
    "outputs": ["a", "b", "c"]}})";
  absl::StatusOr<CpuGraph> compiled = CompileCpuJson(json);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  std::mt19937 rng(11);
  ThreadPool pool(2);
  for (int64_t n : {1000, 7, 2}) {
    SCOPED_TRACE(absl::StrCat("s0 = ", n));
    HostTensor x = HostTensor::Empty(kF32, {n, 5});
    HostTensor m = HostTensor::Empty(kI64, {3, n});
    std::uniform_real_distribution<double> u(-1, 1);
    std::uniform_int_distribution<int64_t> k(-9, 9);
    for (int64_t e = 0; e < x.numel(); ++e) x.SetDoubleAt(e, u(rng));
    for (int64_t e = 0; e < m.numel(); ++e) m.SetIntAt(e, k(rng));
    ExpectMatchesReference(*compiled, {x, m}, pool);
  }
}

// CUDA's cumsum (LowerOptions::reduction_cumsum) compiled for the CPU
// (CompileEnv::reduction_cumsum_on_cpu) against the reference: rows longer
// than 64 in blocks of ceil(sqrt(n)) (BlockedCumsum; 1000 = 32 x 32 - 24,
// 4000 = 64 x 63 - 32 and 65 = 9 x 8 - 7 end in a partial block), along the
// first, middle and last dims, in float32, bfloat16 and int64; a row of
// 64 takes the plain quadratic reduction.
TEST(IndexingCumsum, BlockedAsOnCuda) {
  const char* json = R"({"graph": {
    "inputs": [
      {"name": "x", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "3"}, {"value": "1000"}, {"value": "2"}]}},
      {"name": "y", "meta": {"dtype": "BFLOAT16", "sizes": [{"value": "4000"}]}},
      {"name": "m", "meta": {"dtype": "INT64", "sizes": [{"value": "5"}, {"value": "65"}]}},
      {"name": "z", "meta": {"dtype": "FLOAT32", "sizes": [{"value": "64"}, {"value": "3"}]}}],
    "nodes": [
      {"op": "aten.cumsum.default", "args": [{"ref": "x"}, {"i": "1"}], "outputs": ["a"]},
      {"op": "aten.cumsum.default", "args": [{"ref": "y"}, {"i": "0"}], "outputs": ["b"]},
      {"op": "aten.cumsum.default", "args": [{"ref": "m"}, {"i": "-1"}], "outputs": ["c"]},
      {"op": "aten.cumsum.default", "args": [{"ref": "z"}, {"i": "0"}], "outputs": ["d"]}],
    "outputs": ["a", "b", "c", "d"]}})";
  CompileEnv env;
  env.reduction_cumsum_on_cpu = true;
  absl::StatusOr<CpuGraph> compiled = CompileCpuJson(json, env);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  std::mt19937 rng(13);
  ThreadPool pool(2);
  HostTensor x = HostTensor::Empty(kF32, {3, 1000, 2});
  HostTensor y = HostTensor::Empty(DType::kBFloat16, {4000});
  HostTensor m = HostTensor::Empty(kI64, {5, 65});
  HostTensor z = HostTensor::Empty(kF32, {64, 3});
  std::uniform_real_distribution<double> u(-1, 1);
  std::uniform_int_distribution<int64_t> k(-1000000, 1000000);
  for (HostTensor* t : {&x, &y, &z})
    for (int64_t e = 0; e < t->numel(); ++e) t->SetDoubleAt(e, u(rng));
  for (int64_t e = 0; e < m.numel(); ++e) m.SetIntAt(e, k(rng));
  ExpectMatchesReference(*compiled, {x, y, m, z}, pool);
}

TEST(IndexingIndexPut, AccumulateOrLastWriteWithBroadcasting) {
  const std::string op = "aten.index_put.default";
  const HostTensor z32 = F32({3, 2}, {0, 0, 0, 0, 0, 0});
  const HostTensor v = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  for (DType dt : {kF32, DType::kFloat16, DType::kBFloat16, kI64}) {
    CheckBoth(op, {Cast(z32, dt), I64({3}, {0, 2, 0}), Cast(v, dt)},
              {In(0), Refs({1}), In(2), B(true)}, dt, {3, 2},
              {6, 8, 0, 0, 3, 4});
    CheckBoth(op, {Cast(z32, dt), I64({3}, {0, 2, -3}), Cast(v, dt)},
              {In(0), Refs({1}), In(2), B(false)}, dt, {3, 2},
              {5, 6, 0, 0, 3, 4});
  }
  // Two index tensors: (0, 2) and (1, 0) twice.
  const HostTensor z23 = F32({2, 3}, {0, 0, 0, 0, 0, 0});
  CheckBoth(
      op, {z23, I64({3}, {0, 1, 1}), I32({3}, {2, 0, 0}), F32({3}, {1, 2, 3})},
      {In(0), Refs({1, 2}), In(3), B(true)}, kF32, {2, 3}, {0, 0, 1, 5, 0, 0});
  CheckBoth(
      op, {z23, I64({3}, {0, 1, 1}), I32({3}, {2, 0, 0}), F32({3}, {1, 2, 3})},
      {In(0), Refs({1, 2}), In(3)}, kF32, {2, 3}, {0, 0, 1, 3, 0, 0});
  // A 0-dim value broadcast; a non-contiguous self.
  CheckBoth(op, {F32({3}, {0, 0, 0}), I64({2}, {0, 2}), F32({}, {9})},
            {In(0), Refs({1}), In(2), B(false)}, kF32, {3}, {9, 0, 9});
  CheckBoth(op, {TransposedView(M23()), I64({1}, {1}), F32({2}, {10, 20})},
            {In(0), Refs({1}), In(2), B(true)}, kF32, {3, 2},
            {1, 4, 12, 25, 3, 6});
  CheckBoth(op, {z32, I64({0}, {}), F32({0, 2}, {})},
            {In(0), Refs({1}), In(2), B(true)}, kF32, {3, 2},
            {0, 0, 0, 0, 0, 0});
  ExpectInvalid(op, {z32, I64({3}, {0, 1, 2}), F32({2, 2}, {})},
                {In(0), Refs({1}), In(2), B(true)}, {"broadcast"});
}

TEST(IndexingCumsum, DimsAndDTypes) {
  CheckBoth("aten.cumsum.default", {M23()}, {In(0), I(1)}, kF32, {2, 3},
            {1, 3, 6, 4, 9, 15});
  CheckBoth("aten.cumsum.default", {M23()}, {In(0), I(-2)}, kF32, {2, 3},
            {1, 2, 3, 5, 7, 9});
  for (DType dt : kFloatDTypes) {
    CheckBoth("aten.cumsum.default", {Cast(M23(), dt)}, {In(0), I(1)}, dt,
              {2, 3}, {1, 3, 6, 4, 9, 15});
  }
  CheckBoth("aten.cumsum.default", {I32({3}, {1, 2, 3})}, {In(0), I(0)}, kI64,
            {3}, {1, 3, 6});
  CheckBoth("aten.cumsum.default", {Bool({3}, {1, 0, 1})}, {In(0), I(0)}, kI64,
            {3}, {1, 1, 2});
  CheckBoth("aten.cumsum.default", {I32({3}, {1, 2, 3})},
            {In(0), I(0), Kw("dtype", DT(v1::FLOAT32))}, kF32, {3}, {1, 3, 6});
  CheckBoth("aten.cumsum.default", {TransposedView(M23())}, {In(0), I(0)}, kF32,
            {3, 2}, {1, 4, 3, 9, 6, 15});
  CheckBoth("aten.cumsum.default", {F32({0, 2}, {})}, {In(0), I(0)}, kF32,
            {0, 2}, {});
}

TEST(IndexingFlip, DimsDTypesAndViews) {
  // [[1, 2, 3], [4, 5, 6]] flipped along the columns, then both dims.
  CheckBoth("aten.flip.default", {M23()}, {In(0), Ints({1})}, kF32, {2, 3},
            {3, 2, 1, 6, 5, 4});
  CheckBoth("aten.flip.default", {M23()}, {In(0), Ints({-1, 0})}, kF32, {2, 3},
            {6, 5, 4, 3, 2, 1});
  for (DType dt : {DType::kFloat16, DType::kBFloat16, kI32, kI64, kBool}) {
    CheckBoth("aten.flip.default", {Cast(F32({3}, {1, 0, 0}), dt)},
              {In(0), Ints({0})}, dt, {3}, {0, 0, 1});
  }
  CheckBoth("aten.flip.default", {TransposedView(M23())}, {In(0), Ints({0})},
            kF32, {3, 2}, {3, 6, 2, 5, 1, 4});
  CheckBoth("aten.flip.default", {M23()}, {In(0), Ints({})}, kF32, {2, 3},
            {1, 2, 3, 4, 5, 6});
  CheckBoth("aten.flip.default", {F32({0, 2}, {})}, {In(0), Ints({0, 1})}, kF32,
            {0, 2}, {});
  ExpectInvalid("aten.flip.default", {M23()}, {In(0), Ints({1, -1})},
                {"multiple times"});
  ExpectInvalid("aten.flip.default", {M23()}, {In(0), Ints({2})});
}

// ---- fused graphs ----

// Fills integer inputs with indices for their graph's use: in [-b, b) for
// b = bound[input] > 0, in [0, -b) for b < 0; floats and bools at random.
std::vector<HostTensor> IndexInputs(const Graph& graph,
                                    const std::vector<int64_t>& bound,
                                    std::mt19937_64& rng) {
  std::vector<HostTensor> in = RandomInputs(graph, {}, rng);
  for (size_t k = 0; k < in.size(); ++k) {
    if (bound[k] == 0) continue;
    const int64_t b = std::abs(bound[k]);
    std::uniform_int_distribution<int64_t> u(bound[k] > 0 ? -b : 0, b - 1);
    for (int64_t e = 0; e < in[k].numel(); ++e) in[k].SetIntAt(e, u(rng));
  }
  return in;
}

void ExpectExampleMatchesReference(const std::string& file,
                                   const std::vector<int64_t>& bound) {
  SCOPED_TRACE(file);
  v1::CompileRequest req = Request(file);
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  std::mt19937_64 rng(11);
  ThreadPool pool(2);
  for (int round = 0; round < 3; ++round) {
    std::vector<HostTensor> in = IndexInputs(*graph, bound, rng);
    auto want = EvaluateReference(*graph, in);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*exe)->Run(in, &pool);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t o = 0; o < got->size(); ++o)
      EXPECT_EQ(Compare((*got)[o], (*want)[o]), "") << "output " << o;
  }
}

// An embedding feeding cross-entropy (log_softmax + nll_loss) and its
// backward (nll_loss_backward, the log_softmax backward, the embedding's
// scatter-add): gathers fused into the kernels that read them.
TEST(IndexingGraphs, EmbeddingCrossEntropyForwardBackward) {
  // Targets in [0, 16) only (nll_loss does not wrap).
  ExpectExampleMatchesReference("embedding_cross_entropy.json",
                                {0, 64, -16, 0});
}

TEST(IndexingGraphs, GatherScatterMix) {
  ExpectExampleMatchesReference("gather_scatter_mix.json", {0, 16, 33, 0});
}

// ---- out-of-range indices in compiled code (issue 17.2) ----
//
// Each op that reads indices from data: an index too large and one too
// negative each fail the compiled run with OUT_OF_RANGE naming node, op,
// index and size, after kernels that clamped it (the outputs hold clamped
// reads); in-range negative indices still wrap (the CheckBoth tests above).

TEST(IndexingOutOfRange, EmbeddingIndexSelectGatherIndex) {
  const std::string dim0 = " is out of range for dimension 0 of size 2";
  const std::string dim1 = " is out of range for dimension 1 of size 3";
  CheckOutOfRange("aten.embedding.default", {M23(), I64({2}, {1, 7})},
                  {In(0), In(1)}, {4, 5, 6, 4, 5, 6}, "index 7" + dim0);
  CheckOutOfRange("aten.embedding.default", {M23(), I32({2}, {-3, 0})},
                  {In(0), In(1)}, {1, 2, 3, 1, 2, 3}, "index -3" + dim0);
  CheckOutOfRange("aten.index_select.default", {M23(), I64({2}, {0, 3})},
                  {In(0), I(1), In(1)}, {1, 3, 4, 6}, "index 3" + dim1);
  CheckOutOfRange("aten.index_select.default", {M23(), I64({1}, {-4})},
                  {In(0), I(-1), In(1)}, {1, 4}, "index -4" + dim1);
  CheckOutOfRange("aten.gather.default", {M23(), I64({1, 2}, {2, 3})},
                  {In(0), I(1), In(1)}, {3, 3}, "index 3" + dim1);
  CheckOutOfRange("aten.gather.default", {M23(), I64({1, 1}, {-3})},
                  {In(0), I(0), In(1)}, {1}, "index -3" + dim0);
  CheckOutOfRange("aten.index.Tensor", {M23(), I64({2}, {1, 2})},
                  {In(0), Refs({1})}, {4, 5, 6, 4, 5, 6}, "index 2" + dim0);
  CheckOutOfRange("aten.index.Tensor", {Iota({3}), I64({2}, {-4, -1})},
                  {In(0), Refs({1})}, {0, 2},
                  "index -4 is out of range for dimension 0 of size 3");
}

TEST(IndexingOutOfRange, ScattersAndIndexPut) {
  const HostTensor zeros = F32({2, 3}, {0, 0, 0, 0, 0, 0});
  const std::string dim1 = " is out of range for dimension 1 of size 3";
  // Clamped: the bad index hits the last (first) column.
  CheckOutOfRange(
      "aten.scatter_add.default", {zeros, I64({1, 2}, {0, 5}), M23()},
      {In(0), I(1), In(1), In(2)}, {1, 0, 2, 0, 0, 0}, "index 5" + dim1);
  CheckOutOfRange("aten.scatter.src", {zeros, I64({1, 1}, {-4}), M23()},
                  {In(0), I(1), In(1), In(2)}, {1, 0, 0, 0, 0, 0},
                  "index -4" + dim1);
  CheckOutOfRange("aten.scatter.value", {F32({3}, {0, 0, 0}), I64({1}, {-9})},
                  {In(0), I(0), In(1), F(1)}, {1, 0, 0},
                  "index -9 is out of range for dimension 0 of size 3");
  const HostTensor z32 = F32({3, 2}, {0, 0, 0, 0, 0, 0});
  const HostTensor v = F32({2, 2}, {1, 2, 3, 4});
  for (bool accumulate : {true, false}) {
    SCOPED_TRACE(accumulate);
    CheckOutOfRange("aten.index_put.default", {z32, I64({2}, {0, 3}), v},
                    {In(0), Refs({1}), In(2), B(accumulate)},
                    {1, 2, 0, 0, 3, 4},
                    "index 3 is out of range for dimension 0 of size 3");
    CheckOutOfRange("aten.index_put.default", {z32, I64({2}, {-4, 1}), v},
                    {In(0), Refs({1}), In(2), B(accumulate)},
                    {1, 2, 3, 4, 0, 0},
                    "index -4 is out of range for dimension 0 of size 3");
  }
}

TEST(IndexingOutOfRange, EmbeddingBackwardAndNllLoss) {
  const std::string dim0 = " is out of range for dimension 0 of size 3";
  const HostTensor g = F32({2, 2}, {1, 2, 3, 4});
  CheckOutOfRange("aten.embedding_dense_backward.default",
                  {g, I64({2}, {0, 3})}, {In(0), In(1), I(3), I(-1), B(false)},
                  {1, 2, 0, 0, 3, 4}, "index 3" + dim0);
  CheckOutOfRange("aten.embedding_dense_backward.default",
                  {g, I64({2}, {-5, 1})}, {In(0), In(1), I(3), I(-1), B(false)},
                  {1, 2, 3, 4, 0, 0}, "index -5" + dim0);
  // nll_loss: targets in [0, C) or ignore_index; -1 is out of bounds.
  const std::string fwd = "aten.nll_loss_forward.default";
  CheckOutOfRange(fwd, {LogProbs(), I64({3}, {1, 2, 0})},
                  {In(0), In(1), NoneArg(), I(0), I(-100)}, {2, 4, 5},
                  "Target 2 is out of bounds (2 classes)");
  CheckOutOfRange(fwd, {LogProbs(), I64({3}, {1, -1, -100})},
                  {In(0), In(1), NoneArg(), I(2), I(-100)}, {5},
                  "Target -1 is out of bounds (2 classes)");
  const std::string bwd = "aten.nll_loss_backward.default";
  CheckOutOfRange(
      bwd, {F32({}, {1}), LogProbs(), I64({3}, {1, 0, 7}), F32({}, {1})},
      {In(0), In(1), In(2), NoneArg(), I(2), I(-100), In(3)},
      {0, -1, -1, 0, 0, 0}, "Target 7 is out of bounds (2 classes)");
  // ignore_index itself is never out of bounds.
  CheckBoth(fwd, {LogProbs(), I64({3}, {1, -7, 0})},
            {In(0), In(1), NoneArg(), I(2), I(-7)}, kF32, {}, {7});
}

// The node named is the graph's, not the op's position: an embedding after
// two other nodes; and an executable that failed runs good inputs again
// (the error word is per run), through Run and RunInto, and in-range
// negative indices wrap.
TEST(IndexingOutOfRange, NamesTheNodeAndResetsPerRun) {
  const char* json = R"({"graph": {
    "inputs": [
      {"name": "w", "meta": {"dtype": "FLOAT32", "sizes": [{"value": 4},
                                                         {"value": 2}]}},
      {"name": "i", "meta": {"dtype": "INT64", "sizes": [{"value": 3}]}}],
    "nodes": [
      {"op": "aten.mul.Tensor", "args": [{"ref": "w"}, {"ref": "w"}],
       "outputs": ["w2"]},
      {"op": "aten.add.Tensor", "args": [{"ref": "i"}, {"i": "1"}],
       "outputs": ["j"]},
      {"op": "aten.embedding.default", "args": [{"ref": "w2"}, {"ref": "j"}],
       "outputs": ["y"]}],
    "outputs": ["y"]}})";
  v1::CompileRequest req;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &req).ok());
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  ASSERT_EQ(artifact->program().index_checks_size(), 1);
  EXPECT_EQ(artifact->program().index_checks(0).node(), 2);
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const HostTensor w = F32({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  ThreadPool pool(2);
  for (int round = 0; round < 2; ++round) {
    auto bad = (*exe)->Run({w, I64({3}, {0, 3, 1})}, &pool);
    ASSERT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(bad.status().message(),
              "node 2 (aten.embedding.default): index 4 is out of range for "
              "dimension 0 of size 4");
    // -5 + 1 = -4 wraps to row 0; -2 + 1 to row 3.
    auto good = (*exe)->Run({w, I64({3}, {-5, -2, 2})}, &pool);
    ASSERT_TRUE(good.ok()) << good.status();
    ExpectValuesNear((*good)[0], {1, 4, 49, 64, 49, 64});
    std::vector<HostTensor> out;
    ASSERT_TRUE(RunIntoOutputs(**exe, {w, I64({3}, {0, 1, 2})}, out).ok());
    ExpectValuesNear(out[0], {9, 16, 25, 36, 49, 64});
  }
}

// Programs without a data-dependent index have no error word and no check
// sites (their artifacts are as before; artifact_digest_test pins bytes).
TEST(IndexingOutOfRange, NoErrorWordWithoutGathers) {
  auto exe =
      CompileOneOp("aten.add.Tensor", {M23(), M23()}, {In(0), In(1)}, -1);
  ASSERT_TRUE(exe.ok()) << exe.status();
  const v1::Program& p = (*exe)->artifact().program();
  EXPECT_EQ(p.index_checks_size(), 0);
  for (const v1::BufferSpec& b : p.buffers())
    EXPECT_NE(b.kind(), v1::BufferSpec::ERROR);
  auto gather = CompileOneOp("aten.embedding.default",
                             {M23(), I64({2}, {0, 1})}, {In(0), In(1)}, -1);
  ASSERT_TRUE(gather.ok()) << gather.status();
  const v1::Program& q = (*gather)->artifact().program();
  ASSERT_EQ(q.index_checks_size(), 1);
  EXPECT_EQ(q.index_checks(0).op(), "aten.embedding.default");
  int errors = 0;
  for (const v1::BufferSpec& b : q.buffers())
    errors += b.kind() == v1::BufferSpec::ERROR;
  EXPECT_EQ(errors, 1);
}

// The runtimes' shared part (runtime/program_plan.h): the message of an
// error word, taking a word a device run left in host memory, and the
// checks of the ERROR buffer at load time.
TEST(IndexingOutOfRange, ErrorWordsAndTheirChecks) {
  v1::Program p;
  v1::IndexCheck* c = p.add_index_checks();
  c->set_node(7);
  c->set_op("aten.embedding.default");
  c->set_dim(0);
  c = p.add_index_checks();
  c->set_kind(v1::IndexCheck::TARGET);
  c->set_node(3);
  c->set_op("aten.nll_loss_forward.default");
  const int64_t none[3] = {0, 5, 5};
  EXPECT_TRUE(IndexErrorStatus(p, none).ok());
  const int64_t first[3] = {1, 50300, 50257};
  EXPECT_EQ(IndexErrorStatus(p, first),
            absl::OutOfRangeError("node 7 (aten.embedding.default): index "
                                  "50300 is out of range for dimension 0 of "
                                  "size 50257"));
  const int64_t second[3] = {2, -1, 10};
  EXPECT_EQ(IndexErrorStatus(p, second),
            absl::OutOfRangeError("node 3 (aten.nll_loss_forward.default): "
                                  "Target -1 is out of bounds (10 classes)"));
  const int64_t corrupt[3] = {3, 0, 0};
  EXPECT_EQ(IndexErrorStatus(p, corrupt).code(), absl::StatusCode::kInternal);
  int64_t mirror[3] = {1, 9, 4};
  EXPECT_EQ(TakeIndexError(p, mirror).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(mirror[0], 0);
  EXPECT_TRUE(TakeIndexError(p, mirror).ok());

  auto compiled =
      CompileOneOp("aten.gather.default", {M23(), I64({1, 2}, {0, 1})},
                   {In(0), I(1), In(1)}, -1);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const v1::Artifact& good = (*compiled)->artifact();
  int error_buffer = -1;
  for (int b = 0; b < good.program().buffers_size(); ++b) {
    if (good.program().buffers(b).kind() == v1::BufferSpec::ERROR)
      error_buffer = b;
  }
  ASSERT_GE(error_buffer, 0);
  LaunchLimits limits;
  ASSERT_TRUE(PlanProgram(good, limits).ok());
  EXPECT_EQ(PlanProgram(good, limits)->error_buffer, error_buffer);
  v1::Artifact a = good;
  a.mutable_program()->clear_index_checks();
  EXPECT_EQ(PlanProgram(a, limits).status().code(),
            absl::StatusCode::kInvalidArgument);
  a = good;
  a.mutable_program()
      ->mutable_buffers(error_buffer)
      ->mutable_elements()
      ->mutable_terms(0)
      ->set_coeff(2);
  EXPECT_EQ(PlanProgram(a, limits).status().code(),
            absl::StatusCode::kInvalidArgument);
  a = good;
  *a.mutable_program()->add_buffers() = good.program().buffers(error_buffer);
  EXPECT_EQ(PlanProgram(a, limits).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::testing
