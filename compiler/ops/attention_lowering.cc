// Lowerings of Kiln's fused attention (signatures: graph/ops/attention.cc).
//
// Where the target has a fused attention library (LowerOptions::
// library_attention) and the case is one it takes (cuDNN on CUDA: float16
// or bfloat16, head dims multiples of 8 up to 128, or 256 on sm_90 and
// later; the CPU runtime's kernel: any floating dtype and head dim), each
// op is one extern call (loop_ir.h, AttentionCall) over contiguous
// operands: the scores never reach memory. Otherwise it is what the
// library computes, written out: the scores as a GEMM (Kiln's GEMM
// extern), the masked softmax in float32 as reductions and pointwise
// nodes, the probabilities rounded to the inputs' dtype, and a second
// GEMM; the backward recomputes the probabilities from the saved
// logsumexp and takes four GEMMs:
//   p  = exp(scale * q @ k^T (masked) - lse)
//   dv = p^T @ dout            dp = dout @ v^T
//   ds = p * (dp - rowsum(dout * out)) * scale
//   dq = ds @ k                dk = ds^T @ q
// and the _dbias ops the bias's gradient, p * (dp - rowsum(dout * out))
// summed over the dims where the bias broadcasts (in float32, rounded
// once; the CPU runtime's kernel computes it too, cuDNN's call is not
// asked for it).
// p and ds are rounded to the inputs' dtype before their products, as
// PyTorch's math attention rounds them.
//
// The dropout ops (attention_dropout and its backward) multiply the
// probabilities by keep / (1 - dropout_p) before the second product: the
// library draws keep itself from the (seed, offset) pair in rng (cuDNN's
// generator; its backward draws the same); written out, keep is Philox at
// the score element's row-major index over [B, H, L, S], as native_dropout
// draws (graph/ops/random.h), and the backward takes
//   dv = (p * keep / (1 - dropout_p))^T @ dout
//   ds = p * (dp * keep / (1 - dropout_p) - rowsum(dout * out)) * scale.
// A program draws with one of the two for both directions: the library
// only where both directions can use it (not under deterministic_gemms).
// The library's pair is (LibrarySeed(seed, offset), kLibraryDrawn): cuDNN's
// generator reads its offset as a position in one stream, so each op gets
// a seed of its own rather than the program's seed and its stream number
// (adjacent offsets would draw shifted, correlated masks). The flag marks
// the pair: a backward written out cannot draw that mask again and gives
// NaN gradients for such a pair rather than wrong ones (python/kiln/
// attention.py, LIBRARY_DRAWN, where the eager body raises); the library's
// backward, given a pair it did not draw, reads NaN for lse and gives NaN
// gradients too.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/ops/lowering_util.h"
#include "graph/ops/random.h"

namespace kiln {
namespace {

using ops::LowerReductionOver;
using ops::ReadKept;

constexpr DType kF32 = DType::kFloat32;
constexpr int64_t kLibraryDrawn = int64_t{1} << 62;

// The library's seed for stream (seed, offset): words 0 and 1 of
// Philox(seed, offset, 0) as one non-negative int64 (63 bits).
Expr LibrarySeed(const Expr& seed, const Expr& offset) {
  const Expr lo = ir::Philox(seed, offset, ir::IntConst(0), 0);
  const Expr hi =
      ir::Binary(ExprOp::kBitAnd, ir::Philox(seed, offset, ir::IntConst(0), 1),
                 ir::IntConst(0x7fffffff), DType::kInt64);
  return ir::Add(ir::Mul(hi, ir::IntConst(int64_t{1} << 32)), lo);
}

// Whether rng's offset (an int64 [2] pair) carries kLibraryDrawn.
Expr LibraryDrawn(const LoweredValue& rng) {
  return ir::Binary(ExprOp::kGe, LowerContext::Read(rng, {ir::IntConst(1)}),
                    ir::IntConst(kLibraryDrawn), DType::kBool);
}

Expr S(const SymExpr& e) { return ir::FromSym(e); }

// The sizes of one call: q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev].
struct Sizes {
  SymExpr b, h, l, s, e, ev;
  SymExpr bh() const { return b * h; }
};
Sizes SizesOf(const LoweredValue& q, const LoweredValue& v) {
  return {q.sizes[0], q.sizes[1], q.sizes[2],
          v.sizes[2], q.sizes[3], v.sizes[3]};
}

// Whether the library computes the call (LowerOptions::LibraryAttention):
// a `backward` under deterministic_gemms needs a deterministic library;
// with `dropout`, both directions must use it (the backward draws the
// forward's mask again), so either needs what the backward needs, and head
// dims up to LibraryAttention::max_dropout_head_dim; a backward that gives
// the bias's gradient (`bias_grad`), a library that computes it.
bool UsesLibrary(const LowerContext& ctx, DType dtype, const Sizes& z,
                 bool backward, bool dropout, bool bias_grad = false) {
  const LowerOptions& o = ctx.options();
  const LowerOptions::LibraryAttention& lib = o.library_attention;
  const bool half = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  if (!lib.enabled || (dropout && !lib.dropout) ||
      (bias_grad && !lib.bias_grad) ||
      ((backward || dropout) && o.deterministic_gemms && !lib.deterministic) ||
      !(half || (lib.float32 && dtype == DType::kFloat32))) {
    return false;
  }
  const int64_t max_dim =
      dropout ? std::min(lib.max_head_dim, lib.max_dropout_head_dim)
              : lib.max_head_dim;
  for (const SymExpr& d : {z.e, z.ev}) {
    const std::optional<int64_t> c = d.AsConstant();
    if (!c || *c % lib.head_dim_multiple != 0 || *c > max_dim) return false;
  }
  // Libraries take no empty tensor (EvaluateAttention): an empty call is
  // written out. (Symbolic sizes are at least 2: Dynamo specialises 0
  // and 1.)
  for (const SymExpr& d : {z.b, z.h, z.l, z.s, z.e, z.ev}) {
    const std::optional<int64_t> c = d.AsConstant();
    if (c && *c < 1) return false;
  }
  return true;
}

// The call over `inputs` writing a node of `sizes` and `dtype` and the
// nodes of `more` ({sizes, dtype} each): their values, in that order.
std::vector<LoweredValue> LibraryCall(
    LowerContext& ctx, AttentionCall call, std::vector<int> inputs,
    const std::vector<std::pair<std::vector<SymExpr>, DType>>& results) {
  const int first = ctx.NextNode();
  std::vector<LoweredValue> out;
  for (size_t r = 0; r < results.size(); ++r) {
    LoopNode node;
    node.kind = LoopNode::Kind::kExtern;
    node.sizes = results[r].first;
    node.dtype = results[r].second;
    if (r == 0) {
      node.attention = call;
      node.extern_inputs = inputs;
      for (size_t m = 1; m < results.size(); ++m)
        node.extern_outputs.push_back(first + static_cast<int>(m));
    } else {
      node.extern_owner = first;
    }
    out.push_back(ctx.AddNode(std::move(node)));
  }
  return out;
}

// Dropout of one call: its probability and, as int64 expressions, the
// Philox stream it draws from.
struct Dropout {
  double p = 0;
  Expr seed, offset;
  // Whether score element (n, i, j) is kept (bool): Philox at its
  // row-major index over [B * H, L, S].
  Expr Keep(const Sizes& z) const {
    return ops::BernoulliDraw(
        ops::PhiloxWordAt(seed, offset,
                          ops::RowMajorIndex({z.bh(), z.l, z.s}), 1, 0),
        ops::BernoulliThreshold(1.0 - p));
  }
  // The factor of a score element kept or not (`keep`, bool) in float32:
  // keep / (1 - p).
  Expr Factor(const Expr& keep) const {
    return ir::Binary(ExprOp::kMul, ir::Cast(keep, kF32),
                      ir::Const(ops::DropoutScale(p), kF32), kF32);
  }
};

AttentionCall CallOf(const Sizes& z, bool backward, bool causal, double scale,
                     const Dropout* dropout) {
  AttentionCall c;
  c.backward = backward;
  c.batch = z.b;
  c.heads = z.h;
  c.s_q = z.l;
  c.s_kv = z.s;
  c.d_qk = z.e;
  c.d_v = z.ev;
  c.causal = causal;
  c.scale = scale;
  if (dropout != nullptr) c.dropout = dropout->p;
  return c;
}

// `v` ([B, H, R, C]) as the batched matrices [B * H, R, C], or transposed
// [B * H, C, R].
LoweredValue Matrices(const LoweredValue& v, const SymExpr& heads,
                      bool transposed = false) {
  const Expr n = ir::Var(0);
  const Expr bi = ir::FloorDiv(n, S(heads));
  const Expr hi = ir::Mod(n, S(heads));
  const Expr r = ir::Var(transposed ? 2 : 1);
  const Expr c = ir::Var(transposed ? 1 : 2);
  const SymExpr bh = v.sizes[0] * v.sizes[1];
  return LowerContext::Remap(
      v, {bi, hi, r, c},
      transposed ? std::vector<SymExpr>{bh, v.sizes[3], v.sizes[2]}
                 : std::vector<SymExpr>{bh, v.sizes[2], v.sizes[3]});
}

// Batched matrices [B * H, R, C] read back as [B, H, R, C], in `dtype`.
LoweredValue Heads(LowerContext& ctx, const LoweredValue& m, const Sizes& z,
                   DType dtype) {
  const LoweredValue view =
      LowerContext::Remap(m,
                          {ir::Add(ir::Mul(ir::Var(0), S(z.h)), ir::Var(1)),
                           ir::Var(2), ir::Var(3)},
                          {z.b, z.h, m.sizes[1], m.sizes[2]});
  if (view.dtype == dtype) return view;
  return ops::Materialize(ctx, view, dtype);
}

// The bias argument `arg` (4-D, each dim 1 or the scores'), when given.
const LoweredValue* BiasArg(const LowerContext& ctx, int arg) {
  return ctx.is_tensor(arg) ? &ctx.value(arg) : nullptr;
}

bool IsOne(const SymExpr& e) { return e == SymExpr(1); }

// The bias for the library: contiguous [B or 1, H or 1, L, S] (its query
// and key dims written out where they broadcast).
int LibraryBias(LowerContext& ctx, const LoweredValue& bias, const Sizes& z,
                DType dtype, AttentionCall& call) {
  const std::vector<SymExpr>& b = bias.sizes;
  call.bias = true;
  call.bias_batch = !IsOne(b[0]);
  call.bias_heads = !IsOne(b[1]);
  const LoweredValue full = LowerContext::Remap(
      bias,
      {ir::Var(0), ir::Var(1), IsOne(b[2]) ? ir::IntConst(0) : ir::Var(2),
       IsOne(b[3]) ? ir::IntConst(0) : ir::Var(3)},
      {b[0], b[1], z.l, z.s});
  return ops::ContiguousNode(ctx, full, dtype);
}

// scale * q @ k^T (+ bias) over [B * H, L, S] in float32, masked (causal)
// to -inf where the key's column is after the query's row: an expression
// over the scores' vars (n, i, j), and the GEMM node it reads.
struct Scores {
  LoweredValue product;
  Expr masked;
};
Scores ScoresOf(LowerContext& ctx, const LoweredValue& q, const LoweredValue& k,
                const LoweredValue* bias, const Sizes& z, bool causal,
                double scale, DType dtype) {
  const ops::GemmDTypes g = ops::GemmDTypesFor(ctx.options(), dtype);
  Scores s;
  s.product = ops::AddGemm(ctx, Matrices(q, z.h), Matrices(k, z.h, true), scale,
                           {z.bh(), z.l, z.s}, g.operands, g.c);
  Expr x = ir::Cast(LowerContext::Read(s.product, IdentityIndex(3)), kF32);
  if (bias != nullptr) {
    const std::vector<SymExpr>& b = bias->sizes;
    const Expr n = ir::Var(0);
    const std::vector<Expr> index = {
        IsOne(b[0]) ? ir::IntConst(0) : ir::FloorDiv(n, S(z.h)),
        IsOne(b[1]) ? ir::IntConst(0) : ir::Mod(n, S(z.h)),
        IsOne(b[2]) ? ir::IntConst(0) : ir::Var(1),
        IsOne(b[3]) ? ir::IntConst(0) : ir::Var(2)};
    x = ir::Binary(ExprOp::kAdd, x,
                   ir::Cast(LowerContext::Read(*bias, index), kF32), kF32);
  }
  s.masked = causal ? ir::Select(ir::Binary(ExprOp::kGt, ir::Var(2), ir::Var(1),
                                            DType::kBool),
                                 ir::Const(-INFINITY, kF32), x)
                    : x;
  return s;
}

// The product x @ y of batched matrices in the GEMM dtypes for `dtype`.
LoweredValue Product(LowerContext& ctx, const LoweredValue& x,
                     const LoweredValue& y, DType dtype) {
  const ops::GemmDTypes g = ops::GemmDTypesFor(ctx.options(), dtype);
  return ops::AddGemm(ctx, x, y, 1.0, {x.sizes[0], x.sizes[1], y.sizes[2]},
                      g.operands, g.c);
}

// attention(q, k, v, attn_bias?, is_causal, scale) -> (out, lse), with
// `dropout` (attention_dropout) reading int64 [2] `rng` = (seed, offset).
absl::StatusOr<std::vector<LoweredValue>> LowerAttentionWith(
    LowerContext& ctx, const Dropout* dropout, const LoweredValue* rng) {
  const LoweredValue &q = ctx.value(0), &k = ctx.value(1), &v = ctx.value(2);
  const LoweredValue* bias = BiasArg(ctx, 3);
  const bool causal = ctx.arg(4).b;
  const double scale = ctx.arg(5).f;
  const DType dtype = ctx.out_type(0).dtype;
  const Sizes z = SizesOf(q, v);
  if (UsesLibrary(ctx, dtype, z, /*backward=*/false, dropout != nullptr)) {
    AttentionCall call = CallOf(z, false, causal, scale, dropout);
    std::vector<int> inputs;
    for (const LoweredValue* x : {&q, &k, &v})
      inputs.push_back(ops::ContiguousNode(ctx, *x, dtype));
    if (bias != nullptr)
      inputs.push_back(LibraryBias(ctx, *bias, z, dtype, call));
    if (rng != nullptr)
      inputs.push_back(ops::ContiguousNode(ctx, *rng, DType::kInt64));
    return LibraryCall(
        ctx, call, inputs,
        {{ctx.out_type(0).sizes, dtype}, {ctx.out_type(1).sizes, kF32}});
  }
  const Scores s = ScoresOf(ctx, q, k, bias, z, causal, scale, dtype);
  const std::vector<bool> rows{false, false, true};
  auto mx = LowerReductionOver(ctx, s.product, rows, true, ReduceKind::kMax,
                               kF32, kF32, s.masked, nullptr);
  if (!mx.ok()) return mx.status();
  const Expr e = ir::Unary(
      ExprOp::kExp,
      ir::Binary(ExprOp::kSub, s.masked, ReadKept((*mx)[0], rows), kF32), kF32);
  auto sum = LowerReductionOver(ctx, s.product, rows, true, ReduceKind::kSum,
                                kF32, kF32, e, nullptr);
  if (!sum.ok()) return sum.status();
  Expr probs = ir::Binary(ExprOp::kDiv, e, ReadKept((*sum)[0], rows), kF32);
  if (dropout != nullptr)
    probs = ir::Binary(ExprOp::kMul, probs, dropout->Factor(dropout->Keep(z)),
                       kF32);
  const LoweredValue p =
      ops::PointwiseNode(ctx, {z.bh(), z.l, z.s}, dtype, probs);
  const LoweredValue out =
      Heads(ctx, Product(ctx, p, Matrices(v, z.h), dtype), z, dtype);
  // lse[b, h, i] = max + log(sum) of row (b * H + h, i).
  const std::vector<Expr> row{ir::Add(ir::Mul(ir::Var(0), S(z.h)), ir::Var(1)),
                              ir::Var(2), ir::IntConst(0)};
  const LoweredValue lse = ops::PointwiseNode(
      ctx, {z.b, z.h, z.l}, kF32,
      ir::Binary(
          ExprOp::kAdd, LowerContext::Read((*mx)[0], row),
          ir::Unary(ExprOp::kLog, LowerContext::Read((*sum)[0], row), kF32),
          kF32));
  return std::vector<LoweredValue>{out, lse};
}

absl::StatusOr<std::vector<LoweredValue>> LowerAttention(LowerContext& ctx) {
  return LowerAttentionWith(ctx, nullptr, nullptr);
}

// attention_dropout(q, k, v, attn_bias?, is_causal, scale, dropout_p, *,
// seed, offset) -> (out, lse, rng = (seed, offset)).
absl::StatusOr<std::vector<LoweredValue>> LowerAttentionDropout(
    LowerContext& ctx) {
  const ops::RandomArgs at = ops::RandomArgsOf(ctx.node());
  const int64_t offset = ctx.arg(at.offset).i;
  const Dropout dropout{ctx.arg(6).f,
                        LowerContext::Read(ctx.value(at.seed), {}),
                        ir::IntConst(offset)};
  // A library with a generator of its own gets a seed of its own and the
  // flag; one that draws as Kiln does, Kiln's pair.
  const bool library_generator =
      UsesLibrary(ctx, ctx.out_type(0).dtype,
                  SizesOf(ctx.value(0), ctx.value(2)),
                  /*backward=*/false, /*dropout=*/true) &&
      !ctx.options().library_attention.kiln_philox;
  const LoweredValue rng = ops::PointwiseNode(
      ctx, {SymExpr(2)}, DType::kInt64,
      ir::Select(
          ir::Binary(ExprOp::kEq, ir::Var(0), ir::IntConst(0), DType::kBool),
          library_generator ? LibrarySeed(dropout.seed, dropout.offset)
                            : dropout.seed,
          ir::IntConst(library_generator ? kLibraryDrawn : offset)));
  auto outs = LowerAttentionWith(ctx, &dropout, &rng);
  if (!outs.ok()) return outs.status();
  outs->push_back(rng);
  return outs;
}

// `grad` (over [B, H, L, S], or the library bias's [B or 1, H or 1, L, S])
// summed over the dims where `bias` broadcasts and `grad` does not: the
// bias's gradient, in `dtype`.
absl::StatusOr<LoweredValue> SumToBias(LowerContext& ctx,
                                       const LoweredValue& grad,
                                       const LoweredValue& bias, DType dtype) {
  std::vector<bool> reduced(4);
  bool any = false;
  for (int d = 0; d < 4; ++d) {
    reduced[d] = IsOne(bias.sizes[d]) && !IsOne(grad.sizes[d]);
    any |= reduced[d];
  }
  const Expr body = ir::Cast(LowerContext::Read(grad, IdentityIndex(4)), kF32);
  if (!any) {
    if (grad.dtype == dtype) return grad;
    return ops::PointwiseNode(ctx, grad.sizes, dtype, body);
  }
  auto sum = LowerReductionOver(ctx, grad, reduced, /*keepdim=*/true,
                                ReduceKind::kSum, kF32, dtype, body, nullptr);
  if (!sum.ok()) return sum.status();
  return (*sum)[0];
}

// attention_backward(grad_out, q, k, v, attn_bias?, out, lse, is_causal,
// scale) -> (grad_q, grad_k, grad_v), and with `bias_grad`
// (attention_backward_dbias) the bias's gradient.
// With `dropout` (attention_dropout_backward, reading `rng`).
absl::StatusOr<std::vector<LoweredValue>> LowerAttentionBackwardWith(
    LowerContext& ctx, const Dropout* dropout, const LoweredValue* rng,
    bool bias_grad) {
  const LoweredValue &dout = ctx.value(0), &q = ctx.value(1), &k = ctx.value(2),
                     &v = ctx.value(3), &out = ctx.value(5),
                     &lse = ctx.value(6);
  const LoweredValue* bias = BiasArg(ctx, 4);
  const bool causal = ctx.arg(7).b;
  const double scale = ctx.arg(8).f;
  const DType dtype = ctx.out_type(0).dtype;
  const Sizes z = SizesOf(q, v);
  if (UsesLibrary(ctx, dtype, z, /*backward=*/true, dropout != nullptr,
                  bias_grad)) {
    AttentionCall call = CallOf(z, true, causal, scale, dropout);
    call.bias_grad = bias_grad;
    std::vector<int> inputs;
    for (const LoweredValue* x : {&q, &k, &v})
      inputs.push_back(ops::ContiguousNode(ctx, *x, dtype));
    if (bias != nullptr)
      inputs.push_back(LibraryBias(ctx, *bias, z, dtype, call));
    inputs.push_back(ops::ContiguousNode(ctx, out, dtype));
    if (rng != nullptr) {
      // NaN for lse where the library did not draw the pair (a library
      // drawing as Kiln does cannot draw a flagged one).
      const Expr lse_x =
          ir::Cast(LowerContext::Read(lse, IdentityIndex(3)), kF32);
      const Expr nan = ir::Const(NAN, kF32);
      const bool kiln_pairs = ctx.options().library_attention.kiln_philox;
      inputs.push_back(ops::ContiguousNode(
          ctx,
          ops::PointwiseNode(
              ctx, lse.sizes, kF32,
              ir::Select(LibraryDrawn(*rng), kiln_pairs ? nan : lse_x,
                         kiln_pairs ? lse_x : nan)),
          kF32));
    } else {
      inputs.push_back(ops::ContiguousNode(ctx, lse, kF32));
    }
    inputs.push_back(ops::ContiguousNode(ctx, dout, dtype));
    if (rng != nullptr)
      inputs.push_back(ops::ContiguousNode(ctx, *rng, DType::kInt64));
    std::vector<std::pair<std::vector<SymExpr>, DType>> results = {
        {ctx.out_type(0).sizes, dtype},
        {ctx.out_type(1).sizes, dtype},
        {ctx.out_type(2).sizes, dtype}};
    // The library's bias gradient has the library bias's shape, [B or 1,
    // H or 1, L, S]; a bias broadcast over queries or keys sums it there.
    if (bias_grad)
      results.push_back({{bias->sizes[0], bias->sizes[1], z.l, z.s}, dtype});
    std::vector<LoweredValue> grads = LibraryCall(ctx, call, inputs, results);
    if (bias_grad) {
      auto db = SumToBias(ctx, grads[3], *bias, dtype);
      if (!db.ok()) return db.status();
      grads[3] = *db;
    }
    return grads;
  }
  const Scores s = ScoresOf(ctx, q, k, bias, z, causal, scale, dtype);
  // p from the saved logsumexp of row (n, i).
  const Expr n = ir::Var(0);
  const Expr lse_row = ir::Cast(
      LowerContext::Read(
          lse, {ir::FloorDiv(n, S(z.h)), ir::Mod(n, S(z.h)), ir::Var(1)}),
      kF32);
  const Expr p = ir::Unary(
      ExprOp::kExp, ir::Binary(ExprOp::kSub, s.masked, lse_row, kF32), kF32);
  const std::vector<SymExpr> scores{z.bh(), z.l, z.s};
  // With dropout, the mask is drawn once into a bool node that both the
  // dropped probabilities and ds read.
  std::optional<LoweredValue> keep;
  Expr factor;
  if (dropout != nullptr) {
    keep = ops::PointwiseNode(ctx, scores, DType::kBool, dropout->Keep(z));
    factor = ir::Select(
        LibraryDrawn(*rng), ir::Const(NAN, kF32),
        dropout->Factor(LowerContext::Read(*keep, IdentityIndex(3))));
  }
  const LoweredValue p_node = ops::PointwiseNode(
      ctx, scores, dtype,
      dropout != nullptr ? ir::Binary(ExprOp::kMul, p, factor, kF32) : p);
  const LoweredValue dout_m = Matrices(dout, z.h);
  const LoweredValue dv =
      Product(ctx,
              LowerContext::Remap(p_node, {ir::Var(0), ir::Var(2), ir::Var(1)},
                                  {z.bh(), z.s, z.l}),
              dout_m, dtype);
  const LoweredValue dp = Product(ctx, dout_m, Matrices(v, z.h, true), dtype);
  // rowsum(dout * out) over Ev, per row (n, i).
  const LoweredValue out_m = Matrices(out, z.h);
  const std::vector<bool> last{false, false, true};
  const Expr both = ir::Binary(
      ExprOp::kMul,
      ir::Cast(LowerContext::Read(dout_m, IdentityIndex(3)), kF32),
      ir::Cast(LowerContext::Read(out_m, IdentityIndex(3)), kF32), kF32);
  auto rowsum = LowerReductionOver(ctx, dout_m, last, true, ReduceKind::kSum,
                                   kF32, kF32, both, nullptr);
  if (!rowsum.ok()) return rowsum.status();
  Expr dp_x = ir::Cast(LowerContext::Read(dp, IdentityIndex(3)), kF32);
  if (dropout != nullptr) dp_x = ir::Binary(ExprOp::kMul, dp_x, factor, kF32);
  // g = p * (dp - rowsum): the scores' gradient before the scale, read
  // from a float32 node where the bias's gradient reads it too.
  Expr g = ir::Binary(
      ExprOp::kMul, p,
      ir::Binary(ExprOp::kSub, dp_x, ReadKept((*rowsum)[0], last), kF32), kF32);
  std::optional<LoweredValue> g_node;
  if (bias_grad) {
    g_node = ops::PointwiseNode(ctx, scores, kF32, g);
    g = LowerContext::Read(*g_node, IdentityIndex(3));
  }
  const Expr ds = ir::Binary(ExprOp::kMul, g, ir::Const(scale, kF32), kF32);
  const LoweredValue ds_node = ops::PointwiseNode(ctx, scores, dtype, ds);
  const LoweredValue dq = Product(ctx, ds_node, Matrices(k, z.h), dtype);
  const LoweredValue dk =
      Product(ctx,
              LowerContext::Remap(ds_node, {ir::Var(0), ir::Var(2), ir::Var(1)},
                                  {z.bh(), z.s, z.l}),
              Matrices(q, z.h), dtype);
  std::vector<LoweredValue> grads{Heads(ctx, dq, z, dtype),
                                  Heads(ctx, dk, z, dtype),
                                  Heads(ctx, dv, z, dtype)};
  if (bias_grad) {
    // g over [B, H, L, S].
    const LoweredValue g4 = LowerContext::Remap(
        *g_node,
        {ir::Add(ir::Mul(ir::Var(0), S(z.h)), ir::Var(1)), ir::Var(2),
         ir::Var(3)},
        {z.b, z.h, z.l, z.s});
    auto db = SumToBias(ctx, g4, *bias, dtype);
    if (!db.ok()) return db.status();
    grads.push_back(*db);
  }
  return grads;
}

absl::StatusOr<std::vector<LoweredValue>> LowerAttentionBackward(
    LowerContext& ctx) {
  return LowerAttentionBackwardWith(ctx, nullptr, nullptr, false);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAttentionBackwardDbias(
    LowerContext& ctx) {
  return LowerAttentionBackwardWith(ctx, nullptr, nullptr, true);
}

// attention_dropout_backward(grad_out, q, k, v, attn_bias?, out, lse,
// is_causal, scale, dropout_p, rng) -> (grad_q, grad_k, grad_v).
absl::StatusOr<std::vector<LoweredValue>> LowerAttentionDropoutBackwardWith(
    LowerContext& ctx, bool bias_grad) {
  const LoweredValue& rng = ctx.value(10);
  const Dropout dropout{ctx.arg(9).f,
                        LowerContext::Read(rng, {ir::IntConst(0)}),
                        LowerContext::Read(rng, {ir::IntConst(1)})};
  return LowerAttentionBackwardWith(ctx, &dropout, &rng, bias_grad);
}

absl::StatusOr<std::vector<LoweredValue>> LowerAttentionDropoutBackward(
    LowerContext& ctx) {
  return LowerAttentionDropoutBackwardWith(ctx, false);
}

// attention_dropout_backward_dbias: the same, and the bias's gradient.
absl::StatusOr<std::vector<LoweredValue>> LowerAttentionDropoutBackwardDbias(
    LowerContext& ctx) {
  return LowerAttentionDropoutBackwardWith(ctx, true);
}

}  // namespace

void RegisterAttentionLowerings(OpLowerings& table) {
  table.Add("kiln.attention.default", LowerAttention);
  table.Add("kiln.attention_backward.default", LowerAttentionBackward);
  table.Add("kiln.attention_dropout.default", LowerAttentionDropout);
  table.Add("kiln.attention_dropout_backward.default",
            LowerAttentionDropoutBackward);
  table.Add("kiln.attention_backward_dbias.default",
            LowerAttentionBackwardDbias);
  table.Add("kiln.attention_dropout_backward_dbias.default",
            LowerAttentionDropoutBackwardDbias);
}

}  // namespace kiln
