// Signatures of Kiln's fused attention (issue 16): the ops the Python
// backend's kiln::attention custom op and its backward become in an
// AOTAutograd graph (python/kiln/attention.py), with the semantics of
// runtime/cuda_attention.h:
//
//   kiln.attention(q, k, v, attn_bias?, is_causal, scale) -> (out, lse)
//     q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev], one floating dtype;
//     out [B, H, L, Ev] = softmax(scale * q @ k^T + attn_bias, masked) @ v
//     in that dtype, lse [B, H, L] = the rows' logsumexp in float32;
//     attn_bias (of the same dtype, 4-D, each dim 1 or the scores') is
//     added to the scaled scores (a float attention mask); is_causal masks
//     key j > query i (PyTorch's top-left triangle).
//   kiln.attention_backward(grad_out, q, k, v, attn_bias?, out, lse,
//     is_causal, scale) -> (grad_q, grad_k, grad_v), shaped as q, k, v
//     (the bias gets no gradient).
//   kiln.attention_backward_dbias(grad_out, q, k, v, attn_bias, out, lse,
//     is_causal, scale) -> (grad_q, grad_k, grad_v, grad_bias): the same
//     with the bias (required) and its gradient, shaped and typed as the
//     bias: the scores' gradient p * (dp - rowsum(grad_out * out)) summed
//     over the dims where the bias broadcasts (a learned position bias,
//     an attn_mask that needs a gradient).
//   kiln.attention_dropout(q, k, v, attn_bias?, is_causal, scale, dropout_p,
//     *, seed, offset) -> (out, lse, rng): the same with dropout on the
//     probabilities: out = (softmax(...) * keep / (1 - dropout_p)) @ v,
//     keep ~ Bernoulli(1 - dropout_p) per score element; lse is the
//     undropped softmax's; rng, int64 [2], is (seed, offset) for the
//     backward. A random op (graph/ops/random.h: Kiln's seed and offset
//     keywords); the keep mask is drawn by the device's attention library
//     where one computes the call (cuDNN), else from Philox as
//     native_dropout draws (compiler/ops/attention_lowering.cc).
//   kiln.attention_dropout_backward(grad_out, q, k, v, attn_bias?, out, lse,
//     is_causal, scale, dropout_p, rng) -> (grad_q, grad_k, grad_v): its
//     gradient, the keep mask drawn again from rng.
//   kiln.attention_dropout_backward_dbias(...the same...) -> (grad_q,
//     grad_k, grad_v, grad_bias): with the bias's gradient, as
//     attention_backward_dbias gives it (dp dropped).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/ops/random.h"
#include "graph/ops/signature_util.h"

namespace kiln::ops {
namespace {

// The inputs' one floating dtype (float32, float16, bfloat16).
absl::StatusOr<DType> AttentionDType(const OpContext& ctx,
                                     const std::vector<int>& args) {
  const DType d = ctx.type(args[0]).dtype;
  for (int a : args) {
    if (ctx.type(a).dtype != d) {
      return ctx.Invalid(
          absl::StrCat("attention takes tensors of one dtype, got ",
                       DTypeName(d), " and ", DTypeName(ctx.type(a).dtype)));
    }
  }
  if (d != DType::kFloat32 && d != DType::kFloat16 && d != DType::kBFloat16) {
    return ctx.Invalid(absl::StrCat(
        "attention takes float32, float16 or bfloat16, not ", DTypeName(d)));
  }
  return d;
}

// Checks q, k, v (arguments q_arg, q_arg + 1, q_arg + 2) and returns
// their shapes.
absl::StatusOr<Shapes> QkvShapes(const OpContext& ctx, int q_arg) {
  const char* names[] = {"query", "key", "value"};
  Shapes s;
  for (int i = 0; i < 3; ++i) {
    const std::vector<SymExpr>& sizes = ctx.type(q_arg + i).sizes;
    if (sizes.size() != 4) {
      return ctx.Invalid(absl::StrCat(names[i],
                                      " must be [batch, heads, length, dim], "
                                      "got ",
                                      ShapeString(sizes)));
    }
    s.push_back(sizes);
  }
  const auto& q = s[0];
  const auto& k = s[1];
  const auto& v = s[2];
  if (!(q[0] == k[0]) || !(q[0] == v[0]) || !(q[1] == k[1]) ||
      !(q[1] == v[1])) {
    return ctx.Invalid(absl::StrCat(
        "query, key and value must have the same batch and heads, got ",
        ShapeString(q), ", ", ShapeString(k), ", ", ShapeString(v)));
  }
  if (!(k[2] == v[2])) {
    return ctx.Invalid(
        absl::StrCat("key and value must have the same length, "
                     "got ",
                     ShapeString(k), " and ", ShapeString(v)));
  }
  if (!(q[3] == k[3])) {
    return ctx.Invalid(
        absl::StrCat("query and key must have the same head dim, got ",
                     ShapeString(q), " and ", ShapeString(k)));
  }
  return s;
}

// Checks the optional bias (argument `arg`) against the scores [B, H, L, S]
// and the query's (argument `q_arg`) dtype.
absl::Status CheckBias(const OpContext& ctx, int arg, int q_arg,
                       const Shapes& qkv) {
  if (!ctx.is_tensor(arg)) return absl::OkStatus();
  const std::vector<SymExpr>& b = ctx.type(arg).sizes;
  const std::vector<SymExpr> scores{qkv[0][0], qkv[0][1], qkv[0][2], qkv[1][2]};
  bool ok = b.size() == 4;
  for (size_t d = 0; ok && d < 4; ++d)
    ok = b[d] == SymExpr(1) || b[d] == scores[d];
  if (!ok) {
    return ctx.Invalid(
        absl::StrCat("attn_bias must be 4-D with each dim 1 or the scores' ",
                     ShapeString(scores), ", got ", ShapeString(b)));
  }
  if (ctx.type(arg).dtype != ctx.type(q_arg).dtype) {
    return ctx.Invalid(
        absl::StrCat("attn_bias must have the query's dtype, got ",
                     DTypeName(ctx.type(arg).dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Shapes> AttentionShape(const OpContext& ctx) {
  auto s = QkvShapes(ctx, 0);
  if (!s.ok()) return s.status();
  if (absl::Status b = CheckBias(ctx, 3, 0, *s); !b.ok()) return b;
  const auto& q = (*s)[0];
  const auto& v = (*s)[2];
  return Shapes{{q[0], q[1], q[2], v[3]}, {q[0], q[1], q[2]}};
}

absl::StatusOr<std::vector<DType>> AttentionDTypes(const OpContext& ctx) {
  auto d = AttentionDType(ctx, {0, 1, 2});
  if (!d.ok()) return d.status();
  return std::vector<DType>{*d, DType::kFloat32};
}

// dropout_p (argument `arg`) is in (0, 1), also as a float32 (a library
// takes it as one); attention without dropout is kiln.attention.
absl::Status CheckDropout(const OpContext& ctx, int arg) {
  const double p = ctx.arg(arg).f;
  const float p32 = static_cast<float>(p);
  if (p > 0 && p < 1 && p32 > 0 && p32 < 1) return absl::OkStatus();
  return ctx.Invalid(
      absl::StrCat("dropout_p must be in (0, 1) (also as a float32), got ", p));
}

// attention_dropout: attention's outputs and rng, int64 [2].
absl::StatusOr<Shapes> AttentionDropoutShape(const OpContext& ctx) {
  if (absl::Status s = CheckSeed(ctx); !s.ok()) return s;
  if (absl::Status s = CheckDropout(ctx, 6); !s.ok()) return s;
  auto shapes = AttentionShape(ctx);
  if (!shapes.ok()) return shapes.status();
  shapes->push_back({SymExpr(2)});
  return shapes;
}

absl::StatusOr<std::vector<DType>> AttentionDropoutDTypes(
    const OpContext& ctx) {
  auto d = AttentionDTypes(ctx);
  if (!d.ok()) return d.status();
  d->push_back(DType::kInt64);
  return d;
}

// attention_backward(grad_out, q, k, v, attn_bias?, out, lse, is_causal,
// scale).
absl::StatusOr<Shapes> AttentionBackwardShape(const OpContext& ctx) {
  auto s = QkvShapes(ctx, 1);
  if (!s.ok()) return s.status();
  if (absl::Status b = CheckBias(ctx, 4, 1, *s); !b.ok()) return b;
  const auto& q = (*s)[0];
  const auto& v = (*s)[2];
  const std::vector<SymExpr> out{q[0], q[1], q[2], v[3]};
  if (ctx.type(0).sizes != out || ctx.type(5).sizes != out) {
    return ctx.Invalid(
        absl::StrCat("grad_out and out must have the output's shape ",
                     ShapeString(out), ", got ", ShapeString(ctx.type(0).sizes),
                     " and ", ShapeString(ctx.type(5).sizes)));
  }
  const std::vector<SymExpr> rows{q[0], q[1], q[2]};
  if (ctx.type(6).sizes != rows || ctx.type(6).dtype != DType::kFloat32) {
    return ctx.Invalid(absl::StrCat("lse must be float32 ", ShapeString(rows),
                                    ", got ", DTypeName(ctx.type(6).dtype), " ",
                                    ShapeString(ctx.type(6).sizes)));
  }
  return *s;
}

absl::StatusOr<std::vector<DType>> AttentionBackwardDTypes(
    const OpContext& ctx) {
  auto d = AttentionDType(ctx, {0, 1, 2, 3, 5});
  if (!d.ok()) return d.status();
  return std::vector<DType>{*d, *d, *d};
}

// attention_dropout_backward: attention_backward's arguments, then
// dropout_p and rng (int64 [2], attention_dropout's).
absl::StatusOr<Shapes> AttentionDropoutBackwardShape(const OpContext& ctx) {
  if (absl::Status s = CheckDropout(ctx, 9); !s.ok()) return s;
  const TensorType& rng = ctx.type(10);
  if (rng.dtype != DType::kInt64 || rng.sizes != std::vector<SymExpr>{2}) {
    return ctx.Invalid(
        absl::StrCat("rng must be attention_dropout's int64 [2], got ",
                     DTypeName(rng.dtype), " ", ShapeString(rng.sizes)));
  }
  return AttentionBackwardShape(ctx);
}

// The _dbias forms: their counterpart's shapes and dtypes, then the
// bias's (a tensor here).
absl::StatusOr<Shapes> WithBiasShape(absl::StatusOr<Shapes> shapes,
                                     const OpContext& ctx) {
  if (!shapes.ok()) return shapes.status();
  if (!ctx.is_tensor(4)) {
    return ctx.Invalid("attn_bias is required: the op gives its gradient");
  }
  shapes->push_back(ctx.type(4).sizes);
  return shapes;
}

absl::StatusOr<Shapes> AttentionBackwardDbiasShape(const OpContext& ctx) {
  return WithBiasShape(AttentionBackwardShape(ctx), ctx);
}

absl::StatusOr<Shapes> AttentionDropoutBackwardDbiasShape(
    const OpContext& ctx) {
  return WithBiasShape(AttentionDropoutBackwardShape(ctx), ctx);
}

absl::StatusOr<std::vector<DType>> AttentionBackwardDbiasDTypes(
    const OpContext& ctx) {
  auto d = AttentionBackwardDTypes(ctx);
  if (!d.ok()) return d.status();
  d->push_back(d->front());
  return d;
}

}  // namespace
}  // namespace kiln::ops

namespace kiln {

namespace {

using ops::Arg;

// attention's arguments: q, k, v, attn_bias?, is_causal, scale.
std::vector<ArgSpec> AttentionSchema() {
  return {Arg("query", ArgKind::kTensor),
          Arg("key", ArgKind::kTensor),
          Arg("value", ArgKind::kTensor),
          Arg("attn_bias", ArgKind::kOptionalTensor),
          Arg("is_causal", ArgKind::kBool),
          Arg("scale", ArgKind::kFloat)};
}

// attention_backward's: grad_out, q, k, v, attn_bias?, out, lse,
// is_causal, scale.
std::vector<ArgSpec> AttentionBackwardSchema() {
  return {Arg("grad_out", ArgKind::kTensor),
          Arg("query", ArgKind::kTensor),
          Arg("key", ArgKind::kTensor),
          Arg("value", ArgKind::kTensor),
          Arg("attn_bias", ArgKind::kOptionalTensor),
          Arg("out", ArgKind::kTensor),
          Arg("lse", ArgKind::kTensor),
          Arg("is_causal", ArgKind::kBool),
          Arg("scale", ArgKind::kFloat)};
}

}  // namespace

void RegisterAttentionSignatures(OpSignatures& table) {
  table.Add({.name = "kiln.attention.default",
             .op_class = OpClass::kExtern,
             .schema = AttentionSchema(),
             .num_outputs = 2,
             .shape = ops::AttentionShape,
             .dtype = ops::AttentionDTypes});
  table.Add({.name = "kiln.attention_backward.default",
             .op_class = OpClass::kExtern,
             .schema = AttentionBackwardSchema(),
             .num_outputs = 3,
             .shape = ops::AttentionBackwardShape,
             .dtype = ops::AttentionBackwardDTypes});
  // The dropout ops: the same arguments, then dropout_p and Kiln's seed
  // and offset keywords (forward) or attention_dropout's rng (backward).
  std::vector<ArgSpec> dropout = AttentionSchema();
  dropout.push_back(Arg("dropout_p", ArgKind::kFloat));
  dropout.push_back(ops::KwArg("seed", ArgKind::kOptionalTensor, Attr::None()));
  dropout.push_back(ops::KwArg("offset", ArgKind::kInt, Attr::Int(0)));
  table.Add({.name = "kiln.attention_dropout.default",
             .op_class = OpClass::kExtern,
             .schema = std::move(dropout),
             .num_outputs = 3,
             .shape = ops::AttentionDropoutShape,
             .dtype = ops::AttentionDropoutDTypes});
  std::vector<ArgSpec> dropout_backward = AttentionBackwardSchema();
  dropout_backward.push_back(Arg("dropout_p", ArgKind::kFloat));
  dropout_backward.push_back(Arg("rng", ArgKind::kTensor));
  table.Add({.name = "kiln.attention_dropout_backward.default",
             .op_class = OpClass::kExtern,
             .schema = dropout_backward,
             .num_outputs = 3,
             .shape = ops::AttentionDropoutBackwardShape,
             .dtype = ops::AttentionBackwardDTypes});
  // The backward ops that also give the bias's gradient.
  table.Add({.name = "kiln.attention_backward_dbias.default",
             .op_class = OpClass::kExtern,
             .schema = AttentionBackwardSchema(),
             .num_outputs = 4,
             .shape = ops::AttentionBackwardDbiasShape,
             .dtype = ops::AttentionBackwardDbiasDTypes});
  table.Add({.name = "kiln.attention_dropout_backward_dbias.default",
             .op_class = OpClass::kExtern,
             .schema = std::move(dropout_backward),
             .num_outputs = 4,
             .shape = ops::AttentionDropoutBackwardDbiasShape,
             .dtype = ops::AttentionBackwardDbiasDTypes});
}

}  // namespace kiln
