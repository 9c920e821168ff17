// Reference semantics of the matrix products: mm, addmm, bmm, baddbmm in
// double (each product summed in double, rounded once to the output dtype),
// with PyTorch's beta rule: beta = 0 ignores the bias (its NaN and inf do not
// propagate).
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"

namespace kiln {
namespace {

// out[b][i][j] = alpha * sum_k x[b][i][k] * y[b][k][j] (+ beta * bias) for
// 3-D operands; 2-D operands have no batch dim.
HostTensor Product(const RefContext& ctx, int x_arg, int y_arg, int bias_arg,
                   double alpha, double beta) {
  const HostTensor& x = ctx.tensors[x_arg];
  const HostTensor& y = ctx.tensors[y_arg];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const int rank = x.rank();
  const int64_t kk = x.sizes()[rank - 1];
  HostTensor bias;
  if (bias_arg >= 0 && beta != 0)
    bias = ops::BroadcastTo(ctx.tensors[bias_arg], ctx.out_sizes[0]);
  ops::ForEachIndex(ctx.out_sizes[0], [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> xi = o, yi = o;
    double sum = 0;
    for (int64_t k = 0; k < kk; ++k) {
      xi[rank - 1] = k;
      yi[rank - 2] = k;
      sum += x.GetDouble(xi) * y.GetDouble(yi);
    }
    double v = alpha * sum;
    if (bias_arg >= 0 && beta != 0) v += beta * bias.GetDouble(o);
    out.SetDouble(o, v);
  });
  return out;
}

absl::StatusOr<std::vector<HostTensor>> MmReference(const RefContext& ctx) {
  return std::vector<HostTensor>{Product(ctx, 0, 1, -1, 1, 0)};
}

absl::StatusOr<std::vector<HostTensor>> AddmmReference(const RefContext& ctx) {
  return std::vector<HostTensor>{Product(
      ctx, 1, 2, 0, ctx.arg(4).ScalarAsDouble(), ctx.arg(3).ScalarAsDouble())};
}

}  // namespace

void RegisterMatmulReferences(OpReferences& table) {
  table.Add("aten.mm.default", MmReference);
  table.Add("aten.addmm.default", AddmmReference);
  table.Add("aten.bmm.default", MmReference);
  table.Add("aten.baddbmm.default", AddmmReference);
}

}  // namespace kiln
