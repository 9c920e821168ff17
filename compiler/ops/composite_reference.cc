// Reference semantics of the composite family: _softmax, _log_softmax and
// native_layer_norm in double with the textbook formulas (softmax with the
// row's max subtracted; layer norm with the biased variance).
#include <algorithm>
#include <cmath>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"

namespace kiln {
namespace {

using ops::ForEachRow;

absl::StatusOr<std::vector<HostTensor>> SoftmaxOrLogSoftmax(
    const RefContext& ctx, bool log) {
  const HostTensor& in = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  std::vector<bool> reduced(in.rank(), false);
  if (in.rank() > 0) {
    const int64_t d = ctx.arg(1).i;
    reduced[d < 0 ? d + in.rank() : d] = true;
  }
  ForEachRow(in.sizes(), reduced,
             [&](const std::vector<std::vector<int64_t>>& row) {
               double mx = -INFINITY;
               for (const auto& i : row) mx = std::max(mx, in.GetDouble(i));
               // An all -inf row: PyTorch gives NaN (exp(-inf - -inf));
               // keep that.
               double sum = 0;
               for (const auto& i : row) sum += std::exp(in.GetDouble(i) - mx);
               for (const auto& i : row) {
                 const double x = in.GetDouble(i) - mx;
                 out.SetDouble(i, log ? x - std::log(sum) : std::exp(x) / sum);
               }
             });
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> SoftmaxReference(
    const RefContext& ctx) {
  return SoftmaxOrLogSoftmax(ctx, /*log=*/false);
}

absl::StatusOr<std::vector<HostTensor>> LogSoftmaxReference(
    const RefContext& ctx) {
  return SoftmaxOrLogSoftmax(ctx, /*log=*/true);
}

absl::StatusOr<std::vector<HostTensor>> LayerNormReference(
    const RefContext& ctx) {
  const HostTensor& in = ctx.tensors[0];
  const size_t norm_rank = ctx.arg(1).ints.size();
  const size_t axis = in.rank() - norm_rank;
  const double eps = ctx.arg(4).ScalarAsDouble();
  const bool has_w = !ctx.arg(2).is_none(), has_b = !ctx.arg(3).is_none();
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  HostTensor mean = HostTensor::Empty(ctx.out_dtypes[1], ctx.out_sizes[1]);
  HostTensor rstd = HostTensor::Empty(ctx.out_dtypes[2], ctx.out_sizes[2]);
  std::vector<bool> reduced(in.rank(), false);
  for (size_t d = axis; d < static_cast<size_t>(in.rank()); ++d)
    reduced[d] = true;
  int64_t row_index = 0;
  ForEachRow(in.sizes(), reduced,
             [&](const std::vector<std::vector<int64_t>>& row) {
               const double n = static_cast<double>(row.size());
               double m = 0;
               for (const auto& i : row) m += in.GetDouble(i);
               m /= n;
               double var = 0;
               for (const auto& i : row)
                 var += (in.GetDouble(i) - m) * (in.GetDouble(i) - m);
               var /= n;
               const double rs = 1.0 / std::sqrt(var + eps);
               for (const auto& i : row) {
                 std::vector<int64_t> widx(i.begin() + axis, i.end());
                 double y = (in.GetDouble(i) - m) * rs;
                 if (has_w) y *= ctx.tensors[2].GetDouble(widx);
                 if (has_b) y += ctx.tensors[3].GetDouble(widx);
                 out.SetDouble(i, y);
               }
               mean.SetDoubleAt(row_index, m);
               rstd.SetDoubleAt(row_index, rs);
               ++row_index;
             });
  return std::vector<HostTensor>{std::move(out), std::move(mean),
                                 std::move(rstd)};
}

}  // namespace

void RegisterCompositeReferences(OpReferences& table) {
  table.Add("aten._softmax.default", SoftmaxReference);
  table.Add("aten._log_softmax.default", LogSoftmaxReference);
  table.Add("aten.native_layer_norm.default", LayerNormReference);
}

}  // namespace kiln
