// The convolution cases shared by the CPU op suite
// (tests/unit/ops_conv_test.cc) and the GPU suite (tests/gpu/
// cuda_gpu_test.cc): a convolution's arguments (Conv), the one-node graphs
// of convolution and convolution_backward over them (CaseGraph of
// ForwardCase / BackwardCase), random inputs honouring each input's strides
// (CaseInputs), and the geometries both suites run: odd sizes, stride,
// padding, dilation, groups and depthwise, 1-D and 3-D, 1x1 kernels, batch
// 1 and 0, transposed with output_padding.
#ifndef KILN_TESTS_UNIT_CONV_CASES_H_
#define KILN_TESTS_UNIT_CONV_CASES_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/unit/numerics.h"
#include "tests/unit/ops_test_util.h"

namespace kiln::testing::conv_cases {

inline constexpr const char* kConv = "aten.convolution.default";
inline constexpr const char* kConvBackward =
    "aten.convolution_backward.default";

// stride, padding, dilation, transposed, output_padding, groups.
inline std::vector<v1::Argument> Geometry(std::vector<int64_t> stride,
                                          std::vector<int64_t> padding,
                                          std::vector<int64_t> dilation,
                                          bool transposed,
                                          std::vector<int64_t> output_padding,
                                          int64_t groups) {
  return {Ints(stride),  Ints(padding),        Ints(dilation),
          B(transposed), Ints(output_padding), I(groups)};
}

inline std::vector<v1::Argument> Concat(std::vector<v1::Argument> a,
                                        const std::vector<v1::Argument>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

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

inline int64_t At(const std::vector<int64_t>& v, size_t d) {
  return v.size() == 1 ? v[0] : v[d];
}

inline std::vector<int64_t> OutputSizes(const Conv& c) {
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

inline std::vector<int64_t> InputSizes(const Conv& c) {
  std::vector<int64_t> s{c.n, c.c};
  s.insert(s.end(), c.in.begin(), c.in.end());
  return s;
}

inline std::vector<int64_t> WeightSizes(const Conv& c) {
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

inline std::vector<int64_t> ChannelsLastStrides(const std::vector<int64_t>& s) {
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

inline std::vector<int64_t> ContiguousOf(const std::vector<int64_t>& s) {
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

inline v1::Graph CaseGraph(const TestCase& c) {
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

inline std::vector<HostTensor> CaseInputs(const TestCase& c,
                                          std::mt19937_64& rng) {
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

inline std::vector<v1::Argument> GeometryOf(const Conv& c) {
  return Geometry(c.stride, c.padding, c.dilation, c.transposed,
                  c.output_padding, c.groups);
}

inline GraphInput InputOf(const Conv& c, std::vector<int64_t> sizes,
                          bool layout) {
  GraphInput g{c.dtype, sizes, {}, c.symbolic_batch};
  if (layout && c.channels_last) g.strides = ChannelsLastStrides(sizes);
  return g;
}

inline TestCase ForwardCase(const Conv& c) {
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

inline TestCase BackwardCase(const Conv& c, std::vector<int64_t> mask) {
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
inline TestCase WithBatch(TestCase t, int64_t n) {
  for (GraphInput& in : t.inputs) {
    if (in.symbolic_batch) in.sizes[0] = n;
  }
  return t;
}

// The geometries of the suite: odd sizes, stride, padding, dilation,
// groups and depthwise, 1-D and 3-D, 1x1 kernels, batch 1 and 0.
inline std::vector<Conv> Geometries() {
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

// Transposed convolutions: stride with output_padding, padding, groups,
// dilation (output_padding below the dilation), 1-D, 3-D.
inline std::vector<Conv> TransposedGeometries() {
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

// A random geometry (seeded by `rng`): 1 to 3 spatial dims, transposed one
// time in three, 1 to 3 groups, small odd sizes.
inline Conv RandomConv(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
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
  return c;
}

}  // namespace kiln::testing::conv_cases

#endif  // KILN_TESTS_UNIT_CONV_CASES_H_
