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

}  // namespace

void RegisterNormReferences(OpReferences& table) {
  table.Add("aten._softmax_backward_data.default", SoftmaxBackwardReference);
  table.Add("aten._log_softmax_backward_data.default",
            LogSoftmaxBackwardReference);
  table.Add("aten.native_layer_norm_backward.default",
            LayerNormBackwardReference);
}

}  // namespace kiln
