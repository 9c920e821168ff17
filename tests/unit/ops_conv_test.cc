// The convolutions (graph/ops/conv.cc, compiler/ops/conv_*.cc):
// convolution and convolution_backward. Hand-worked values through the
// reference; then compiled CPU programs (GEMM extern calls with im2col,
// col2im, bias and layout kernels around them) against the reference on
// random inputs for every argument: 1-D/2-D/3-D, odd sizes, stride,
// padding, dilation, groups (depthwise included), transposed with
// output_padding, batch 1, an empty batch, non-contiguous inputs, float16
// and bfloat16, a dynamic batch; backward with each output_mask.
#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compiler/compile.h"
#include "compiler/cpu_backend.h"
#include "compiler/reference.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cpu_executable.h"
#include "tests/unit/numerics.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] ::testing::Environment* const kCoverage =
    RegisterCoverage("conv", ConvSuiteOps());

constexpr const char* kConv = "aten.convolution.default";
constexpr const char* kConvBackward = "aten.convolution_backward.default";

// stride, padding, dilation, transposed, output_padding, groups.
std::vector<v1::Argument> Geometry(std::vector<int64_t> stride,
                                   std::vector<int64_t> padding,
                                   std::vector<int64_t> dilation,
                                   bool transposed,
                                   std::vector<int64_t> output_padding,
                                   int64_t groups) {
  return {Ints(stride),  Ints(padding),        Ints(dilation),
          B(transposed), Ints(output_padding), I(groups)};
}

std::vector<v1::Argument> Concat(std::vector<v1::Argument> a,
                                 const std::vector<v1::Argument>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- reference semantics, by hand ----

TEST(Conv, HandWorkedForward) {
  const HostTensor x = F32({1, 1, 5}, {1, 2, 3, 4, 5});
  const HostTensor w = F32({1, 1, 3}, {1, 0, -1});
  // y[p] = x[p] - x[p + 2].
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 1)),
      kF32, {1, 1, 3}, {-2, -2, -2});
  // Padding 1: zeros at both ends.
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {1}, {1}, false, {0}, 1)),
      kF32, {1, 1, 5}, {-2, -2, -2, -2, 4});
  // Stride 2 keeps positions 0, 2, 4 of that.
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({2}, {1}, {1}, false, {0}, 1)),
      kF32, {1, 1, 3}, {-2, -2, 4});
  // Dilation 2: y[p] = x[p] - x[p + 4].
  CheckOp(
      kConv, {x, w},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {2}, false, {0}, 1)),
      kF32, {1, 1, 1}, {-4});
  // Two groups of one channel, 1x1 kernels, a bias per output channel;
  // one int for all spatial dims.
  CheckOp(kConv,
          {F32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}),
           F32({2, 1, 1, 1}, {2, 3}), F32({2}, {10, 20})},
          Concat({In(0), In(1), In(2)}, Geometry({1}, {0}, {1}, false, {0}, 2)),
          kF32, {1, 2, 2, 2}, {12, 14, 16, 18, 35, 38, 41, 44});
  // Transposed, stride 2, output_padding 1: each input spreads over three
  // outputs, two apart; size (2 - 1) * 2 + 2 + 1 + 1 = 6.
  CheckOp(
      kConv, {F32({1, 1, 2}, {1, 2}), F32({1, 1, 3}, {1, 1, 1})},
      Concat({In(0), In(1), NoneArg()}, Geometry({2}, {0}, {1}, true, {1}, 1)),
      kF32, {1, 1, 6}, {1, 1, 3, 2, 2, 0});
  // bfloat16 rounds the result once: 1.5 * 1.5 * 3 = 6.75 is exact.
  CheckOp(
      kConv,
      {BF16({1, 1, 3}, {1.5, 1.5, 1.5}), BF16({1, 1, 3}, {1.5, 1.5, 1.5})},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 1)),
      kBF16, {1, 1, 1}, {6.75}, 0);
}

TEST(Conv, HandWorkedBackward) {
  // y[p] = x[p] - x[p + 1] over x = [1, 2, 3], grad_output [1, 10]:
  // grad_input [1, -1 + 10, -10], grad_weight [1*1 + 10*2, 1*2 + 10*3],
  // grad_bias 11.
  const std::vector<HostTensor> in{F32({1, 1, 2}, {1, 10}),
                                   F32({1, 1, 3}, {1, 2, 3}),
                                   F32({1, 1, 2}, {1, -1})};
  auto args = [](std::vector<int64_t> mask) {
    return Concat(Concat({In(0), In(1), In(2), Ints({1})},
                         Geometry({1}, {0}, {1}, false, {0}, 1)),
                  {Ints(mask)});
  };
  auto r = RunTracked(kConvBackward, in, args({1, 1, 1}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 3}, {1, 9, -10});
  ExpectOutput(*r, 1, kF32, {1, 1, 2}, {21, 32});
  ExpectOutput(*r, 2, kF32, {1}, {11});
  // Outputs the mask turns off are zeros.
  r = RunTracked(kConvBackward, in, args({0, 1, 0}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 3}, {0, 0, 0});
  ExpectOutput(*r, 1, kF32, {1, 1, 2}, {21, 32});
  ExpectOutput(*r, 2, kF32, {1}, {0});
  // Without a bias PyTorch passes bias_sizes [0] and no grad_bias.
  r = RunTracked(kConvBackward, in,
                 Concat(Concat({In(0), In(1), In(2), Ints({0})},
                               Geometry({1}, {0}, {1}, false, {0}, 1)),
                        {Ints({1, 1, 0})}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 1, kF32, {1, 1, 2}, {21, 32});
  ExpectOutput(*r, 2, kF32, {0}, {});
  // Transposed: y = [1, 1, 3, 2, 2, 0] above from x = [1, 2]; with
  // grad_output [1, 2, 3, 4, 5, 6]: grad_input[i] = sum_k go[2i + k]
  // = [6, 12], grad_weight[k] = go[k] + 2 go[2 + k] = [7, 10, 13].
  r = RunTracked(kConvBackward,
                 {F32({1, 1, 6}, {1, 2, 3, 4, 5, 6}), F32({1, 1, 2}, {1, 2}),
                  F32({1, 1, 3}, {1, 1, 1})},
                 Concat(Concat({In(0), In(1), In(2), NoneArg()},
                               Geometry({2}, {0}, {1}, true, {1}, 1)),
                        {Ints({1, 1, 1})}));
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectOutput(*r, 0, kF32, {1, 1, 2}, {6, 12});
  ExpectOutput(*r, 1, kF32, {1, 1, 3}, {7, 10, 13});
  ExpectOutput(*r, 2, kF32, {1}, {21});
}

TEST(Conv, InvalidArguments) {
  const std::vector<v1::Argument> plain =
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 1));
  ExpectInvalid(kConv, {F32({1, 3, 5}, {}), F32({2, 2, 3}, {})}, plain,
                {"node 0", kConv, "expect input[1] = 2"});
  ExpectInvalid(kConv, {F32({3, 5}, {}), F32({2, 3, 3}, {})}, plain,
                {"(batched) input"});
  ExpectInvalid(kConv, {F32({1, 1, 2}, {}), F32({1, 1, 3}, {})}, plain,
                {"smaller than the dilated kernel"});
  ExpectInvalid(kConv, {F32({1, 1, 5}, {}), F16({1, 1, 3}, {})}, plain,
                {"one dtype", "float32", "float16"});
  ExpectInvalid(kConv, {I64({1, 1, 5}, {}), I64({1, 1, 3}, {})}, plain,
                {"floating dtypes only"});
  ExpectInvalid(kConv, {F32({1, 1, 5}, {}), F32({1, 1, 3}, {})},
                Concat({In(0), In(1), NoneArg()},
                       Geometry({1, 1}, {0}, {1}, false, {0}, 1)),
                {"stride must have one entry or 1"});
  ExpectInvalid(
      kConv, {F32({1, 1, 5}, {}), F32({1, 1, 3}, {})},
      Concat({In(0), In(1), NoneArg()}, Geometry({2}, {0}, {1}, true, {2}, 1)),
      {"output_padding must be smaller"});
  ExpectInvalid(
      kConv, {F32({1, 4, 5}, {}), F32({3, 2, 3}, {})},
      Concat({In(0), In(1), NoneArg()}, Geometry({1}, {0}, {1}, false, {0}, 2)),
      {"divisible by 2"});
  ExpectInvalid(
      kConv, {F32({1, 1, 5}, {}), F32({2, 1, 3}, {}), F32({3}, {})},
      Concat({In(0), In(1), In(2)}, Geometry({1}, {0}, {1}, false, {0}, 1)),
      {"bias must have shape [2]"});
  ExpectInvalid(kConvBackward,
                {F32({1, 1, 4}, {}), F32({1, 1, 5}, {}), F32({1, 1, 3}, {})},
                Concat(Concat({In(0), In(1), In(2), NoneArg()},
                              Geometry({1}, {0}, {1}, false, {0}, 1)),
                       {Ints({1, 1, 1})}),
                {"grad_output must have the convolution's output shape"});
}

// ---- compiled against the reference ----

// A convolution's arguments for the compiled tests.
struct Conv {
  int64_t n = 2, c = 3, o = 4;
  std::vector<int64_t> in{7, 6}, kernel{3, 3};
  std::vector<int64_t> stride{1}, padding{0}, dilation{1}, output_padding{0};
  bool transposed = false;
  int64_t groups = 1;
  bool bias = false;
  DType dtype = DType::kFloat32;
  bool channels_last = false;  // the input's storage as [N, *S, C]
  bool symbolic_batch = false;
  std::string ToString() const {
    return absl::StrCat(
        "n", n, " c", c, " o", o, " in[", absl::StrJoin(in, ","), "] k[",
        absl::StrJoin(kernel, ","), "] s", absl::StrJoin(stride, ","), " p",
        absl::StrJoin(padding, ","), " d", absl::StrJoin(dilation, ","), " op",
        absl::StrJoin(output_padding, ","), " t", transposed, " g", groups,
        " bias", bias, " ", DTypeName(dtype),
        channels_last ? " channels_last" : "",
        symbolic_batch ? " dynamic" : "");
  }
};

int64_t At(const std::vector<int64_t>& v, size_t d) {
  return v.size() == 1 ? v[0] : v[d];
}

std::vector<int64_t> OutputSizes(const Conv& c) {
  std::vector<int64_t> out{c.n, c.o};
  for (size_t d = 0; d < c.in.size(); ++d) {
    const int64_t s = At(c.stride, d), p = At(c.padding, d);
    const int64_t span = At(c.dilation, d) * (c.kernel[d] - 1);
    out.push_back(c.transposed ? (c.in[d] - 1) * s - 2 * p + span +
                                     At(c.output_padding, d) + 1
                               : (c.in[d] + 2 * p - span - 1) / s + 1);
  }
  return out;
}

std::vector<int64_t> InputSizes(const Conv& c) {
  std::vector<int64_t> s{c.n, c.c};
  s.insert(s.end(), c.in.begin(), c.in.end());
  return s;
}

std::vector<int64_t> WeightSizes(const Conv& c) {
  std::vector<int64_t> s = c.transposed
                               ? std::vector<int64_t>{c.c, c.o / c.groups}
                               : std::vector<int64_t>{c.o, c.c / c.groups};
  s.insert(s.end(), c.kernel.begin(), c.kernel.end());
  return s;
}

// A graph input: its storage strides (empty: contiguous) and whether its
// batch is the symbol "n".
struct GraphInput {
  DType dtype;
  std::vector<int64_t> sizes, strides;
  bool symbolic_batch = false;
};

std::vector<int64_t> ChannelsLastStrides(const std::vector<int64_t>& s) {
  // Storage [N, *S, C].
  std::vector<int64_t> st(s.size());
  int64_t step = s[1];
  st[1] = 1;
  for (size_t d = s.size(); d-- > 2;) {
    st[d] = step;
    step *= s[d];
  }
  st[0] = step;
  return st;
}

std::vector<int64_t> ContiguousOf(const std::vector<int64_t>& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;)
    st[d - 1] = st[d] * std::max<int64_t>(s[d], 1);
  return st;
}

struct TestCase {
  std::string op;
  std::vector<GraphInput> inputs;
  std::vector<v1::Argument> extra;
  int outputs = 1;
};

v1::Graph CaseGraph(const TestCase& c) {
  v1::Graph g;
  bool symbolic = false;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const GraphInput& t = c.inputs[i];
    v1::Input* in = g.add_inputs();
    in->set_name(absl::StrCat("x", i));
    v1::TensorMeta* m = in->mutable_meta();
    m->set_dtype(static_cast<v1::DType>(t.dtype));
    m->set_device(v1::CPU);
    for (size_t d = 0; d < t.sizes.size(); ++d) {
      if (d == 0 && t.symbolic_batch) {
        m->add_sizes()->set_symbol("n");
        symbolic = true;
      } else {
        m->add_sizes()->set_value(t.sizes[d]);
      }
    }
    if (!t.symbolic_batch) {
      for (int64_t s : t.strides) m->add_strides()->set_value(s);
    }
  }
  if (symbolic) g.add_symbols()->set_name("n");
  v1::Node* node = g.add_nodes();
  node->set_op(c.op);
  for (size_t i = 0; i < c.inputs.size(); ++i)
    node->add_args()->set_ref(absl::StrCat("x", i));
  for (const v1::Argument& a : c.extra) *node->add_args() = a;
  for (int o = 0; o < c.outputs; ++o) {
    node->add_outputs(absl::StrCat("y", o));
    g.add_outputs(absl::StrCat("y", o));
  }
  return g;
}

std::vector<HostTensor> CaseInputs(const TestCase& c, std::mt19937_64& rng) {
  std::vector<HostTensor> out;
  for (const GraphInput& t : c.inputs) {
    const std::vector<int64_t> strides =
        t.strides.empty() ? ContiguousOf(t.sizes) : t.strides;
    int64_t extent = 1;
    for (size_t d = 0; d < t.sizes.size(); ++d)
      extent += (t.sizes[d] - 1) * strides[d];
    HostTensor x = HostTensor::Strided(t.dtype, t.sizes, strides, 0,
                                       std::max<int64_t>(extent, 1));
    FillRandom(x, rng);
    out.push_back(std::move(x));
  }
  return out;
}

std::vector<v1::Argument> GeometryOf(const Conv& c) {
  return Geometry(c.stride, c.padding, c.dilation, c.transposed,
                  c.output_padding, c.groups);
}

GraphInput InputOf(const Conv& c, std::vector<int64_t> sizes, bool layout) {
  GraphInput g{c.dtype, sizes, {}, c.symbolic_batch};
  if (layout && c.channels_last) g.strides = ChannelsLastStrides(sizes);
  return g;
}

TestCase ForwardCase(const Conv& c) {
  TestCase t{kConv,
             {InputOf(c, InputSizes(c), true),
              GraphInput{c.dtype, WeightSizes(c), {}, false}},
             {},
             1};
  if (c.bias) t.inputs.push_back(GraphInput{c.dtype, {c.o}, {}, false});
  // The bias (when there is one) is the third input reference.
  if (!c.bias) t.extra.push_back(NoneArg());
  for (const v1::Argument& a : GeometryOf(c)) t.extra.push_back(a);
  return t;
}

TestCase BackwardCase(const Conv& c, std::vector<int64_t> mask) {
  TestCase t{kConvBackward,
             {InputOf(c, OutputSizes(c), true), InputOf(c, InputSizes(c), true),
              GraphInput{c.dtype, WeightSizes(c), {}, false}},
             {},
             3};
  // As PyTorch: bias_sizes [0] without a bias (its mask bit then 0).
  if (!c.bias) mask[2] = 0;
  t.extra.push_back(Ints({c.bias ? c.o : 0}));
  for (const v1::Argument& a : GeometryOf(c)) t.extra.push_back(a);
  t.extra.push_back(Ints(std::move(mask)));
  return t;
}

// The case's inputs with the symbolic batch bound to `n`.
TestCase WithBatch(TestCase t, int64_t n) {
  for (GraphInput& in : t.inputs) {
    if (in.symbolic_batch) in.sizes[0] = n;
  }
  return t;
}

// Compiles the case for this CPU, runs it (for each batch in `batches`
// when the batch is symbolic) and compares every output with the
// reference; returns the artifact.
v1::Artifact CheckCompiled(const TestCase& c,
                           std::vector<int64_t> batches = {}) {
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
  if (batches.empty()) batches.push_back(-1);
  for (int64_t n : batches) {
    SCOPED_TRACE(absl::StrCat("batch ", n));
    std::mt19937_64 rng(7 + n);
    const std::vector<HostTensor> inputs =
        CaseInputs(n < 0 ? c : WithBatch(c, n), rng);
    auto want = EvaluateReference(*graph, inputs);
    EXPECT_TRUE(want.ok()) << want.status();
    auto got = (*exe)->Run(inputs);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!want.ok() || !got.ok()) return *artifact;
    for (int o = 0; o < c.outputs; ++o) {
      const std::string diff = Compare((*got)[o], (*want)[o]);
      EXPECT_TRUE(diff.empty()) << "output " << o << ": " << diff;
    }
  }
  ExercisedOps().insert(c.op);
  return *artifact;
}

int CountCalls(const v1::Artifact& a) {
  int n = 0;
  for (const v1::Step& s : a.program().steps()) n += s.has_call();
  return n;
}

// Forward and backward (all outputs) of `c`.
void CheckBoth(const Conv& c) {
  SCOPED_TRACE(c.ToString());
  CheckCompiled(ForwardCase(c));
  CheckCompiled(BackwardCase(c, {1, 1, 1}));
}

// The geometries of the suite: odd sizes, stride, padding, dilation,
// groups and depthwise, 1-D and 3-D, 1x1 kernels, batch 1 and 0.
std::vector<Conv> Geometries() {
  std::vector<Conv> v;
  Conv c;
  v.push_back(c);  // 3x3, no padding
  c.padding = {1};
  c.bias = true;
  v.push_back(c);  // ResNet's 3x3
  c = Conv{};
  c.stride = {2};
  c.padding = {1};
  c.in = {9, 8};
  v.push_back(c);  // stride 2
  c = Conv{};
  c.kernel = {3, 2};
  c.stride = {2, 1};
  c.padding = {2, 1};
  c.dilation = {2, 3};
  c.in = {11, 9};
  c.bias = true;
  v.push_back(c);  // asymmetric everything
  c = Conv{};
  c.c = 4;
  c.o = 6;
  c.groups = 2;
  c.padding = {1};
  v.push_back(c);  // groups
  c = Conv{};
  c.c = 3;
  c.o = 6;
  c.groups = 3;
  c.padding = {1};
  c.stride = {2};
  v.push_back(c);  // depthwise, multiplier 2
  c = Conv{};
  c.kernel = {1, 1};
  c.n = 1;
  v.push_back(c);  // 1x1, one image
  c.n = 3;
  c.bias = true;
  v.push_back(c);  // 1x1, a batch
  c = Conv{};
  c.in = {11};
  c.kernel = {4};
  c.stride = {3};
  c.padding = {2};
  v.push_back(c);  // 1-D
  c = Conv{};
  c.n = 1;
  c.c = 2;
  c.o = 4;
  c.groups = 2;
  c.in = {4, 5, 3};
  c.kernel = {2, 3, 2};
  c.stride = {1, 2, 1};
  c.padding = {1, 0, 1};
  c.bias = true;
  v.push_back(c);  // 3-D, grouped
  c = Conv{};
  c.n = 0;
  c.padding = {1};
  c.bias = true;
  v.push_back(c);  // empty batch
  return v;
}

TEST(ConvCompiled, Forward) {
  for (const Conv& c : Geometries()) {
    SCOPED_TRACE(c.ToString());
    const v1::Artifact a = CheckCompiled(ForwardCase(c));
    EXPECT_EQ(CountCalls(a), 1);
  }
}

TEST(ConvCompiled, Backward) {
  for (const Conv& c : Geometries()) {
    SCOPED_TRACE(c.ToString());
    const v1::Artifact a = CheckCompiled(BackwardCase(c, {1, 1, 1}));
    EXPECT_EQ(CountCalls(a), 2) << "grad_input and grad_weight";
  }
}

// Transposed convolutions: stride with output_padding, padding, groups,
// dilation (output_padding below the dilation), 1-D, 3-D.
std::vector<Conv> TransposedGeometries() {
  std::vector<Conv> v;
  Conv c;
  c.transposed = true;
  c.in = {3, 4};
  c.c = 4;
  c.o = 3;
  c.stride = {2};
  c.padding = {1};
  c.output_padding = {1};
  c.bias = true;
  v.push_back(c);
  c.groups = 2;
  c.o = 4;
  c.kernel = {2, 3};
  c.output_padding = {1, 0};
  c.bias = false;
  v.push_back(c);
  c = Conv{};
  c.transposed = true;
  c.in = {5};
  c.kernel = {3};
  c.dilation = {2};
  c.output_padding = {1};
  v.push_back(c);
  c = Conv{};
  c.transposed = true;
  c.n = 1;
  c.c = 2;
  c.o = 2;
  c.in = {2, 3, 2};
  c.kernel = {2, 2, 3};
  c.stride = {2, 1, 3};
  c.padding = {0, 1, 1};
  c.bias = true;
  v.push_back(c);
  return v;
}

TEST(ConvCompiled, Transposed) {
  for (const Conv& c : TransposedGeometries()) CheckBoth(c);
}

TEST(ConvCompiled, OutputMask) {
  Conv c;
  c.padding = {1};
  c.stride = {2};
  c.bias = true;
  for (bool transposed : {false, true}) {
    c.transposed = transposed;
    c.output_padding = {transposed ? 1 : 0};
    for (const std::vector<int64_t>& mask : std::vector<std::vector<int64_t>>{
             {1, 0, 0}, {0, 1, 0}, {0, 1, 1}, {0, 0, 1}}) {
      SCOPED_TRACE(
          absl::StrCat(c.ToString(), " mask ", absl::StrJoin(mask, ",")));
      const v1::Artifact a = CheckCompiled(BackwardCase(c, mask));
      EXPECT_EQ(CountCalls(a), mask[0] + mask[1]);
    }
  }
}

TEST(ConvCompiled, NonContiguousInputs) {
  Conv c;
  c.channels_last = true;
  c.padding = {1};
  CheckBoth(c);
  c.kernel = {1, 1};
  c.padding = {0};
  CheckBoth(c);
  c.transposed = true;
  c.kernel = {2, 2};
  c.stride = {2};
  CheckBoth(c);
}

TEST(ConvCompiled, ReducedPrecision) {
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    Conv c;
    c.dtype = d;
    c.padding = {1};
    c.bias = true;
    CheckBoth(c);
    c.transposed = true;
    c.stride = {2};
    c.output_padding = {1};
    CheckBoth(c);
  }
}

TEST(ConvCompiled, DynamicBatch) {
  Conv c;
  c.symbolic_batch = true;
  c.padding = {1};
  c.bias = true;
  for (bool transposed : {false, true}) {
    c.transposed = transposed;
    SCOPED_TRACE(c.ToString());
    CheckCompiled(ForwardCase(c), {2, 5});
    CheckCompiled(BackwardCase(c, {1, 1, 1}), {2, 3});
  }
}

// Random geometries against the reference (seeded, bounded).
TEST(ConvCompiled, RandomGeometries) {
  std::mt19937_64 rng(16);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int i = 0; i < 12; ++i) {
    Conv c;
    const int dims = static_cast<int>(pick(1, 3));
    c.transposed = pick(0, 2) == 0;
    c.groups = pick(1, 3);
    c.n = pick(1, 3);
    c.c = c.groups * pick(1, 3);
    c.o = c.groups * pick(1, 3);
    c.bias = pick(0, 1);
    c.in.clear();
    c.kernel.clear();
    c.stride.clear();
    c.padding.clear();
    c.dilation.clear();
    c.output_padding.clear();
    for (int d = 0; d < dims; ++d) {
      c.kernel.push_back(pick(1, dims == 3 ? 2 : 3));
      c.stride.push_back(pick(1, 2));
      c.dilation.push_back(pick(1, 2));
      c.padding.push_back(pick(0, 1));
      c.in.push_back(pick(c.dilation[d] * (c.kernel[d] - 1) + 1, 7 - dims));
      c.output_padding.push_back(
          c.transposed ? pick(0, std::max(c.stride[d], c.dilation[d]) - 1) : 0);
    }
    CheckBoth(c);
  }
}

}  // namespace
}  // namespace kiln::testing
