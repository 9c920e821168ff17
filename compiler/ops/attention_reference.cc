// Reference semantics of Kiln's fused attention (graph/ops/attention.cc) in
// double: the scores, the masked softmax and the products exactly, each
// result rounded once to its dtype (out and the gradients in the inputs'
// dtype, lse in float32). Where a library rounds the probabilities to the
// inputs' dtype before the second product the difference is within the
// dtype's tolerance (compiler/numerics.h). The dropout ops keep score
// element (b, h, i, j) by Philox as native_dropout draws it
// (graph/ops/random.h), at its row-major index over [B, H, L, S].
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/random.h"
#include "support/philox.h"

namespace kiln {
namespace {

// One (batch, head) pair's matrices, read from [B, H, R, C] tensors.
struct Head {
  const HostTensor& t;
  int64_t b, h;
  double operator()(int64_t r, int64_t c) const {
    return t.GetDouble({b, h, r, c});
  }
};

// The bias of head (b, h) (argument `arg`, broadcast over its dims of
// size 1), or none.
struct Bias {
  const HostTensor* t = nullptr;
  int64_t b = 0, h = 0;
  double operator()(int64_t i, int64_t j) const {
    if (t == nullptr) return 0;
    const auto& s = t->sizes();
    return t->GetDouble({s[0] == 1 ? 0 : b, s[1] == 1 ? 0 : h,
                         s[2] == 1 ? 0 : i, s[3] == 1 ? 0 : j});
  }
};
Bias BiasOf(const RefContext& ctx, int arg, int64_t b, int64_t h) {
  if (ctx.arg(arg).kind != Attr::Kind::kTensor) return {};
  return {&ctx.tensors[arg], b, h};
}

// attention_dropout's keep mask and scale (none: every element kept).
struct Dropout {
  double p = 0;
  uint64_t seed = 0, offset = 0;
  int64_t heads = 1, rows = 1, keys = 1;
  // The factor of score element (b, h, i, j): 1 / (1 - p) or 0.
  double operator()(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (p == 0) return 1;
    const int64_t index = ((b * heads + h) * rows + i) * keys + j;
    const uint32_t word =
        Philox4x32(seed, offset,
                   static_cast<uint64_t>(ops::PhiloxCall(
                       index, 1)))[ops::PhiloxWord(index, 1, 0)];
    constexpr uint32_t kMask = (uint32_t{1} << ops::kBernoulliBits) - 1;
    const bool keep =
        static_cast<int64_t>(word & kMask) < ops::BernoulliThreshold(1.0 - p);
    return keep ? ops::DropoutScale(p) : 0.0;
  }
};
Dropout DropoutOf(double p, int64_t seed, int64_t offset, const HostTensor& q,
                  const HostTensor& k) {
  return {p,
          static_cast<uint64_t>(seed),
          static_cast<uint64_t>(offset),
          q.sizes()[1],
          q.sizes()[2],
          k.sizes()[2]};
}

// The probabilities of row i of head (b, h): softmax(scale * q k^T + bias)
// over the keys, masked (causal) past the diagonal; `lse` its logsumexp.
std::vector<double> Probabilities(const Head& q, const Head& k,
                                  const Bias& bias, int64_t i, int64_t keys,
                                  int64_t dim, bool causal, double scale,
                                  double* lse) {
  std::vector<double> p(keys);
  double mx = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) {
    double s = 0;
    for (int64_t e = 0; e < dim; ++e) s += q(i, e) * k(j, e);
    p[j] = causal && j > i ? -INFINITY : s * scale + bias(i, j);
    mx = std::max(mx, p[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < keys; ++j) sum += p[j] = std::exp(p[j] - mx);
  for (int64_t j = 0; j < keys; ++j) p[j] /= sum;
  *lse = mx + std::log(sum);
  return p;
}

// attention (with `dropout`, attention_dropout's first two outputs).
absl::StatusOr<std::vector<HostTensor>> AttentionWith(const RefContext& ctx,
                                                      const Dropout& dropout) {
  const HostTensor &q = ctx.tensors[0], &k = ctx.tensors[1],
                   &v = ctx.tensors[2];
  const bool causal = ctx.arg(4).b;
  const double scale = ctx.arg(5).f;
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  HostTensor lse = HostTensor::Empty(ctx.out_dtypes[1], ctx.out_sizes[1]);
  const int64_t batch = q.sizes()[0], heads = q.sizes()[1], rows = q.sizes()[2],
                dim = q.sizes()[3], keys = k.sizes()[2], dim_v = v.sizes()[3];
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const Head qh{q, b, h}, kh{k, b, h}, vh{v, b, h};
      const Bias bias = BiasOf(ctx, 3, b, h);
      for (int64_t i = 0; i < rows; ++i) {
        double l = 0;
        const std::vector<double> p =
            Probabilities(qh, kh, bias, i, keys, dim, causal, scale, &l);
        lse.SetDouble({b, h, i}, l);
        for (int64_t e = 0; e < dim_v; ++e) {
          double o = 0;
          for (int64_t j = 0; j < keys; ++j)
            o += p[j] * dropout(b, h, i, j) * vh(j, e);
          out.SetDouble({b, h, i, e}, o);
        }
      }
    }
  }
  return std::vector<HostTensor>{std::move(out), std::move(lse)};
}

absl::StatusOr<std::vector<HostTensor>> AttentionReference(
    const RefContext& ctx) {
  return AttentionWith(ctx, Dropout{});
}

// attention_dropout: attention's outputs with the keep mask, and rng =
// (seed, offset).
absl::StatusOr<std::vector<HostTensor>> AttentionDropoutReference(
    const RefContext& ctx) {
  const ops::RandomArgs at = ops::RandomArgsOf(ctx.node);
  const int64_t seed = ctx.tensors[at.seed].GetIntAt(0);
  const int64_t offset = ctx.arg(at.offset).i;
  auto outs = AttentionWith(ctx, DropoutOf(ctx.arg(6).f, seed, offset,
                                           ctx.tensors[0], ctx.tensors[1]));
  if (!outs.ok()) return outs.status();
  HostTensor rng = HostTensor::Empty(ctx.out_dtypes[2], ctx.out_sizes[2]);
  rng.SetIntAt(0, seed);
  rng.SetIntAt(1, offset);
  outs->push_back(std::move(rng));
  return outs;
}

// The gradients from the exact probabilities (the saved out and lse are
// the forward's, so they agree with them to the dtype's rounding).
// With `dropout`: dv from the dropped probabilities, the softmax's
// gradient from dout @ v^T times the mask's factors. With `bias_grad` (the
// _dbias ops) also the bias's gradient: the scores' gradient before the
// scale, summed over the bias's broadcast dims.
absl::StatusOr<std::vector<HostTensor>> AttentionBackwardWith(
    const RefContext& ctx, const Dropout& dropout, bool bias_grad) {
  const HostTensor &dout = ctx.tensors[0], &q = ctx.tensors[1],
                   &k = ctx.tensors[2], &v = ctx.tensors[3];
  const bool causal = ctx.arg(7).b;
  const double scale = ctx.arg(8).f;
  const int64_t batch = q.sizes()[0], heads = q.sizes()[1], rows = q.sizes()[2],
                dim = q.sizes()[3], keys = k.sizes()[2], dim_v = v.sizes()[3];
  std::vector<double> dq(batch * heads * rows * dim, 0.0),
      dk(batch * heads * keys * dim, 0.0),
      dv(batch * heads * keys * dim_v, 0.0);
  std::optional<HostTensor> dbias;
  std::vector<double> db;
  if (bias_grad) {
    dbias = HostTensor::Empty(ctx.out_dtypes[3], ctx.out_sizes[3]);
    db.assign(dbias->numel(), 0.0);
  }
  // The element of the bias's gradient that score (b, h, i, j) adds to.
  auto bias_at = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const auto& s = ctx.out_sizes[3];
    return (((s[0] == 1 ? 0 : b) * s[1] + (s[1] == 1 ? 0 : h)) * s[2] +
            (s[2] == 1 ? 0 : i)) *
               s[3] +
           (s[3] == 1 ? 0 : j);
  };
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const Head qh{q, b, h}, kh{k, b, h}, vh{v, b, h}, doh{dout, b, h};
      const Bias bias = BiasOf(ctx, 4, b, h);
      const int64_t bh = b * heads + h;
      for (int64_t i = 0; i < rows; ++i) {
        double l = 0;
        const std::vector<double> p =
            Probabilities(qh, kh, bias, i, keys, dim, causal, scale, &l);
        std::vector<double> dp(keys, 0.0);
        double rowdot = 0;
        std::vector<double> factor(keys);
        for (int64_t j = 0; j < keys; ++j) {
          factor[j] = dropout(b, h, i, j);
          for (int64_t e = 0; e < dim_v; ++e) dp[j] += doh(i, e) * vh(j, e);
          dp[j] *= factor[j];
          rowdot += p[j] * dp[j];
        }
        for (int64_t j = 0; j < keys; ++j) {
          const double ds = p[j] * (dp[j] - rowdot) * scale;
          if (bias_grad) db[bias_at(b, h, i, j)] += p[j] * (dp[j] - rowdot);
          for (int64_t e = 0; e < dim_v; ++e)
            dv[(bh * keys + j) * dim_v + e] += p[j] * factor[j] * doh(i, e);
          for (int64_t e = 0; e < dim; ++e) {
            dq[(bh * rows + i) * dim + e] += ds * kh(j, e);
            dk[(bh * keys + j) * dim + e] += ds * qh(i, e);
          }
        }
      }
    }
  }
  std::vector<HostTensor> grads;
  for (int o = 0; o < 3; ++o) {
    const std::vector<double>& g = o == 0 ? dq : o == 1 ? dk : dv;
    HostTensor t = HostTensor::Empty(ctx.out_dtypes[o], ctx.out_sizes[o]);
    for (int64_t x = 0; x < t.numel(); ++x) t.SetDoubleAt(x, g[x]);
    grads.push_back(std::move(t));
  }
  if (dbias) {
    for (int64_t x = 0; x < dbias->numel(); ++x) dbias->SetDoubleAt(x, db[x]);
    grads.push_back(std::move(*dbias));
  }
  return grads;
}

absl::StatusOr<std::vector<HostTensor>> AttentionBackwardReference(
    const RefContext& ctx) {
  return AttentionBackwardWith(ctx, Dropout{}, false);
}

absl::StatusOr<std::vector<HostTensor>> AttentionBackwardDbiasReference(
    const RefContext& ctx) {
  return AttentionBackwardWith(ctx, Dropout{}, true);
}

absl::StatusOr<std::vector<HostTensor>> AttentionDropoutBackwardWith(
    const RefContext& ctx, bool bias_grad) {
  const HostTensor& rng = ctx.tensors[10];
  if (rng.GetIntAt(1) >= (int64_t{1} << 62)) {
    // A pair a library drew (compiler/ops/attention_lowering.cc,
    // kLibraryDrawn): its mask cannot be drawn here; NaN gradients.
    std::vector<HostTensor> grads;
    for (int o = 0; o < (bias_grad ? 4 : 3); ++o) {
      HostTensor t = HostTensor::Empty(ctx.out_dtypes[o], ctx.out_sizes[o]);
      for (int64_t x = 0; x < t.numel(); ++x) t.SetDoubleAt(x, NAN);
      grads.push_back(std::move(t));
    }
    return grads;
  }
  return AttentionBackwardWith(
      ctx,
      DropoutOf(ctx.arg(9).f, rng.GetIntAt(0), rng.GetIntAt(1), ctx.tensors[1],
                ctx.tensors[2]),
      bias_grad);
}

absl::StatusOr<std::vector<HostTensor>> AttentionDropoutBackwardReference(
    const RefContext& ctx) {
  return AttentionDropoutBackwardWith(ctx, false);
}

absl::StatusOr<std::vector<HostTensor>> AttentionDropoutBackwardDbiasReference(
    const RefContext& ctx) {
  return AttentionDropoutBackwardWith(ctx, true);
}

}  // namespace

void RegisterAttentionReferences(OpReferences& table) {
  table.Add("kiln.attention.default", AttentionReference);
  table.Add("kiln.attention_backward.default", AttentionBackwardReference);
  table.Add("kiln.attention_dropout.default", AttentionDropoutReference);
  table.Add("kiln.attention_dropout_backward.default",
            AttentionDropoutBackwardReference);
  table.Add("kiln.attention_backward_dbias.default",
            AttentionBackwardDbiasReference);
  table.Add("kiln.attention_dropout_backward_dbias.default",
            AttentionDropoutBackwardDbiasReference);
}

}  // namespace kiln
