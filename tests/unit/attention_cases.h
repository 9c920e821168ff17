// Attention test cases shared by the CPU suite (ops_attention_test.cc) and
// the GPU suite (tests/gpu/cuda_attention_gpu_test.cc): one graph that runs
// kiln.attention and feeds its out and lse to kiln.attention_backward, its
// seeded random inputs, and the error measure for gradients.
#ifndef KILN_TESTS_UNIT_ATTENTION_CASES_H_
#define KILN_TESTS_UNIT_ATTENTION_CASES_H_

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/host_tensor.h"
#include "kiln/v1/graph.pb.h"
#include "tests/unit/numerics.h"

namespace kiln::testing::attention_cases {

inline constexpr char kAttention[] = "kiln.attention.default";
inline constexpr char kAttentionBackward[] = "kiln.attention_backward.default";
inline constexpr char kAttentionDropout[] = "kiln.attention_dropout.default";
inline constexpr char kAttentionDropoutBackward[] =
    "kiln.attention_dropout_backward.default";
inline constexpr char kAttentionBackwardDbias[] =
    "kiln.attention_backward_dbias.default";
inline constexpr char kAttentionDropoutBackwardDbias[] =
    "kiln.attention_dropout_backward_dbias.default";

struct Case {
  int64_t b = 2, h = 3, l = 5, s = 7, e = 4, ev = 6;
  DType dtype = DType::kFloat32;
  bool causal = false;
  double scale = 0.5;
  bool strided_q = false;  // q as a [B, L, H, E] tensor's head transpose
  bool symbolic_l = false;
  // An additive bias (input x4): none, [B, 1, L, S] (a padding or causal
  // mask as transformers builds it), [1, H, 1, S] (broadcast rows),
  // [B, H, L, S], [1, H, L, S] (a learned position bias: Swin, T5) or
  // [1, 1, L, S].
  enum class Bias {
    kNone,
    kPerBatch,
    kPerHeadRow,
    kFull,
    kPerHead,
    kShared
  } bias = Bias::kNone;
  // With a bias: the backward is the _dbias op, and grad_bias the graph's
  // sixth output (before rng).
  bool bias_grad = false;
  // > 0: attention_dropout and its backward, the seed the last input (an
  // int64 0-dim tensor), offset 3, and rng the graph's sixth output.
  double dropout = 0;
  std::vector<int64_t> BiasSizes(int64_t length) const {
    switch (bias) {
      case Bias::kPerBatch:
        return {b, 1, length, s};
      case Bias::kPerHeadRow:
        return {1, h, 1, s};
      case Bias::kFull:
        return {b, h, length, s};
      case Bias::kPerHead:
        return {1, h, length, s};
      default:
        return {1, 1, length, s};
    }
  }
  // Whether the bias's query dim is the query length (symbolic with
  // symbolic_l).
  bool BiasHasQueries() const {
    return bias != Bias::kNone && bias != Bias::kPerHeadRow;
  }
  std::string ToString() const {
    return absl::StrCat(DTypeName(dtype), causal ? " causal " : " ", b, "x", h,
                        "x", l, "x", s, "x", e, "x", ev,
                        strided_q ? " strided q" : "",
                        symbolic_l ? " dynamic L" : "",
                        bias == Bias::kPerBatch     ? " bias [B,1,L,S]"
                        : bias == Bias::kPerHeadRow ? " bias [1,H,1,S]"
                        : bias == Bias::kFull       ? " bias [B,H,L,S]"
                        : bias == Bias::kPerHead    ? " bias [1,H,L,S]"
                        : bias == Bias::kShared     ? " bias [1,1,L,S]"
                                                    : "",
                        bias_grad ? " with its gradient" : "",
                        dropout > 0 ? absl::StrCat(" dropout ", dropout) : "");
  }
};

// Every bias shape a case takes.
inline constexpr Case::Bias kEveryBias[] = {
    Case::Bias::kFull, Case::Bias::kPerHead, Case::Bias::kPerBatch,
    Case::Bias::kShared, Case::Bias::kPerHeadRow};

// q, k, v, grad_out[, bias][, seed] -> attention -> backward: outputs
// out, lse, grad_q, grad_k, grad_v[, grad_bias][, rng].
inline v1::Graph CaseGraph(const Case& c, v1::DeviceType device = v1::CPU) {
  v1::Graph g;
  if (c.symbolic_l) g.add_symbols()->set_name("L");
  std::vector<std::vector<int64_t>> sizes = {{c.b, c.h, c.l, c.e},
                                             {c.b, c.h, c.s, c.e},
                                             {c.b, c.h, c.s, c.ev},
                                             {c.b, c.h, c.l, c.ev}};
  if (c.bias != Case::Bias::kNone) sizes.push_back(c.BiasSizes(c.l));
  const int bias_length_dim = c.BiasHasQueries() ? 2 : -1;  // x4's L
  for (int i = 0; i < static_cast<int>(sizes.size()); ++i) {
    v1::Input* in = g.add_inputs();
    in->set_name(absl::StrCat("x", i));
    v1::TensorMeta* m = in->mutable_meta();
    m->set_dtype(static_cast<v1::DType>(c.dtype));
    m->set_device(device);
    for (int d = 0; d < 4; ++d) {
      const bool query_length =
          ((i == 0 || i == 3) && d == 2) || (i == 4 && d == bias_length_dim);
      if (query_length && c.symbolic_l) {
        m->add_sizes()->set_symbol("L");
      } else {
        m->add_sizes()->set_value(sizes[i][d]);
      }
    }
    if (i == 0 && c.strided_q && !c.symbolic_l) {
      // Storage [B, L, H, E].
      for (int64_t st : {c.l * c.h * c.e, c.e, c.h * c.e, int64_t{1}})
        m->add_strides()->set_value(st);
    }
  }
  const bool dropout = c.dropout > 0;
  if (dropout) {
    v1::Input* seed = g.add_inputs();
    seed->set_name("seed");
    seed->mutable_meta()->set_dtype(v1::INT64);
    seed->mutable_meta()->set_device(device);
  }
  v1::Node* fwd = g.add_nodes();
  fwd->set_op(dropout ? kAttentionDropout : kAttention);
  for (int i = 0; i < 3; ++i) fwd->add_args()->set_ref(absl::StrCat("x", i));
  auto bias_arg = [&](v1::Node* n) {
    if (c.bias == Case::Bias::kNone) {
      n->add_args()->mutable_none();
    } else {
      n->add_args()->set_ref("x4");
    }
  };
  bias_arg(fwd);
  fwd->add_args()->set_b(c.causal);
  fwd->add_args()->set_f(c.scale);
  fwd->add_outputs("out");
  fwd->add_outputs("lse");
  if (dropout) {
    fwd->add_args()->set_f(c.dropout);
    v1::Argument* seed = fwd->add_args();
    seed->set_name("seed");
    seed->set_ref("seed");
    v1::Argument* offset = fwd->add_args();
    offset->set_name("offset");
    offset->set_i(3);
    fwd->add_outputs("rng");
  }
  v1::Node* bwd = g.add_nodes();
  if (c.bias_grad) {
    bwd->set_op(dropout ? kAttentionDropoutBackwardDbias
                        : kAttentionBackwardDbias);
  } else {
    bwd->set_op(dropout ? kAttentionDropoutBackward : kAttentionBackward);
  }
  for (const char* ref : {"x3", "x0", "x1", "x2"})
    bwd->add_args()->set_ref(ref);
  bias_arg(bwd);
  for (const char* ref : {"out", "lse"}) bwd->add_args()->set_ref(ref);
  bwd->add_args()->set_b(c.causal);
  bwd->add_args()->set_f(c.scale);
  if (dropout) {
    bwd->add_args()->set_f(c.dropout);
    bwd->add_args()->set_ref("rng");
  }
  for (const char* out : {"grad_q", "grad_k", "grad_v"}) bwd->add_outputs(out);
  if (c.bias_grad) bwd->add_outputs("grad_bias");
  for (const char* out : {"out", "lse", "grad_q", "grad_k", "grad_v"})
    g.add_outputs(out);
  if (c.bias_grad) g.add_outputs("grad_bias");
  if (dropout) g.add_outputs("rng");
  return g;
}

inline std::vector<HostTensor> CaseInputs(const Case& c, int64_t l,
                                          std::mt19937_64& rng) {
  std::vector<HostTensor> in;
  std::vector<std::vector<int64_t>> sizes = {{c.b, c.h, l, c.e},
                                             {c.b, c.h, c.s, c.e},
                                             {c.b, c.h, c.s, c.ev},
                                             {c.b, c.h, l, c.ev}};
  if (c.bias != Case::Bias::kNone) sizes.push_back(c.BiasSizes(l));
  for (int i = 0; i < static_cast<int>(sizes.size()); ++i) {
    HostTensor t = HostTensor::Empty(c.dtype, sizes[i]);
    if (i == 0 && c.strided_q && !c.symbolic_l) {
      HostTensor storage = HostTensor::Empty(c.dtype, {c.b, l, c.h, c.e});
      t = HostTensor::View(storage, sizes[i],
                           {l * c.h * c.e, c.e, c.h * c.e, 1}, 0);
    }
    FillRandom(t, rng);
    in.push_back(std::move(t));
  }
  if (c.dropout > 0) {
    HostTensor seed = HostTensor::Empty(DType::kInt64, {});
    seed.SetIntAt(0, static_cast<int64_t>(rng() >> 1));
    in.push_back(std::move(seed));
  }
  return in;
}

// max |got - want| / max |want|.
inline double RelativeToLargest(const HostTensor& got, const HostTensor& want) {
  double err = 0, largest = 1e-6;
  for (int64_t i = 0; i < want.numel(); ++i) {
    err = std::max(err, std::abs(got.GetDoubleAt(i) - want.GetDoubleAt(i)));
    largest = std::max(largest, std::abs(want.GetDoubleAt(i)));
  }
  return err / largest;
}

}  // namespace kiln::testing::attention_cases

#endif  // KILN_TESTS_UNIT_ATTENTION_CASES_H_
