// Reference semantics of the norm family (signatures: graph/ops/norm.cc) in
// double with the textbook formulas:
//   softmax backward      y * (g - sum(g * y))
//   log_softmax backward  g - exp(y) * sum(g)
//   layer norm backward   xhat = (x - mean) * rstd, gw = g * weight,
//                         dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),
//                         dweight = sum(g * xhat), dbias = sum(g) over rows.
#include <cmath>
#include <utility>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"

namespace kiln {
namespace {

using ops::ForEachRow;

// Whether bit `i` of the output_mask argument `arg` is set.
bool MaskBit(const RefContext& ctx, int arg, int i) {
  return ctx.arg(arg).ints[i].AsConstant().value_or(1) != 0;
}

HostTensor Zeros(const RefContext& ctx, int o) {
  HostTensor t = HostTensor::Empty(ctx.out_dtypes[o], ctx.out_sizes[o]);
  for (int64_t i = 0; i < t.numel(); ++i) t.SetDoubleAt(i, 0);
  return t;
}

absl::StatusOr<std::vector<HostTensor>> SoftmaxBackward(const RefContext& ctx,
                                                        bool log) {
  const HostTensor& g = ctx.tensors[0];
  const HostTensor& y = ctx.tensors[1];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  std::vector<bool> reduced(y.rank(), false);
  if (y.rank() > 0) {
    const int64_t d = ctx.arg(2).i;
    reduced[d < 0 ? d + y.rank() : d] = true;
  }
  ForEachRow(
      y.sizes(), reduced, [&](const std::vector<std::vector<int64_t>>& row) {
        double s = 0;
        for (const auto& i : row) {
          s += log ? g.GetDouble(i) : g.GetDouble(i) * y.GetDouble(i);
        }
        for (const auto& i : row) {
          out.SetDouble(i, log ? g.GetDouble(i) - std::exp(y.GetDouble(i)) * s
                               : y.GetDouble(i) * (g.GetDouble(i) - s));
        }
      });
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> SoftmaxBackwardReference(
    const RefContext& ctx) {
  return SoftmaxBackward(ctx, /*log=*/false);
}

absl::StatusOr<std::vector<HostTensor>> LogSoftmaxBackwardReference(
    const RefContext& ctx) {
  return SoftmaxBackward(ctx, /*log=*/true);
}

absl::StatusOr<std::vector<HostTensor>> LayerNormBackwardReference(
    const RefContext& ctx) {
  const HostTensor& g = ctx.tensors[0];
  const HostTensor& x = ctx.tensors[1];
  const HostTensor& mean = ctx.tensors[3];
  const HostTensor& rstd = ctx.tensors[4];
  const bool has_w = !ctx.arg(5).is_none();
  const size_t axis = x.rank() - ctx.arg(2).ints.size();
  HostTensor dx = Zeros(ctx, 0);
  std::vector<int64_t> wsizes(x.sizes().begin() + axis, x.sizes().end());
  int64_t wnumel = 1;
  for (int64_t s : wsizes) wnumel *= s;
  std::vector<double> dw(wnumel, 0), db(wnumel, 0);
  std::vector<bool> reduced(x.rank(), false);
  for (size_t d = axis; d < static_cast<size_t>(x.rank()); ++d)
    reduced[d] = true;
  ForEachRow(x.sizes(), reduced,
             [&](const std::vector<std::vector<int64_t>>& row) {
               if (row.empty()) return;
               std::vector<int64_t> sidx = row[0];
               for (size_t d = axis; d < sidx.size(); ++d) sidx[d] = 0;
               const double m = mean.GetDouble(sidx);
               const double rs = rstd.GetDouble(sidx);
               const double n = static_cast<double>(row.size());
               std::vector<double> xhat, gw;
               double s1 = 0, s2 = 0;
               for (size_t k = 0; k < row.size(); ++k) {
                 const auto& i = row[k];
                 std::vector<int64_t> widx(i.begin() + axis, i.end());
                 xhat.push_back((x.GetDouble(i) - m) * rs);
                 gw.push_back(g.GetDouble(i) *
                              (has_w ? ctx.tensors[5].GetDouble(widx) : 1.0));
                 s1 += gw.back();
                 s2 += gw.back() * xhat.back();
                 // Row k of a row is element k of the weight.
                 dw[k] += g.GetDouble(i) * xhat.back();
                 db[k] += g.GetDouble(i);
               }
               for (size_t k = 0; k < row.size(); ++k) {
                 dx.SetDouble(row[k], rs * (gw[k] - s1 / n - xhat[k] * s2 / n));
               }
             });
  std::vector<HostTensor> out{std::move(dx), Zeros(ctx, 1), Zeros(ctx, 2)};
  for (int64_t k = 0; k < wnumel; ++k) {
    if (MaskBit(ctx, 7, 1) && has_w) out[1].SetDoubleAt(k, dw[k]);
    if (MaskBit(ctx, 7, 2) && !ctx.arg(6).is_none()) {
      out[2].SetDoubleAt(k, db[k]);
    }
  }
  if (!MaskBit(ctx, 7, 0)) out[0] = Zeros(ctx, 0);
  return out;
}

// ---- batch norm: per channel (dim 1) over every other dim ----

std::vector<bool> AllButChannel(int rank) {
  std::vector<bool> reduced(rank, true);
  reduced[1] = false;
  return reduced;
}

// Argument i (a [C] tensor, or None: `none`) at channel c.
double ChannelValue(const RefContext& ctx, int i, int64_t c, double none) {
  return ctx.arg(i).is_none() ? none : ctx.tensors[i].GetDoubleAt(c);
}

// Normalizes x with per-channel mean and rstd into `out`, weight and bias
// at args w and b.
void NormalizeChannels(const RefContext& ctx, const HostTensor& x,
                       const std::vector<double>& mean,
                       const std::vector<double>& rstd, int w, int b,
                       HostTensor& out) {
  ops::ForEachIndex(x.sizes(), [&](const std::vector<int64_t>& i) {
    const int64_t c = i[1];
    out.SetDouble(
        i, (x.GetDouble(i) - mean[c]) * rstd[c] * ChannelValue(ctx, w, c, 1.0) +
               ChannelValue(ctx, b, c, 0.0));
  });
}

// Batch mean and biased variance per channel.
void ChannelMoments(const HostTensor& x, std::vector<double>& mean,
                    std::vector<double>& var) {
  ForEachRow(x.sizes(), AllButChannel(x.rank()),
             [&](const std::vector<std::vector<int64_t>>& row) {
               double m = 0, v = 0;
               for (const auto& i : row) m += x.GetDouble(i);
               m /= static_cast<double>(row.size());
               for (const auto& i : row) {
                 v += (x.GetDouble(i) - m) * (x.GetDouble(i) - m);
               }
               mean.push_back(m);
               var.push_back(v / static_cast<double>(row.size()));
             });
}

// Training batch norm (eps at arg `eps`): out, save_mean, save_rstd, and
// the per-channel moments for the running statistics.
std::vector<HostTensor> TrainBatchNorm(const RefContext& ctx, int eps,
                                       std::vector<double>& mean,
                                       std::vector<double>& var) {
  const HostTensor& x = ctx.tensors[0];
  ChannelMoments(x, mean, var);
  std::vector<double> rstd;
  for (double v : var) rstd.push_back(1.0 / std::sqrt(v + ctx.arg(eps).f));
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  NormalizeChannels(ctx, x, mean, rstd, 1, 2, out);
  HostTensor sm = HostTensor::Empty(ctx.out_dtypes[1], ctx.out_sizes[1]);
  HostTensor sr = HostTensor::Empty(ctx.out_dtypes[2], ctx.out_sizes[2]);
  for (size_t c = 0; c < mean.size(); ++c) {
    sm.SetDoubleAt(c, mean[c]);
    sr.SetDoubleAt(c, rstd[c]);
  }
  return {std::move(out), std::move(sm), std::move(sr)};
}

// Eval batch norm from the running statistics at args 3 and 4.
HostTensor EvalBatchNorm(const RefContext& ctx, double eps) {
  const HostTensor& x = ctx.tensors[0];
  std::vector<double> mean, rstd;
  for (int64_t c = 0; c < x.sizes()[1]; ++c) {
    mean.push_back(ctx.tensors[3].GetDoubleAt(c));
    rstd.push_back(1.0 / std::sqrt(ctx.tensors[4].GetDoubleAt(c) + eps));
  }
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  NormalizeChannels(ctx, x, mean, rstd, 1, 2, out);
  return out;
}

absl::StatusOr<std::vector<HostTensor>> BatchNormFunctionalReference(
    const RefContext& ctx) {
  const HostTensor& x = ctx.tensors[0];
  const double momentum = ctx.arg(6).f;
  const HostTensor& rm = ctx.tensors[3];
  const HostTensor& rv = ctx.tensors[4];
  HostTensor new_rm = HostTensor::Empty(ctx.out_dtypes[3], ctx.out_sizes[3]);
  HostTensor new_rv = HostTensor::Empty(ctx.out_dtypes[4], ctx.out_sizes[4]);
  if (!ctx.arg(5).b) {
    std::vector<HostTensor> out{EvalBatchNorm(ctx, ctx.arg(7).f), Zeros(ctx, 1),
                                Zeros(ctx, 2)};
    for (int64_t c = 0; c < rm.numel(); ++c) {
      new_rm.SetDoubleAt(c, rm.GetDoubleAt(c));
      new_rv.SetDoubleAt(c, rv.GetDoubleAt(c));
    }
    out.push_back(std::move(new_rm));
    out.push_back(std::move(new_rv));
    return out;
  }
  std::vector<double> mean, var;
  std::vector<HostTensor> out = TrainBatchNorm(ctx, 7, mean, var);
  // The running variance takes the unbiased estimate (n / (n - 1)).
  const double n = x.sizes()[1] == 0 ? 0
                                     : static_cast<double>(x.numel()) /
                                           static_cast<double>(x.sizes()[1]);
  for (size_t c = 0; c < mean.size(); ++c) {
    new_rm.SetDoubleAt(c,
                       momentum * mean[c] + (1 - momentum) * rm.GetDoubleAt(c));
    new_rv.SetDoubleAt(c, momentum * var[c] * n / (n - 1) +
                              (1 - momentum) * rv.GetDoubleAt(c));
  }
  out.push_back(std::move(new_rm));
  out.push_back(std::move(new_rv));
  return out;
}

absl::StatusOr<std::vector<HostTensor>> BatchNormNoTrainingReference(
    const RefContext& ctx) {
  return std::vector<HostTensor>{EvalBatchNorm(ctx, ctx.arg(6).f),
                                 Zeros(ctx, 1), Zeros(ctx, 2)};
}

absl::StatusOr<std::vector<HostTensor>> BatchNormNoStatsReference(
    const RefContext& ctx) {
  std::vector<double> mean, var;
  return TrainBatchNorm(ctx, 5, mean, var);
}

// dx = rstd * w * (g - mean(g) - xhat * mean(g * xhat)) when training,
// g * rstd * w in eval; dweight = sum(g * xhat), dbias = sum(g).
absl::StatusOr<std::vector<HostTensor>> BatchNormBackwardReference(
    const RefContext& ctx) {
  const HostTensor& g = ctx.tensors[0];
  const HostTensor& x = ctx.tensors[1];
  const bool train = ctx.arg(7).b;
  const double eps = ctx.arg(8).f;
  std::vector<HostTensor> out{Zeros(ctx, 0), Zeros(ctx, 1), Zeros(ctx, 2)};
  int64_t c = 0;
  ForEachRow(
      x.sizes(), AllButChannel(x.rank()),
      [&](const std::vector<std::vector<int64_t>>& row) {
        const double mean = ctx.tensors[train ? 5 : 3].GetDoubleAt(c);
        const double rstd =
            train ? ctx.tensors[6].GetDoubleAt(c)
                  : 1.0 / std::sqrt(ctx.tensors[4].GetDoubleAt(c) + eps);
        const double w = ChannelValue(ctx, 2, c, 1.0);
        const double n = static_cast<double>(row.size());
        double sg = 0, sgx = 0;
        for (const auto& i : row) {
          const double xhat = (x.GetDouble(i) - mean) * rstd;
          sg += g.GetDouble(i);
          sgx += g.GetDouble(i) * xhat;
        }
        for (const auto& i : row) {
          const double xhat = (x.GetDouble(i) - mean) * rstd;
          out[0].SetDouble(
              i, train ? rstd * w * (g.GetDouble(i) - sg / n - xhat * sgx / n)
                       : g.GetDouble(i) * rstd * w);
        }
        out[1].SetDoubleAt(c, sgx);
        out[2].SetDoubleAt(c, sg);
        ++c;
      });
  for (int o = 0; o < 3; ++o) {
    if (!MaskBit(ctx, 9, o)) out[o] = Zeros(ctx, o);
  }
  return out;
}

// ---- group norm: [N, C, *] viewed as [N, group, C / group * HxW] ----

HostTensor GroupView(const HostTensor& t, int64_t group) {
  const HostTensor c = t.Contiguous();
  const int64_t n = t.sizes()[0];
  const int64_t d = n * group == 0 ? 0 : t.numel() / (n * group);
  return HostTensor::View(c, {n, group, d}, {group * d, d, 1}, c.offset());
}

absl::StatusOr<std::vector<HostTensor>> GroupNormReference(
    const RefContext& ctx) {
  const HostTensor& x = ctx.tensors[0];
  const int64_t group = ctx.arg(6).i;
  const int64_t cg = ctx.arg(4).i / group;
  const HostTensor xv = GroupView(x, group);
  HostTensor mean = HostTensor::Empty(ctx.out_dtypes[1], ctx.out_sizes[1]);
  HostTensor rstd = HostTensor::Empty(ctx.out_dtypes[2], ctx.out_sizes[2]);
  std::vector<double> m, r;
  ForEachRow(xv.sizes(), {false, false, true},
             [&](const std::vector<std::vector<int64_t>>& row) {
               double s = 0, v = 0;
               for (const auto& i : row) s += xv.GetDouble(i);
               s /= static_cast<double>(row.size());
               for (const auto& i : row) {
                 v += (xv.GetDouble(i) - s) * (xv.GetDouble(i) - s);
               }
               v /= static_cast<double>(row.size());
               m.push_back(s);
               r.push_back(1.0 / std::sqrt(v + ctx.arg(7).f));
             });
  for (size_t k = 0; k < m.size(); ++k) {
    mean.SetDoubleAt(k, m[k]);
    rstd.SetDoubleAt(k, r[k]);
  }
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  ops::ForEachIndex(x.sizes(), [&](const std::vector<int64_t>& i) {
    const int64_t k = i[0] * group + i[1] / cg;
    out.SetDouble(
        i, (x.GetDouble(i) - m[k]) * r[k] * ChannelValue(ctx, 1, i[1], 1.0) +
               ChannelValue(ctx, 2, i[1], 0.0));
  });
  return std::vector<HostTensor>{std::move(out), std::move(mean),
                                 std::move(rstd)};
}

// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) over each group
// (gw = g * weight[c]); dweight[c] = sum(g * xhat), dbias[c] = sum(g) over
// N and HxW.
absl::StatusOr<std::vector<HostTensor>> GroupNormBackwardReference(
    const RefContext& ctx) {
  const HostTensor& g = ctx.tensors[0];
  const HostTensor& x = ctx.tensors[1];
  const HostTensor& mean = ctx.tensors[2];
  const HostTensor& rstd = ctx.tensors[3];
  const int64_t group = ctx.arg(8).i;
  const int64_t cg = ctx.arg(6).i / group;
  std::vector<HostTensor> out{Zeros(ctx, 0), Zeros(ctx, 1), Zeros(ctx, 2)};
  const int64_t groups = x.sizes()[0] * group;
  std::vector<double> s1(groups, 0), s2(groups, 0), dw(x.sizes()[1], 0),
      db(x.sizes()[1], 0);
  auto at = [&](const std::vector<int64_t>& i) {
    return i[0] * group + i[1] / cg;
  };
  ops::ForEachIndex(x.sizes(), [&](const std::vector<int64_t>& i) {
    const int64_t k = at(i);
    const double xhat =
        (x.GetDouble(i) - mean.GetDoubleAt(k)) * rstd.GetDoubleAt(k);
    const double gw = g.GetDouble(i) * ChannelValue(ctx, 4, i[1], 1.0);
    s1[k] += gw;
    s2[k] += gw * xhat;
    dw[i[1]] += g.GetDouble(i) * xhat;
    db[i[1]] += g.GetDouble(i);
  });
  const double d = groups == 0 ? 1 : static_cast<double>(x.numel()) / groups;
  ops::ForEachIndex(x.sizes(), [&](const std::vector<int64_t>& i) {
    const int64_t k = at(i);
    const double xhat =
        (x.GetDouble(i) - mean.GetDoubleAt(k)) * rstd.GetDoubleAt(k);
    const double gw = g.GetDouble(i) * ChannelValue(ctx, 4, i[1], 1.0);
    out[0].SetDouble(i,
                     rstd.GetDoubleAt(k) * (gw - s1[k] / d - xhat * s2[k] / d));
  });
  for (size_t c = 0; c < dw.size(); ++c) {
    out[1].SetDoubleAt(c, dw[c]);
    out[2].SetDoubleAt(c, db[c]);
  }
  for (int o = 0; o < 3; ++o) {
    if (!MaskBit(ctx, 9, o)) out[o] = Zeros(ctx, o);
  }
  return out;
}

}  // namespace

void RegisterNormReferences(OpReferences& table) {
  table.Add("aten._softmax_backward_data.default", SoftmaxBackwardReference);
  table.Add("aten._log_softmax_backward_data.default",
            LogSoftmaxBackwardReference);
  table.Add("aten.native_layer_norm_backward.default",
            LayerNormBackwardReference);
  table.Add("aten._native_batch_norm_legit_functional.default",
            BatchNormFunctionalReference);
  table.Add("aten._native_batch_norm_legit_no_training.default",
            BatchNormNoTrainingReference);
  table.Add("aten._native_batch_norm_legit.no_stats",
            BatchNormNoStatsReference);
  table.Add("aten.native_batch_norm_backward.default",
            BatchNormBackwardReference);
  table.Add("aten.native_group_norm.default", GroupNormReference);
  table.Add("aten.native_group_norm_backward.default",
            GroupNormBackwardReference);
}

}  // namespace kiln
