// Kiln's fused attention (graph/ops/attention.cc, compiler/ops/attention_*):
// hand-worked values through the reference; the invalid shapes; CPU
// programs (GEMMs around a masked softmax, the composite the library path
// replaces) against the reference on random inputs, causal or not, with
// queries and keys of different lengths, strided (head-transposed) inputs,
// reduced precision and a dynamic length, the forward's out and lse fed to
// the backward in one graph; dropout (attention_dropout and its backward)
// by hand and compiled; and for CUDA targets, one cuDNN call per
// direction that the runtime's checks accept (the GPU suite runs them:
// tests/gpu/cuda_gpu_test.cc), and refuse when malformed.
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/reference.h"
#include "graph/import.h"
#include "graph/ops/random.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "runtime/program_plan.h"
#include "tests/unit/attention_cases.h"
#include "tests/unit/numerics.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

using attention_cases::Case;
using attention_cases::CaseGraph;
using attention_cases::CaseInputs;
using attention_cases::kAttention;
using attention_cases::kAttentionBackward;
using attention_cases::kAttentionBackwardDbias;
using attention_cases::kAttentionDropout;
using attention_cases::kAttentionDropoutBackward;
using attention_cases::kAttentionDropoutBackwardDbias;
using attention_cases::kEveryBias;
using attention_cases::RelativeToLargest;

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("attention", AttentionSuiteOps());

// ---- reference semantics, by hand ----

TEST(Attention, HandWorked) {
  // One query over two keys with scores 0 and ln 3 (scale 1): weights
  // 1/4 and 3/4 of the values 4 and 8; lse = ln(1 + 3).
  const double ln3 = std::log(3.0);
  auto r = RunTracked(kAttention,
                      {F32({1, 1, 1, 1}, {1}), F32({1, 1, 2, 1}, {0, ln3}),
                       F32({1, 1, 2, 1}, {4, 8})},
                      {In(0), In(1), In(2), NoneArg(), B(false), F(1.0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 1, 1}, {7});
  ExpectOutput(*r, 1, kF32, {1, 1, 1}, {std::log(4.0)});
  // Causal: the first query sees only the first key.
  r = RunTracked(kAttention,
                 {F32({1, 1, 2, 1}, {1, 1}), F32({1, 1, 2, 1}, {0, ln3}),
                  F32({1, 1, 2, 1}, {4, 8})},
                 {In(0), In(1), In(2), NoneArg(), B(true), F(1.0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 2, 1}, {4, 7});
  ExpectOutput(*r, 1, kF32, {1, 1, 2}, {0, std::log(4.0)});
  // Backward of out = 1/4 v0 + 3/4 v1 with grad_out 1: grad_v = (1/4, 3/4);
  // ds_j = p_j (v_j - 7) = (-3/4, 3/4), grad_q = sum ds_j k_j = 3/4 ln 3,
  // grad_k = ds_j q = (-3/4, 3/4).
  r = RunTracked(
      kAttentionBackward,
      {F32({1, 1, 1, 1}, {1}), F32({1, 1, 1, 1}, {1}),
       F32({1, 1, 2, 1}, {0, ln3}), F32({1, 1, 2, 1}, {4, 8}),
       F32({1, 1, 1, 1}, {7}), F32({1, 1, 1}, {std::log(4.0)})},
      {In(0), In(1), In(2), In(3), NoneArg(), In(4), In(5), B(false), F(1.0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 1, 1}, {0.75 * ln3});
  ExpectOutput(*r, 1, kF32, {1, 1, 2, 1}, {-0.75, 0.75});
  ExpectOutput(*r, 2, kF32, {1, 1, 2, 1}, {0.25, 0.75});
  // A bias of -ln 3 on the second key evens the weights: out = 6,
  // lse = ln 2.
  r = RunTracked(kAttention,
                 {F32({1, 1, 1, 1}, {1}), F32({1, 1, 2, 1}, {0, ln3}),
                  F32({1, 1, 2, 1}, {4, 8}), F32({1, 1, 1, 2}, {0, -ln3})},
                 {In(0), In(1), In(2), In(3), B(false), F(1.0)});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 1, 1}, {6});
  ExpectOutput(*r, 1, kF32, {1, 1, 1}, {std::log(2.0)});
}

TEST(Attention, InvalidArguments) {
  const std::vector<v1::Argument> args = {In(0),     In(1),    In(2),
                                          NoneArg(), B(false), F(0.5)};
  ExpectInvalid(kAttention,
                {F32({2, 3, 4}, {}), F32({2, 3, 4}, {}), F32({2, 3, 4}, {})},
                args, {"node 0", kAttention, "query must be [batch, heads"});
  ExpectInvalid(
      kAttention,
      {F32({1, 2, 4, 8}, {}), F32({1, 3, 4, 8}, {}), F32({1, 3, 4, 8}, {})},
      args, {"same batch and heads"});
  ExpectInvalid(
      kAttention,
      {F32({1, 2, 4, 8}, {}), F32({1, 2, 5, 8}, {}), F32({1, 2, 6, 8}, {})},
      args, {"key and value must have the same length"});
  ExpectInvalid(
      kAttention,
      {F32({1, 2, 4, 8}, {}), F32({1, 2, 5, 4}, {}), F32({1, 2, 5, 8}, {})},
      args, {"same head dim"});
  ExpectInvalid(
      kAttention,
      {F32({1, 1, 2, 2}, {}), BF16({1, 1, 2, 2}, {}), F32({1, 1, 2, 2}, {})},
      args, {"one dtype"});
  ExpectInvalid(
      kAttention,
      {I64({1, 1, 2, 2}, {}), I64({1, 1, 2, 2}, {}), I64({1, 1, 2, 2}, {})},
      args, {"float32, float16 or bfloat16"});
  ExpectInvalid(
      kAttentionBackward,
      {F32({1, 1, 2, 4}, {}), F32({1, 1, 2, 4}, {}), F32({1, 1, 3, 4}, {}),
       F32({1, 1, 3, 4}, {}), F32({1, 1, 2, 4}, {}), F16({1, 1, 2}, {})},
      {In(0), In(1), In(2), In(3), NoneArg(), In(4), In(5), B(true), F(0.5)},
      {"lse must be float32"});
  ExpectInvalid(kAttention,
                {F32({1, 2, 4, 8}, {}), F32({1, 2, 5, 8}, {}),
                 F32({1, 2, 5, 8}, {}), F32({1, 3, 4, 5}, {})},
                {In(0), In(1), In(2), In(3), B(false), F(0.5)},
                {"attn_bias must be 4-D with each dim 1 or the scores'"});
  ExpectInvalid(kAttention,
                {F32({1, 2, 4, 8}, {}), F32({1, 2, 5, 8}, {}),
                 F32({1, 2, 5, 8}, {}), BF16({1, 1, 4, 5}, {})},
                {In(0), In(1), In(2), In(3), B(false), F(0.5)},
                {"attn_bias must have the query's dtype"});
  ExpectInvalid(
      kAttentionBackwardDbias,
      {F32({1, 1, 2, 4}, {}), F32({1, 1, 2, 4}, {}), F32({1, 1, 3, 4}, {}),
       F32({1, 1, 3, 4}, {}), F32({1, 1, 2, 4}, {}), F32({1, 1, 2}, {})},
      {In(0), In(1), In(2), In(3), NoneArg(), In(4), In(5), B(true), F(0.5)},
      {"node 0", kAttentionBackwardDbias, "attn_bias is required"});
}

// Dropout by hand: with equal scores each probability is 1/S and v the
// identity, so out is the dropped probabilities themselves: each 0 or
// 1 / ((1 - p) S), about 1 - p of them kept; rng is (seed, offset); and
// the draw follows the seed.
TEST(Attention, DropoutKeepsOneMinusP) {
  constexpr int64_t kRows = 64, kKeys = 32;
  constexpr double kP = 0.25;
  std::vector<double> eye(kKeys * kKeys, 0.0);
  for (int64_t j = 0; j < kKeys; ++j) eye[j * kKeys + j] = 1;
  auto run = [&](int64_t seed) {
    return RunTracked(
        kAttentionDropout,
        {F32({1, 1, kRows, 1}, std::vector<double>(kRows, 0.0)),
         F32({1, 1, kKeys, 1}, std::vector<double>(kKeys, 0.0)),
         F32({1, 1, kKeys, kKeys}, eye), I64({}, {static_cast<double>(seed)})},
        {In(0), In(1), In(2), NoneArg(), B(false), F(1.0), F(kP),
         Kw("seed", In(3)), Kw("offset", I(5))});
  };
  auto r = run(1234);
  ASSERT_TRUE(r.ok()) << r.status();
  const HostTensor& out = r->outputs[0];
  const double kept_value = 1.0 / ((1.0 - kP) * kKeys);
  int64_t kept = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double x = out.GetDoubleAt(i);
    ASSERT_TRUE(x == 0 || std::abs(x - kept_value) < 1e-6) << i << ": " << x;
    kept += x != 0;
  }
  // 2048 draws: 1 - p = 0.75 within 5 standard deviations (0.0096 each).
  EXPECT_NEAR(static_cast<double>(kept) / out.numel(), 1.0 - kP, 0.05);
  ExpectOutput(*r, 2, DType::kInt64, {2}, {1234, 5});
  auto other = run(99);
  ASSERT_TRUE(other.ok()) << other.status();
  int64_t differ = 0;
  for (int64_t i = 0; i < out.numel(); ++i)
    differ +=
        (out.GetDoubleAt(i) == 0) != (other->outputs[0].GetDoubleAt(i) == 0);
  EXPECT_GT(differ, 100) << "another seed draws another mask";
}

TEST(Attention, DropoutInvalidArguments) {
  const std::vector<HostTensor> qkv = {F32({1, 1, 2, 4}, {}),
                                       F32({1, 1, 3, 4}, {}),
                                       F32({1, 1, 3, 4}, {}), I64({}, {7})};
  ExpectInvalid(kAttentionDropout, qkv,
                {In(0), In(1), In(2), NoneArg(), B(false), F(0.5), F(1.5),
                 Kw("seed", In(3))},
                {"node 0", kAttentionDropout,
                 "dropout_p must be in (0, 1) (also as a float32), got 1.5"});
  for (double p : {0.0, 1.0, 1e-60}) {
    ExpectInvalid(kAttentionDropout, qkv,
                  {In(0), In(1), In(2), NoneArg(), B(false), F(0.5), F(p),
                   Kw("seed", In(3))},
                  {"dropout_p must be in (0, 1)"});
  }
  ExpectInvalid(kAttentionDropout, qkv,
                {In(0), In(1), In(2), NoneArg(), B(false), F(0.5), F(0.1)},
                {"needs Kiln's `seed` keyword"});
  ExpectInvalid(
      kAttentionDropoutBackward,
      {F32({1, 1, 2, 4}, {}), F32({1, 1, 2, 4}, {}), F32({1, 1, 3, 4}, {}),
       F32({1, 1, 3, 4}, {}), F32({1, 1, 2, 4}, {}), F32({1, 1, 2}, {}),
       I64({3}, {1, 2, 3})},
      {In(0), In(1), In(2), In(3), NoneArg(), In(4), In(5), B(false), F(0.5),
       F(0.1), In(6)},
      {"rng must be attention_dropout's int64 [2], got int64 [3]"});
}

// ---- compiled against the reference ----

// Changes a case's inputs (after CaseInputs) before they run.
using Edit = std::function<void(std::vector<HostTensor>&)>;

// Compiles the case for the host's CPU under `env`, runs it at each of
// `lengths` (the case's L when empty) and compares every output with the
// reference; returns the artifact.
v1::Artifact CheckCompiledWith(const Case& c, const CompileEnv& env,
                               std::vector<int64_t> lengths, const Edit& edit) {
  SCOPED_TRACE(c.ToString());
  v1::CompileRequest req;
  *req.mutable_graph() = CaseGraph(c);
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto graph = ImportGraph(req.graph());
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok()) return {};
  auto artifact = Compile(req, env);
  EXPECT_TRUE(artifact.ok()) << artifact.status();
  if (!artifact.ok()) return {};
  auto exe = CpuExecutable::Load(*artifact);
  EXPECT_TRUE(exe.ok()) << exe.status();
  if (!exe.ok()) return {};
  if (lengths.empty()) lengths.push_back(c.l);
  for (int64_t l : lengths) {
    std::mt19937_64 rng(11 + l);
    std::vector<HostTensor> inputs = CaseInputs(c, l, rng);
    if (edit) edit(inputs);
    auto want = EvaluateReference(*graph, inputs);
    EXPECT_TRUE(want.ok()) << want.status();
    auto got = (*exe)->Run(inputs);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!want.ok() || !got.ok()) return *artifact;
    for (int o = 0; o < static_cast<int>(want->size()); ++o) {
      if (o >= 2 && o < (c.bias_grad ? 6 : 5) && c.dtype != DType::kFloat32) {
        // Gradients are sums that cancel, of probabilities and score
        // gradients rounded to the dtype (as PyTorch rounds them): their
        // error is relative to the largest gradient.
        EXPECT_LT(RelativeToLargest((*got)[o], (*want)[o]),
                  c.dtype == DType::kBFloat16 ? 3e-2 : 4e-3)
            << "L " << l << " output " << o;
        continue;
      }
      const std::string diff = Compare((*got)[o], (*want)[o]);
      EXPECT_TRUE(diff.empty()) << "L " << l << " output " << o << ": " << diff;
    }
  }
  ExercisedOps().insert(c.dropout > 0 ? kAttentionDropout : kAttention);
  if (c.bias_grad) {
    ExercisedOps().insert(c.dropout > 0 ? kAttentionDropoutBackwardDbias
                                        : kAttentionBackwardDbias);
  } else {
    ExercisedOps().insert(c.dropout > 0 ? kAttentionDropoutBackward
                                        : kAttentionBackward);
  }
  return *artifact;
}

// A case compiled both ways the CPU computes attention.
struct Compiled {
  v1::Artifact fused;    // the CPU runtime's kernel (runtime/cpu_attention.h)
  v1::Artifact written;  // GEMMs around a masked softmax
};

// CheckCompiledWith for the fused kernel (the default) and written out
// (CompileEnv::cpu_written_attention). Both draw dropout as the reference
// does.
Compiled CheckCompiled(const Case& c, std::vector<int64_t> lengths = {},
                       const Edit& edit = nullptr) {
  Compiled out;
  {
    SCOPED_TRACE("fused");
    out.fused = CheckCompiledWith(c, {}, lengths, edit);
  }
  CompileEnv env;
  env.cpu_written_attention = true;
  SCOPED_TRACE("written out");
  out.written = CheckCompiledWith(c, env, lengths, edit);
  return out;
}

int CountCalls(const v1::Artifact& a) {
  int n = 0;
  for (const v1::Step& s : a.program().steps()) n += s.has_call();
  return n;
}

// The fused kernel's steps: one call per direction.
std::vector<const v1::Attention*> CpuAttentionCalls(const v1::Artifact& a) {
  std::vector<const v1::Attention*> out;
  for (const v1::Step& s : a.program().steps()) {
    if (!s.has_call() || !s.call().has_attention()) continue;
    EXPECT_EQ(s.call().library(), v1::ExternCall::KILN_RUNTIME);
    out.push_back(&s.call().attention());
  }
  return out;
}

TEST(AttentionCompiled, ShapesAndMasks) {
  for (bool causal : {false, true}) {
    Case c;
    c.causal = causal;
    const Compiled a = CheckCompiled(c);
    // Written out, forward: two GEMMs; backward: five (the scores again,
    // grad_v, dp, grad_q, grad_k). Fused: one call each.
    EXPECT_EQ(CountCalls(a.written), 7);
    EXPECT_EQ(CountCalls(a.fused), 2);
    EXPECT_EQ(CpuAttentionCalls(a.fused).size(), 2u);
    Case longer_queries = c;  // more queries than keys: no row is empty
    longer_queries.l = 9;
    longer_queries.s = 4;
    CheckCompiled(longer_queries);
    Case one;  // batch 1, one head, one query, one key
    one.b = one.h = one.l = one.s = 1;
    one.causal = causal;
    CheckCompiled(one);
    Case empty;  // batch 0: written out (a library takes no empty call)
    empty.b = 0;
    empty.causal = causal;
    EXPECT_TRUE(CpuAttentionCalls(CheckCompiled(empty).fused).empty());
  }
}

TEST(AttentionCompiled, AdditiveBias) {
  for (Case::Bias bias : {Case::Bias::kPerBatch, Case::Bias::kPerHeadRow}) {
    for (bool causal : {false, true}) {
      Case c;
      c.bias = bias;
      c.causal = causal;
      CheckCompiled(c);
    }
  }
  Case dynamic;  // the bias's query dim follows the symbolic length
  dynamic.bias = Case::Bias::kPerBatch;
  dynamic.symbolic_l = true;
  CheckCompiled(dynamic, {4, 10});
}

TEST(AttentionCompiled, StridedQueryAndScale) {
  Case c;
  c.strided_q = true;
  c.causal = true;
  c.scale = 1.0 / std::sqrt(4.0);
  CheckCompiled(c);
}

TEST(AttentionCompiled, ReducedPrecision) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    Case c;
    c.dtype = dtype;
    c.causal = true;
    c.e = c.ev = 8;
    CheckCompiled(c);
  }
}

TEST(AttentionCompiled, DynamicQueryLength) {
  Case c;
  c.symbolic_l = true;
  c.causal = true;
  c.s = 9;
  CheckCompiled(c, {3, 9, 12});
}

// The CPU runtime's kernel over several blocks of queries (32 rows below
// 192 queries, 64 from 192) and of keys (512), with ragged last blocks and
// odd head dims: causal or not, more keys than queries and more queries
// than keys, with a bias, in each dtype.
TEST(AttentionCompiled, CpuKernelBlocks) {
  for (bool causal : {false, true}) {
    Case c;
    c.b = 1;
    c.h = 2;
    c.l = 200;
    c.s = 530;
    c.e = 5;
    c.ev = 3;
    c.causal = causal;
    c.bias = causal ? Case::Bias::kPerBatch : Case::Bias::kPerHeadRow;
    EXPECT_EQ(CpuAttentionCalls(CheckCompiled(c).fused).size(), 2u);
    Case tall = c;  // causal rows past the last key see every key
    tall.l = 600;
    tall.s = 70;
    tall.bias = Case::Bias::kNone;
    CheckCompiled(tall);
  }
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    Case c;
    c.dtype = dtype;
    c.b = 2;
    c.h = 1;
    c.l = 70;
    c.s = 520;
    c.e = c.ev = 16;
    c.causal = true;
    c.bias = Case::Bias::kPerBatch;
    CheckCompiled(c);
  }
}

// A row whose every score is masked (a bias of -inf across it) gives NaN,
// as the reference and PyTorch's math path do, and so does every gradient
// it reaches; the other rows are unaffected. Also a row masked only in its
// first key block (the running max starts at -inf).
TEST(AttentionCompiled, MaskedRows) {
  Case c;
  c.b = 2;
  c.h = 2;
  c.l = 40;
  c.s = 600;
  c.bias = Case::Bias::kPerBatch;
  CheckCompiled(c, {}, [&](std::vector<HostTensor>& in) {
    HostTensor& bias = in[4];  // [B, 1, L, S]
    for (int64_t j = 0; j < c.s; ++j) {
      bias.SetDouble({1, 0, 3, j}, -INFINITY);
      if (j < 520) bias.SetDouble({0, 0, 7, j}, -INFINITY);
    }
  });
}

// Dropout compiled (Philox drawn in Kiln's kernels, the mask once into a
// bool node in the backward; or by the CPU runtime's kernel, per tile)
// equals the reference's draw, forward and backward, with a bias, causal,
// in bfloat16, at a dynamic length, and over several tiles (the score
// element's index across key and query blocks). The fused calls carry the
// graph's dropout_p exactly: 0.3 is no float32, and its threshold differs
// from float32 0.3's.
TEST(AttentionCompiled, Dropout) {
  Case c;
  c.dropout = 0.3;
  c.l = 9;
  c.s = 11;
  const Compiled a = CheckCompiled(c);
  const std::vector<const v1::Attention*> calls = CpuAttentionCalls(a.fused);
  ASSERT_EQ(calls.size(), 2u);
  for (const v1::Attention* call : calls) {
    EXPECT_FLOAT_EQ(call->dropout(), 0.3f);
    EXPECT_EQ(call->keep_threshold(), ops::BernoulliThreshold(0.7));
    EXPECT_NE(call->keep_threshold(), ops::BernoulliThreshold(1.0 - 0.3f));
    EXPECT_FLOAT_EQ(call->keep_scale(), 1 / 0.7f);
  }
  Case wide = c;  // head dims above cuDNN's 128 with dropout: still fused
  wide.e = 136;
  wide.ev = 130;
  EXPECT_EQ(CpuAttentionCalls(CheckCompiled(wide).fused).size(), 2u);
  Case tiles = c;  // two key blocks for every row
  tiles.b = 1;
  tiles.h = 2;
  tiles.l = 200;
  tiles.s = 530;
  CheckCompiled(tiles);
  tiles.h = 1;  // and for the causal rows past the first 512 keys
  tiles.l = 560;
  tiles.causal = true;
  CheckCompiled(tiles);
  c.causal = true;
  c.bias = Case::Bias::kPerHeadRow;
  CheckCompiled(c);
  Case half = c;
  half.dtype = DType::kBFloat16;
  half.e = half.ev = 8;
  CheckCompiled(half);
  Case dynamic = c;
  dynamic.symbolic_l = true;
  dynamic.bias = Case::Bias::kNone;
  CheckCompiled(dynamic, {4, 13});
}

// The _dbias backward ops give the bias its gradient (a learned position
// bias, a mask that needs one): the scores' gradient before the scale,
// summed over the dims where the bias broadcasts, for every bias shape
// (heads and batches summed, the query dim summed where the bias has none),
// causal or not, with dropout, in bfloat16, over several key and query
// blocks of the CPU kernel and at a dynamic length; the fused backward is
// one call that writes it.
TEST(AttentionCompiled, BiasGradient) {
  for (Case::Bias bias : kEveryBias) {
    for (bool causal : {false, true}) {
      Case c;
      c.bias = bias;
      c.bias_grad = true;
      c.causal = causal;
      const Compiled a = CheckCompiled(c);
      const std::vector<const v1::Attention*> calls =
          CpuAttentionCalls(a.fused);
      ASSERT_EQ(calls.size(), 2u);
      EXPECT_FALSE(calls[0]->bias_grad());
      EXPECT_TRUE(calls[1]->bias_grad());
    }
  }
  Case dropout;
  dropout.bias = Case::Bias::kPerHead;
  dropout.bias_grad = true;
  dropout.dropout = 0.3;
  dropout.causal = true;
  CheckCompiled(dropout);
  Case half;
  half.bias = Case::Bias::kShared;
  half.bias_grad = true;
  half.dtype = DType::kBFloat16;
  half.e = half.ev = 8;
  CheckCompiled(half);
  Case tiles;  // two key blocks, several query blocks, 6 heads per slice
  tiles.bias = Case::Bias::kShared;
  tiles.bias_grad = true;
  tiles.l = 200;
  tiles.s = 530;
  tiles.causal = true;
  CheckCompiled(tiles);
  Case dynamic;
  dynamic.bias = Case::Bias::kPerHead;
  dynamic.bias_grad = true;
  dynamic.symbolic_l = true;
  CheckCompiled(dynamic, {4, 10});
}

// A pair a library drew (kLibraryDrawn in its offset: cuDNN's generator)
// cannot be drawn again by Kiln's kernels: the compiled backward gives NaN
// gradients rather than wrong ones.
TEST(AttentionCompiled, DropoutRefusesALibraryDrawnPair) {
  Case c;
  c.dropout = 0.2;
  v1::CompileRequest req;
  *req.mutable_graph() = CaseGraph(c);
  // Feed the backward a pair with bit 62 of its offset set instead of the
  // forward's.
  v1::Graph& g = *req.mutable_graph();
  v1::Input* pair = g.add_inputs();
  pair->set_name("pair");
  pair->mutable_meta()->set_dtype(v1::INT64);
  pair->mutable_meta()->add_sizes()->set_value(2);
  for (v1::Node& n : *g.mutable_nodes()) {
    if (n.op() == kAttentionDropoutBackward)
      n.mutable_args(n.args_size() - 1)->set_ref("pair");
  }
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  auto artifact = Compile(req);
  ASSERT_TRUE(artifact.ok()) << artifact.status();
  auto exe = CpuExecutable::Load(*artifact);
  ASSERT_TRUE(exe.ok()) << exe.status();
  std::mt19937_64 rng(5);
  std::vector<HostTensor> inputs = CaseInputs(c, c.l, rng);
  HostTensor flagged = HostTensor::Empty(DType::kInt64, {2});
  flagged.SetIntAt(0, 42);
  flagged.SetIntAt(1, (int64_t{1} << 62) | 3);
  inputs.push_back(flagged);
  auto got = (*exe)->Run(inputs);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int o = 2; o < 5; ++o) {
    EXPECT_TRUE(std::isnan((*got)[o].GetDoubleAt(0))) << "output " << o;
  }
  EXPECT_FALSE(std::isnan((*got)[0].GetDoubleAt(0))) << "the forward is whole";
  // The reference agrees.
  auto graph = ImportGraph(req.graph());
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto want = EvaluateReference(*graph, inputs);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_TRUE(std::isnan((*want)[2].GetDoubleAt(0)));
}

// ---- CUDA targets: cuDNN calls ----

v1::Artifact CompileForCuda(const Case& c,
                            const v1::CompileOptions& options = {},
                            const std::string& arch = "sm_90") {
  v1::CompileRequest req;
  *req.mutable_graph() = CaseGraph(c, v1::CUDA);
  req.mutable_target()->mutable_cuda()->set_arch(arch);
  *req.mutable_options() = options;
  auto artifact = Compile(req);
  EXPECT_TRUE(artifact.ok()) << artifact.status();
  return artifact.ok() ? *artifact : v1::Artifact{};
}

std::vector<const v1::Attention*> AttentionCalls(const v1::Artifact& a) {
  std::vector<const v1::Attention*> out;
  for (const v1::Step& s : a.program().steps()) {
    if (!s.has_call() || !s.call().has_attention()) continue;
    EXPECT_EQ(s.call().library(), v1::ExternCall::CUDNN);
    out.push_back(&s.call().attention());
  }
  return out;
}

LaunchLimits CudaLimits() {
  LaunchLimits limits;
  limits.max_block_threads = 1024;
  limits.extern_library = v1::ExternCall::CUBLASLT;
  limits.gemm_dtypes = {{DType::kFloat32, DType::kFloat32},
                        {DType::kFloat16, DType::kFloat32},
                        {DType::kBFloat16, DType::kFloat32}};
  limits.conv_library = v1::ExternCall::CUDNN;
  limits.attention_library = v1::ExternCall::CUDNN;
  limits.attention_dtypes = {DType::kFloat16, DType::kBFloat16};
  limits.attention_bias_grad = true;
  return limits;
}

// float16/bfloat16 attention with head dims up to 128 (256 on sm_90) is one
// cuDNN call per direction over whole contiguous buffers; the strided query
// is copied once; the runtime's checks accept both steps and their sizes evaluate to
// the case's; float32, a head dim the engines do not take, and
// deterministic_algorithms (for the backward) and GPUs before sm_80 keep
// the GEMMs.
TEST(AttentionCuda, HalfPrecisionIsOneCudnnCallPerDirection) {
  Case c;
  c.dtype = DType::kBFloat16;
  c.e = c.ev = 64;
  c.causal = true;
  c.strided_q = true;
  const v1::Artifact a = CompileForCuda(c);
  const std::vector<const v1::Attention*> calls = AttentionCalls(a);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]->direction(), v1::Attention::FORWARD);
  EXPECT_EQ(calls[1]->direction(), v1::Attention::BACKWARD);
  EXPECT_EQ(calls[0]->buffers_size(), 5);
  EXPECT_EQ(calls[1]->buffers_size(), 9);
  EXPECT_TRUE(calls[0]->causal());
  EXPECT_FLOAT_EQ(calls[0]->scale(), 0.5f);
  EXPECT_EQ(calls[0]->dtype(), v1::BFLOAT16);
  EXPECT_EQ(CountCalls(a), 2) << "no GEMM around the calls";
  auto plan = PlanProgram(a, CudaLimits());
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int64_t> elements;
  for (const v1::BufferSpec& b : a.program().buffers())
    elements.push_back(EvaluateSymPoly(b.elements(), {}));
  int seen = 0;
  for (const ProgramPlan::Extern& e : plan->externs) {
    if (e.attention == nullptr) continue;
    ++seen;
    auto dims = EvaluateAttention(*e.attention, {}, elements);
    ASSERT_TRUE(dims.ok()) << dims.status();
    EXPECT_EQ(dims->batch, c.b);
    EXPECT_EQ(dims->heads, c.h);
    EXPECT_EQ(dims->s_q, c.l);
    EXPECT_EQ(dims->s_kv, c.s);
    EXPECT_EQ(dims->d_qk, 64);
  }
  EXPECT_EQ(seen, 2);
  // A runtime without fused attention refuses the steps; the CPU runtime
  // runs its own kernel, not cuDNN.
  LaunchLimits none = CudaLimits();
  none.attention_library = v1::ExternCall::LIBRARY_UNSPECIFIED;
  auto refused = PlanProgram(a, none);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "for fused attention, which this runtime does not run"),
            std::string::npos)
      << refused.status();
  LaunchLimits cpu = CudaLimits();
  cpu.attention_library = v1::ExternCall::KILN_RUNTIME;
  refused = PlanProgram(a, cpu);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(
                "calls cuDNN for fused attention; this runtime calls Kiln's "
                "CPU attention"),
            std::string::npos)
      << refused.status();

  Case biased = c;
  biased.bias = Case::Bias::kPerBatch;
  const v1::Artifact biased_artifact = CompileForCuda(biased);
  const std::vector<const v1::Attention*> with_bias =
      AttentionCalls(biased_artifact);
  ASSERT_EQ(with_bias.size(), 2u);
  for (const v1::Attention* call : with_bias) {
    EXPECT_TRUE(call->bias());
    EXPECT_TRUE(call->bias_batch());
    EXPECT_FALSE(call->bias_heads());
  }
  EXPECT_EQ(with_bias[0]->buffers_size(), 6);
  EXPECT_EQ(with_bias[1]->buffers_size(), 10);

  // Dropout: the (seed, offset) pair, written by a Kiln kernel, is one more
  // read of each call; the runtime's checks accept both steps.
  Case dropped = biased;
  dropped.dropout = 0.1;
  const v1::Artifact d = CompileForCuda(dropped);
  const std::vector<const v1::Attention*> with_dropout = AttentionCalls(d);
  ASSERT_EQ(with_dropout.size(), 2u);
  for (const v1::Attention* call : with_dropout)
    EXPECT_FLOAT_EQ(call->dropout(), 0.1f);
  EXPECT_EQ(with_dropout[0]->buffers_size(), 7);
  EXPECT_EQ(with_dropout[1]->buffers_size(), 11);
  EXPECT_EQ(d.program().buffers(with_dropout[0]->buffers(4)).dtype(),
            v1::INT64);
  EXPECT_EQ(with_dropout[0]->buffers(4), with_dropout[1]->buffers(7))
      << "the backward reads the forward's pair";
  auto dropout_plan = PlanProgram(d, CudaLimits());
  ASSERT_TRUE(dropout_plan.ok()) << dropout_plan.status();
  // The kernel writing the pair runs before the forward's call.
  const int pair = with_dropout[0]->buffers(4);
  int writer = -1, forward_call = -1;
  for (int i = 0; i < d.program().steps_size(); ++i) {
    const v1::Step& s = d.program().steps(i);
    if (s.has_call() && s.call().has_attention() && forward_call < 0)
      forward_call = i;
    if (s.has_launch() && writer < 0) {
      for (int b : s.launch().buffers()) writer = b == pair ? i : writer;
    }
  }
  EXPECT_GE(writer, 0);
  EXPECT_LT(writer, forward_call) << "the pair is written before it is read";
  // Under deterministic_algorithms neither direction draws with cuDNN:
  // the backward keeps the GEMMs, so the forward does too.
  v1::CompileOptions det;
  det.set_deterministic_algorithms(true);
  EXPECT_TRUE(AttentionCalls(CompileForCuda(dropped, det)).empty());
  // With dropout, head dims above 128 are written out (no cuDNN call),
  // where without it sm_90 takes them.
  Case wide_dropped = dropped;
  wide_dropped.e = wide_dropped.ev = 256;
  EXPECT_TRUE(AttentionCalls(CompileForCuda(wide_dropped)).empty());

  Case f32 = c;
  f32.dtype = DType::kFloat32;
  EXPECT_TRUE(AttentionCalls(CompileForCuda(f32)).empty());
  Case odd = c;
  odd.e = odd.ev = 20;
  EXPECT_TRUE(AttentionCalls(CompileForCuda(odd)).empty());
  // Head dims above 128: cuDNN on sm_90 and later takes up to 256; an
  // Ampere target, and anything wider, keep the GEMMs.
  Case wide = c;
  wide.e = wide.ev = 256;
  EXPECT_EQ(AttentionCalls(CompileForCuda(wide)).size(), 2u);
  EXPECT_TRUE(AttentionCalls(CompileForCuda(wide, {}, "sm_80")).empty());
  Case wider = c;
  wider.e = wider.ev = 264;
  EXPECT_TRUE(AttentionCalls(CompileForCuda(wider)).empty());
  // cuDNN's fused engines need sm_80: a Turing target keeps the GEMMs.
  EXPECT_TRUE(AttentionCalls(CompileForCuda(c, {}, "sm_75")).empty());
  v1::CompileOptions deterministic;
  deterministic.set_deterministic_algorithms(true);
  const v1::Artifact fwd_artifact = CompileForCuda(c, deterministic);
  const std::vector<const v1::Attention*> fwd_only =
      AttentionCalls(fwd_artifact);
  ASSERT_EQ(fwd_only.size(), 1u);
  EXPECT_EQ(fwd_only[0]->direction(), v1::Attention::FORWARD);
}

// On CUDA cuDNN's backward gives the bias's gradient (dBias) in the bias's
// batch and heads dims; a bias broadcast over queries ([1, H, 1, S]) sums
// it further in a Kiln kernel. Under deterministic_algorithms the backward
// is written out: GEMMs around the softmax's gradient, with the bias's
// gradient a reduction of it.
TEST(AttentionCuda, BiasGradientFromCudnn) {
  for (Case::Bias bias : kEveryBias) {
    for (bool dropout : {false, true}) {
      Case c;
      c.dtype = DType::kBFloat16;
      c.e = c.ev = 32;
      c.bias = bias;
      c.bias_grad = true;
      c.dropout = dropout ? 0.25 : 0;
      SCOPED_TRACE(c.ToString());
      const v1::Artifact a = CompileForCuda(c);
      const std::vector<const v1::Attention*> calls = AttentionCalls(a);
      ASSERT_EQ(calls.size(), 2u);
      EXPECT_EQ(calls[1]->direction(), v1::Attention::BACKWARD);
      EXPECT_TRUE(calls[1]->bias_grad());
      EXPECT_EQ(calls[1]->bias_batch(),
                bias == Case::Bias::kFull || bias == Case::Bias::kPerBatch);
      EXPECT_TRUE(PlanProgram(a, CudaLimits()).ok());
    }
  }
  Case c;
  c.dtype = DType::kBFloat16;
  c.e = c.ev = 32;
  c.bias = Case::Bias::kPerHead;
  c.bias_grad = true;
  v1::CompileOptions deterministic;
  deterministic.set_deterministic_algorithms(true);
  const v1::Artifact a = CompileForCuda(c, deterministic);
  const std::vector<const v1::Attention*> calls = AttentionCalls(a);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]->direction(), v1::Attention::FORWARD);
  EXPECT_TRUE(PlanProgram(a, CudaLimits()).ok());
}

// Malformed attention steps are refused before anything runs, naming the
// step and the problem.
TEST(AttentionCuda, MalformedStepsAreRefused) {
  Case c;
  c.dtype = DType::kFloat16;
  c.e = c.ev = 32;
  const v1::Artifact good = CompileForCuda(c);
  ASSERT_EQ(AttentionCalls(good).size(), 2u);
  auto first_call = [](v1::Artifact& a) -> v1::Attention* {
    for (v1::Step& s : *a.mutable_program()->mutable_steps()) {
      if (s.has_call() && s.call().has_attention())
        return s.mutable_call()->mutable_attention();
    }
    return nullptr;
  };
  auto refused = [&](const std::function<void(v1::Attention&)>& edit,
                     const std::string& part) {
    v1::Artifact a = good;
    edit(*first_call(a));
    auto plan = PlanProgram(a, CudaLimits());
    ASSERT_FALSE(plan.ok()) << part;
    EXPECT_NE(plan.status().message().find(part), std::string::npos)
        << plan.status();
  };
  refused([](v1::Attention& a) { a.mutable_buffers()->RemoveLast(); },
          "it takes 5");
  refused([](v1::Attention& a) { a.set_dtype(v1::FLOAT32); },
          "(float16, bfloat16 only)");
  refused([](v1::Attention& a) { a.set_buffers(4, a.buffers(0)); },
          "is not of the call's dtype");
  refused([](v1::Attention& a) { a.set_buffers(3, a.buffers(0)); },
          "an input or another tensor");
  refused(
      [](v1::Attention& a) {
        a.set_direction(static_cast<v1::Attention::Direction>(7));
      },
      "unknown direction");
  refused([](v1::Attention& a) { a.set_dropout(1.0f); },
          "has dropout 1 (0 <= dropout < 1 allowed)");
  // The bias's gradient: only from a backward with a bias, and only from
  // a runtime whose attention gives it.
  refused([](v1::Attention& a) { a.set_bias_grad(true); },
          "only a backward with a bias gives");
  {
    v1::Artifact a = good;
    v1::Attention& call = *first_call(a);
    call.set_bias_grad(true);
    call.set_direction(v1::Attention::BACKWARD);
    call.set_bias(true);
    LaunchLimits limits = CudaLimits();
    limits.attention_bias_grad = false;
    auto plan = PlanProgram(a, limits);
    ASSERT_FALSE(plan.ok());
    EXPECT_NE(
        plan.status().message().find("this runtime's attention does not give"),
        std::string::npos)
        << plan.status();
  }
  // A dropout step whose (seed, offset) buffer is missing, or not int64.
  refused([](v1::Attention& a) { a.set_dropout(0.5f); }, "it takes 6");
  refused(
      [](v1::Attention& a) {
        a.set_dropout(0.5f);
        a.mutable_buffers()->Add(a.buffers(4));
        // q k v rng out lse: rng is a float16 buffer here.
        for (int m = 5; m > 3; --m) a.set_buffers(m, a.buffers(m - 1));
        a.set_buffers(3, a.buffers(0));
      },
      "rng");
  // Sizes that the buffers cannot hold fail at run time, before the call.
  v1::Artifact big = good;
  first_call(big)->mutable_s_q()->mutable_terms(0)->set_coeff(1000);
  auto plan = PlanProgram(big, CudaLimits());
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int64_t> elements;
  for (const v1::BufferSpec& b : big.program().buffers())
    elements.push_back(EvaluateSymPoly(b.elements(), {}));
  for (const ProgramPlan::Extern& e : plan->externs) {
    if (e.attention == nullptr) continue;
    auto dims = EvaluateAttention(*e.attention, {}, elements);
    ASSERT_FALSE(dims.ok());
    EXPECT_NE(dims.status().message().find("elements of buffer"),
              std::string::npos)
        << dims.status();
    break;
  }
}

}  // namespace
}  // namespace kiln::testing
