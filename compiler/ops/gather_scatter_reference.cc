// Reference semantics of the gather/scatter ops (signatures in
// graph/ops/gather_scatter.cc): plain loops over the output reading the
// source at the index the index tensor gives. An index outside [-n, n) is
// OUT_OF_RANGE naming the op, as PyTorch raises an IndexError (compiled
// code reports the same, see gather_scatter_lowering.cc); negative
// indices count from the end (index, index_select, gather, embedding do not
// wrap in PyTorch's kernels for all devices, but the CPU ones of
// index/index_put do; Kiln wraps everywhere, the reference too).
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/gather_scatter.h"
#include "graph/ops/views.h"

namespace kiln {
namespace {

using ops::ForEachIndex;
using ops::WrapCheckedDim;

// Index value `i` checked against a dim of size n and wrapped.
absl::StatusOr<int64_t> CheckedIndex(const RefContext& ctx, int64_t i,
                                     int64_t n) {
  if (i < -n || i >= n) {
    return absl::OutOfRangeError(absl::StrCat(
        ctx.node.op->name, ": index ", i, " is out of bounds for size ", n));
  }
  return i < 0 ? i + n : i;
}

// Copies element `from` of `src` into element `to` of `dst`.
void CopyElement(const HostTensor& src, const std::vector<int64_t>& from,
                 HostTensor& dst, const std::vector<int64_t>& to) {
  if (IsFloating(dst.dtype()))
    dst.SetDouble(to, src.GetDouble(from));
  else
    dst.SetInt(to, src.GetInt(from));
}

absl::StatusOr<std::vector<HostTensor>> EmbeddingReference(
    const RefContext& ctx) {
  const HostTensor& weight = ctx.tensors[0];
  const HostTensor& indices = ctx.tensors[1];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  absl::Status status;
  ForEachIndex(indices.sizes(), [&](const std::vector<int64_t>& t) {
    auto row = CheckedIndex(ctx, indices.GetInt(t), weight.sizes()[0]);
    if (!row.ok()) {
      status.Update(row.status());
      return;
    }
    for (int64_t d = 0; d < weight.sizes()[1]; ++d) {
      std::vector<int64_t> o = t;
      o.push_back(d);
      CopyElement(weight, {*row, d}, out, o);
    }
  });
  if (!status.ok()) return status;
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> IndexSelectReference(
    const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  const HostTensor& index = ctx.tensors[2];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const int d = WrapCheckedDim(ctx.arg(1).i, self.rank());
  absl::Status status;
  ForEachIndex(out.sizes(), [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> from = o;
    if (self.rank() > 0) {
      const int64_t k =
          index.rank() == 0 ? index.GetInt({}) : index.GetInt({o[d]});
      auto i = CheckedIndex(ctx, k, self.sizes()[d]);
      if (!i.ok()) return status.Update(i.status());
      from[d] = *i;
    } else {
      auto i = CheckedIndex(ctx, index.GetIntAt(0), 1);
      if (!i.ok()) return status.Update(i.status());
    }
    CopyElement(self, from, out, o);
  });
  if (!status.ok()) return status;
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> GatherReference(const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  const HostTensor& index = ctx.tensors[2];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const int d = WrapCheckedDim(ctx.arg(1).i, self.rank());
  absl::Status status;
  ForEachIndex(out.sizes(), [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> from = o;
    const int64_t n = self.rank() == 0 ? 1 : self.sizes()[d];
    auto i = CheckedIndex(ctx, index.GetInt(o), n);
    if (!i.ok()) return status.Update(i.status());
    if (self.rank() > 0) from[d] = *i;
    CopyElement(self, from, out, o);
  });
  if (!status.ok()) return status;
  return std::vector<HostTensor>{std::move(out)};
}

// index.Tensor: the k index tensors broadcast to B; out[b, rest] =
// self[idx_0[b], ..., idx_{k-1}[b], rest].
absl::StatusOr<std::vector<HostTensor>> IndexTensorReference(
    const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  const std::vector<HostTensor>& idx = ctx.tensor_lists[1];
  const int k = static_cast<int>(idx.size());
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const int b_rank = out.rank() - (self.rank() - k);
  const std::vector<int64_t> b_sizes(out.sizes().begin(),
                                     out.sizes().begin() + b_rank);
  std::vector<HostTensor> bidx;
  for (const HostTensor& t : idx) bidx.push_back(ops::BroadcastTo(t, b_sizes));
  absl::Status status;
  ForEachIndex(out.sizes(), [&](const std::vector<int64_t>& o) {
    const std::vector<int64_t> b(o.begin(), o.begin() + b_rank);
    std::vector<int64_t> from;
    for (int j = 0; j < k; ++j) {
      auto i = CheckedIndex(ctx, bidx[j].GetInt(b), self.sizes()[j]);
      if (!i.ok()) return status.Update(i.status());
      from.push_back(*i);
    }
    from.insert(from.end(), o.begin() + b_rank, o.end());
    CopyElement(self, from, out, o);
  });
  if (!status.ok()) return status;
  return std::vector<HostTensor>{std::move(out)};
}

// masked_fill: value (a scalar or a 0-dim tensor) where mask, else self.
absl::StatusOr<std::vector<HostTensor>> MaskedFillReference(
    const RefContext& ctx) {
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const HostTensor self = ops::BroadcastTo(ctx.tensors[0], out.sizes());
  const HostTensor mask = ops::BroadcastTo(ctx.tensors[1], out.sizes());
  const bool is_tensor = ctx.arg(2).kind == Attr::Kind::kTensor;
  const double fv =
      is_tensor ? ctx.tensors[2].GetDoubleAt(0) : ctx.arg(2).ScalarAsDouble();
  const int64_t iv =
      is_tensor ? ctx.tensors[2].GetIntAt(0)
      : ctx.arg(2).kind == Attr::Kind::kFloat
          ? static_cast<int64_t>(ctx.arg(2).f)
          : (ctx.arg(2).kind == Attr::Kind::kBool ? ctx.arg(2).b
                                                  : ctx.arg(2).i);
  const int64_t stored =
      out.dtype() == DType::kBool ? static_cast<int64_t>(fv != 0) : iv;
  ForEachIndex(out.sizes(), [&](const std::vector<int64_t>& o) {
    if (mask.GetInt(o) == 0) {
      CopyElement(self, o, out, o);
    } else if (IsFloating(out.dtype())) {
      out.SetDouble(o, fv);
    } else {
      out.SetInt(o, stored);
    }
  });
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> ConstantPadReference(
    const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  std::vector<int64_t> pad;
  for (const SymExpr& p : ctx.arg(1).ints) pad.push_back(*p.AsConstant());
  const std::vector<ops::PadPair> pp = ops::PadPairs(pad, self.rank());
  const Attr& value = ctx.arg(2);
  ForEachIndex(out.sizes(), [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> from = o;
    bool inside = true;
    for (int d = 0; d < self.rank(); ++d) {
      from[d] = o[d] - pp[d].before;
      inside = inside && from[d] >= 0 && from[d] < self.sizes()[d];
    }
    if (inside) {
      CopyElement(self, from, out, o);
    } else if (IsFloating(out.dtype())) {
      out.SetDouble(o, value.ScalarAsDouble());
    } else {
      const int64_t v =
          value.kind == Attr::Kind::kFloat
              ? static_cast<int64_t>(value.f)
              : (value.kind == Attr::Kind::kBool ? value.b : value.i);
      out.SetInt(o,
                 out.dtype() == DType::kBool ? value.ScalarAsDouble() != 0 : v);
    }
  });
  return std::vector<HostTensor>{std::move(out)};
}

// The per-sample class and weight of nll_loss: (class, weight), weight 0
// for ignore_index; an out-of-range class is OUT_OF_RANGE.
struct NllSample {
  int64_t cls;
  double weight;
  bool ignored;
};
absl::StatusOr<std::vector<NllSample>> NllSamples(
    const RefContext& ctx, const HostTensor& self, const HostTensor& target,
    const Attr& weight_arg, const HostTensor& weight, int64_t ignore_index) {
  const int64_t classes = self.sizes().back();
  std::vector<NllSample> out;
  for (int64_t i = 0; i < std::max<int64_t>(target.numel(), 1); ++i) {
    if (target.numel() == 0) break;
    const int64_t t = target.GetIntAt(i);
    if (t == ignore_index) {
      out.push_back({0, 0.0, true});
      continue;
    }
    if (t < 0 || t >= classes) {
      return absl::OutOfRangeError(absl::StrCat(ctx.node.op->name, ": Target ",
                                                t, " is out of bounds."));
    }
    out.push_back(
        {t, weight_arg.is_none() ? 1.0 : weight.GetDoubleAt(t), false});
  }
  return out;
}

absl::StatusOr<std::vector<HostTensor>> NllLossForwardReference(
    const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  auto samples = NllSamples(ctx, self, ctx.tensors[1], ctx.arg(2),
                            ctx.tensors[2], ctx.arg(4).i);
  if (!samples.ok()) return samples.status();
  const auto reduction = static_cast<ops::LossReduction>(ctx.arg(3).i);
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  HostTensor total = HostTensor::Empty(ctx.out_dtypes[1], {});
  double sum = 0, wsum = 0;
  for (size_t i = 0; i < samples->size(); ++i) {
    const NllSample& s = (*samples)[i];
    const double x = s.ignored ? 0.0
                     : self.rank() == 2
                         ? self.GetDouble({static_cast<int64_t>(i), s.cls})
                         : self.GetDouble({s.cls});
    const double v = s.ignored ? 0.0 : -s.weight * x;
    if (reduction == ops::LossReduction::kNone && self.rank() == 2)
      out.SetDoubleAt(static_cast<int64_t>(i), v);
    sum += v;
    wsum += s.weight;
  }
  if (reduction == ops::LossReduction::kNone) {
    if (self.rank() == 1) out.SetDoubleAt(0, sum);
    total.SetDoubleAt(0, 0);
  } else {
    out.SetDoubleAt(0,
                    reduction == ops::LossReduction::kMean ? sum / wsum : sum);
    total.SetDoubleAt(0, wsum);
  }
  return std::vector<HostTensor>{std::move(out), std::move(total)};
}

absl::StatusOr<std::vector<HostTensor>> NllLossBackwardReference(
    const RefContext& ctx) {
  const HostTensor& grad = ctx.tensors[0];
  const HostTensor& self = ctx.tensors[1];
  auto samples = NllSamples(ctx, self, ctx.tensors[2], ctx.arg(3),
                            ctx.tensors[3], ctx.arg(5).i);
  if (!samples.ok()) return samples.status();
  const auto reduction = static_cast<ops::LossReduction>(ctx.arg(4).i);
  const double total = ctx.tensors[6].GetDoubleAt(0);
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t e = 0; e < out.numel(); ++e) out.SetDoubleAt(e, 0);
  for (size_t i = 0; i < samples->size(); ++i) {
    const NllSample& s = (*samples)[i];
    if (s.ignored) continue;
    double g = grad.rank() == 1 ? grad.GetDoubleAt(static_cast<int64_t>(i))
                                : grad.GetDoubleAt(0);
    if (reduction == ops::LossReduction::kMean) g /= total;
    const double v = -s.weight * g;
    if (self.rank() == 2)
      out.SetDouble({static_cast<int64_t>(i), s.cls}, v);
    else
      out.SetDouble({s.cls}, v);
  }
  return std::vector<HostTensor>{std::move(out)};
}

// embedding_dense_backward: grad_weight[v] = sum over positions t with
// indices[t] == v (!= padding_idx) of grad_output[t], in index order;
// scale_grad_by_freq divides by the number of such t.
absl::StatusOr<std::vector<HostTensor>> EmbeddingBackwardReference(
    const RefContext& ctx) {
  const HostTensor& grad = ctx.tensors[0];
  const HostTensor& indices = ctx.tensors[1];
  const int64_t v = ctx.arg(2).i, padding = ctx.arg(3).i;
  const bool scale = ctx.arg(4).b;
  const int64_t dim = ctx.out_sizes[0][1];
  std::vector<double> acc(v * dim, 0.0);
  std::vector<int64_t> count(v, 0);
  absl::Status status;
  ForEachIndex(indices.sizes(), [&](const std::vector<int64_t>& t) {
    auto row = CheckedIndex(ctx, indices.GetInt(t), v);
    if (!row.ok()) return status.Update(row.status());
    if (padding >= 0 && indices.GetInt(t) == padding) return;
    ++count[*row];
    std::vector<int64_t> g = t;
    g.push_back(0);
    for (int64_t d = 0; d < dim; ++d) {
      g.back() = d;
      acc[*row * dim + d] += grad.GetDouble(g);
    }
  });
  if (!status.ok()) return status;
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t r = 0; r < v; ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      double x = acc[r * dim + d];
      if (scale && count[r] > 0) x /= static_cast<double>(count[r]);
      out.SetDoubleAt(r * dim + d, x);
    }
  }
  return std::vector<HostTensor>{std::move(out)};
}

// scatter / scatter_add: for each position q of index, the element of self
// at q with dim `dim` replaced by index[q] takes src[q] (or value);
// scatter_add adds them (in index order), scatter keeps the last.
absl::StatusOr<std::vector<HostTensor>> ScatterCommon(const RefContext& ctx,
                                                      bool add) {
  const HostTensor& self = ctx.tensors[0];
  const HostTensor& index = ctx.tensors[2];
  const bool has_src = ctx.arg(3).kind == Attr::Kind::kTensor;
  HostTensor out = self.Contiguous();
  const int d = WrapCheckedDim(ctx.arg(1).i, self.rank());
  const bool fp = IsFloating(out.dtype());
  std::vector<double> sum(out.numel(), 0.0);
  std::vector<int64_t> isum(out.numel(), 0);
  for (int64_t e = 0; e < out.numel(); ++e) {
    sum[e] = out.GetDoubleAt(e);
    isum[e] = out.GetIntAt(e);
  }
  absl::Status status;
  ForEachIndex(index.sizes(), [&](const std::vector<int64_t>& q) {
    const int64_t n = self.rank() == 0 ? 1 : self.sizes()[d];
    auto i = CheckedIndex(ctx, index.GetInt(q), n);
    if (!i.ok()) return status.Update(i.status());
    std::vector<int64_t> p = q;
    if (self.rank() > 0) p[d] = *i;
    int64_t flat = 0;
    for (int k = 0; k < self.rank(); ++k) flat = flat * self.sizes()[k] + p[k];
    const double fv =
        has_src ? ctx.tensors[3].GetDouble(q) : ctx.arg(3).ScalarAsDouble();
    const int64_t iv =
        has_src ? ctx.tensors[3].GetInt(q) : static_cast<int64_t>(fv);
    if (add) {
      sum[flat] += fv;
      isum[flat] += iv;
    } else {
      sum[flat] = fv;
      isum[flat] = out.dtype() == DType::kBool ? fv != 0 : iv;
    }
  });
  if (!status.ok()) return status;
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (fp)
      out.SetDoubleAt(e, sum[e]);
    else
      out.SetIntAt(e, isum[e]);
  }
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> ScatterAddReference(
    const RefContext& ctx) {
  return ScatterCommon(ctx, /*add=*/true);
}
absl::StatusOr<std::vector<HostTensor>> ScatterReference(
    const RefContext& ctx) {
  return ScatterCommon(ctx, /*add=*/false);
}

// index_put: values (broadcast to the indexed shape B + rest) written, or
// added in row-major order of B, at self[idx_0[b], ..., rest].
absl::StatusOr<std::vector<HostTensor>> IndexPutReference(
    const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  const std::vector<HostTensor>& idx = ctx.tensor_lists[1];
  const bool accumulate = ctx.arg(3).b;
  const int k = static_cast<int>(idx.size());
  std::vector<int64_t> b_sizes;
  for (const HostTensor& t : idx) {
    const std::vector<int64_t>& s = t.sizes();
    const size_t rank = std::max(b_sizes.size(), s.size());
    std::vector<int64_t> r(rank, 1);
    for (size_t j = 0; j < rank; ++j) {
      const int64_t x =
          j < rank - b_sizes.size() ? 1 : b_sizes[j - (rank - b_sizes.size())];
      const int64_t y = j < rank - s.size() ? 1 : s[j - (rank - s.size())];
      r[j] = x == 1 ? y : x;
    }
    b_sizes = r;
  }
  std::vector<int64_t> full = b_sizes;
  full.insert(full.end(), self.sizes().begin() + k, self.sizes().end());
  const HostTensor values = ops::BroadcastTo(ctx.tensors[2], full);
  std::vector<HostTensor> bidx;
  for (const HostTensor& t : idx) bidx.push_back(ops::BroadcastTo(t, b_sizes));
  HostTensor out = self.Contiguous();
  const bool fp = IsFloating(out.dtype());
  std::vector<double> acc(out.numel());
  std::vector<int64_t> iacc(out.numel());
  for (int64_t e = 0; e < out.numel(); ++e) {
    acc[e] = out.GetDoubleAt(e);
    iacc[e] = out.GetIntAt(e);
  }
  absl::Status status;
  ForEachIndex(full, [&](const std::vector<int64_t>& o) {
    const std::vector<int64_t> b(o.begin(), o.begin() + b_sizes.size());
    std::vector<int64_t> p;
    for (int j = 0; j < k; ++j) {
      auto i = CheckedIndex(ctx, bidx[j].GetInt(b), self.sizes()[j]);
      if (!i.ok()) return status.Update(i.status());
      p.push_back(*i);
    }
    p.insert(p.end(), o.begin() + b_sizes.size(), o.end());
    int64_t flat = 0;
    for (int j = 0; j < self.rank(); ++j) flat = flat * self.sizes()[j] + p[j];
    if (accumulate) {
      acc[flat] += values.GetDouble(o);
      iacc[flat] += values.GetInt(o);
    } else {
      acc[flat] = values.GetDouble(o);
      iacc[flat] = values.GetInt(o);
    }
  });
  if (!status.ok()) return status;
  for (int64_t e = 0; e < out.numel(); ++e) {
    if (fp)
      out.SetDoubleAt(e, acc[e]);
    else
      out.SetIntAt(e, iacc[e]);
  }
  return std::vector<HostTensor>{std::move(out)};
}

// flip: self read at n - 1 - i along each flipped dim.
absl::StatusOr<std::vector<HostTensor>> FlipReference(const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  std::vector<bool> flip(self.rank(), false);
  for (const SymExpr& e : ctx.arg(1).ints) {
    if (self.rank() > 0)
      flip[WrapCheckedDim(*e.AsConstant(), self.rank())] = true;
  }
  ForEachIndex(out.sizes(), [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> from = o;
    for (int d = 0; d < self.rank(); ++d) {
      if (flip[d]) from[d] = self.sizes()[d] - 1 - o[d];
    }
    CopyElement(self, from, out, o);
  });
  return std::vector<HostTensor>{std::move(out)};
}

// cumsum: running sums along `dim` in double (floating) or int64.
absl::StatusOr<std::vector<HostTensor>> CumsumReference(const RefContext& ctx) {
  const HostTensor& self = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const int d = WrapCheckedDim(ctx.arg(1).i, self.rank());
  const bool fp = IsFloating(out.dtype());
  ForEachIndex(out.sizes(), [&](const std::vector<int64_t>& o) {
    std::vector<int64_t> q = o;
    double s = 0;
    int64_t is = 0;
    const int64_t upto = self.rank() == 0 ? 0 : o[d];
    for (int64_t k = 0; k <= upto; ++k) {
      if (self.rank() > 0) q[d] = k;
      s += self.GetDouble(q);
      is += self.GetInt(q);
    }
    if (fp)
      out.SetDouble(o, s);
    else
      out.SetInt(o, is);
  });
  return std::vector<HostTensor>{std::move(out)};
}

}  // namespace

void RegisterGatherScatterReferences(OpReferences& table) {
  table.Add("aten.embedding.default", EmbeddingReference);
  table.Add("aten.index_select.default", IndexSelectReference);
  table.Add("aten.gather.default", GatherReference);
  table.Add("aten.index.Tensor", IndexTensorReference);
  table.Add("aten.masked_fill.Scalar", MaskedFillReference);
  table.Add("aten.masked_fill.Tensor", MaskedFillReference);
  table.Add("aten.constant_pad_nd.default", ConstantPadReference);
  table.Add("aten.nll_loss_forward.default", NllLossForwardReference);
  table.Add("aten.nll_loss_backward.default", NllLossBackwardReference);
  table.Add("aten.embedding_dense_backward.default",
            EmbeddingBackwardReference);
  table.Add("aten.scatter_add.default", ScatterAddReference);
  table.Add("aten.scatter.src", ScatterReference);
  table.Add("aten.scatter.value", ScatterReference);
  table.Add("aten.index_put.default", IndexPutReference);
  table.Add("aten.cumsum.default", CumsumReference);
  table.Add("aten.flip.default", FlipReference);
}

}  // namespace kiln
