// Reference semantics of the views and copies (signatures in
// graph/ops/views.cc). They build real strided views over the input's
// storage, so the evaluator exercises the same index arithmetic the loop IR
// must get right; reshape of a non-contiguous value copies, as PyTorch's
// does.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/views.h"

namespace kiln {
namespace {

using ops::WrapCheckedDim;

// `t` with its dims in the order `perm`.
HostTensor Permuted(const HostTensor& t, const std::vector<int>& perm) {
  std::vector<int64_t> sizes, strides;
  for (int p : perm) {
    sizes.push_back(t.sizes()[p]);
    strides.push_back(t.strides()[p]);
  }
  return HostTensor::View(t, sizes, strides, t.offset());
}

// view, reshape, _unsafe_view: a contiguous view, of a copy when the input
// is not contiguous.
absl::StatusOr<std::vector<HostTensor>> ViewReference(const RefContext& ctx) {
  HostTensor c = ctx.tensors[0].IsContiguous() ? ctx.tensors[0]
                                               : ctx.tensors[0].Contiguous();
  const std::vector<int64_t>& sizes = ctx.out_sizes[0];
  std::vector<int64_t> strides(sizes.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    strides[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  return std::vector<HostTensor>{
      HostTensor::View(c, sizes, strides, c.offset())};
}

absl::StatusOr<std::vector<HostTensor>> PermuteReference(
    const RefContext& ctx) {
  const int rank = ctx.tensors[0].rank();
  std::vector<int> perm;
  for (const SymExpr& e : ctx.arg(1).ints)
    perm.push_back(WrapCheckedDim(*e.AsConstant(), rank));
  return std::vector<HostTensor>{Permuted(ctx.tensors[0], perm)};
}

absl::StatusOr<std::vector<HostTensor>> TransposeReference(
    const RefContext& ctx) {
  const int rank = ctx.tensors[0].rank();
  return std::vector<HostTensor>{Permuted(
      ctx.tensors[0],
      ops::TransposePermutation(rank, WrapCheckedDim(ctx.arg(1).i, rank),
                                WrapCheckedDim(ctx.arg(2).i, rank)))};
}

absl::StatusOr<std::vector<HostTensor>> TReference(const RefContext& ctx) {
  const int rank = ctx.tensors[0].rank();
  return std::vector<HostTensor>{Permuted(
      ctx.tensors[0], rank == 2 ? std::vector<int>{1, 0}
                                : ops::TransposePermutation(rank, 0, 0))};
}

absl::StatusOr<std::vector<HostTensor>> ExpandReference(const RefContext& ctx) {
  return std::vector<HostTensor>{
      ops::BroadcastTo(ctx.tensors[0], ctx.out_sizes[0])};
}

// repeat: each output element copies self at its index modulo self's sizes.
absl::StatusOr<std::vector<HostTensor>> RepeatReference(const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  const size_t lead = ctx.out_sizes[0].size() - t.sizes().size();
  ops::ForEachIndex(ctx.out_sizes[0], [&](const std::vector<int64_t>& i) {
    std::vector<int64_t> j;
    for (size_t d = 0; d < t.sizes().size(); ++d)
      j.push_back(i[lead + d] % t.sizes()[d]);
    if (IsFloating(t.dtype())) {
      out.SetDouble(i, t.GetDouble(j));
    } else {
      out.SetInt(i, t.GetInt(j));
    }
  });
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> UnsqueezeReference(
    const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  const int d = WrapCheckedDim(ctx.arg(1).i, t.rank() + 1);
  std::vector<int64_t> sizes = t.sizes(), strides = t.strides();
  const int64_t stride = d < t.rank() ? sizes[d] * strides[d] : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return std::vector<HostTensor>{
      HostTensor::View(t, sizes, strides, t.offset())};
}

// squeeze.default, .dim, .dims. The shape rule drops the selected dims of
// static size 1; a compound symbolic size (s0 - 1) may also be 1 here, and
// stays. Which size-1 dims go does not change a value, so this drops the
// first selected ones until the rank is the inferred one.
absl::StatusOr<std::vector<HostTensor>> SqueezeReference(
    const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  std::vector<bool> sel = *ops::SqueezedDims(ctx.node, t.rank(), nullptr);
  std::vector<int64_t> sizes, strides;
  int64_t drop = t.rank() - static_cast<int64_t>(ctx.out_sizes[0].size());
  for (int d = 0; d < t.rank(); ++d) {
    if (drop > 0 && sel[d] && t.sizes()[d] == 1) {
      --drop;
      continue;
    }
    sizes.push_back(t.sizes()[d]);
    strides.push_back(t.strides()[d]);
  }
  return std::vector<HostTensor>{
      HostTensor::View(t, sizes, strides, t.offset())};
}

// as_strided: a strided view of self's row-major elements (of a contiguous
// copy when self is not contiguous), as PyTorch's over a contiguous tensor.
absl::StatusOr<std::vector<HostTensor>> AsStridedReference(
    const RefContext& ctx) {
  const HostTensor c = ctx.tensors[0].IsContiguous()
                           ? ctx.tensors[0]
                           : ctx.tensors[0].Contiguous();
  const ops::StridedView view =
      *ops::StridedViewOf(ctx.node, 1, c.numel(), false, nullptr);
  return std::vector<HostTensor>{
      HostTensor::View(c, view.sizes, view.strides, c.offset() + view.offset)};
}

// Copies `from` into `to` element by element (same sizes).
void CopyElements(const HostTensor& from, HostTensor& to) {
  ops::ForEachIndex(from.sizes(), [&](const std::vector<int64_t>& i) {
    if (IsFloating(from.dtype())) {
      to.SetDouble(i, from.GetDouble(i));
    } else {
      to.SetInt(i, from.GetInt(i));
    }
  });
}

// as_strided_scatter: a contiguous copy of self with src written through
// the strided view.
absl::StatusOr<std::vector<HostTensor>> AsStridedScatterReference(
    const RefContext& ctx) {
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  CopyElements(ctx.tensors[0], out);
  const ops::StridedView view =
      *ops::StridedViewOf(ctx.node, 2, out.numel(), true, nullptr);
  HostTensor window = HostTensor::View(out, view.sizes, view.strides,
                                       out.offset() + view.offset);
  CopyElements(ctx.tensors[1], window);
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> CloneReference(const RefContext& ctx) {
  return std::vector<HostTensor>{ctx.tensors[0].Contiguous()};
}

// alias: the value itself, a view of the same storage.
absl::StatusOr<std::vector<HostTensor>> AliasReference(const RefContext& ctx) {
  return std::vector<HostTensor>{ctx.tensors[0]};
}

// copy: src broadcast to self's sizes and converted to self's dtype
// (HostTensor's load and store conversions are the cast, as _to_copy's).
absl::StatusOr<std::vector<HostTensor>> CopyReference(const RefContext& ctx) {
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  CopyElements(ops::BroadcastTo(ctx.tensors[1], ctx.out_sizes[0]), out);
  return std::vector<HostTensor>{std::move(out)};
}

// split.Tensor, split_with_sizes: consecutive views along the dim.
absl::StatusOr<std::vector<HostTensor>> SplitReference(const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  const int d = WrapCheckedDim(ctx.arg(ops::SplitDimArg(ctx.node)).i, t.rank());
  std::vector<HostTensor> out;
  int64_t at = 0;
  for (const std::vector<int64_t>& sizes : ctx.out_sizes) {
    out.push_back(HostTensor::View(t, sizes, t.strides(),
                                   t.offset() + at * t.strides()[d]));
    at += sizes[d];
  }
  return out;
}

// unbind.int: the selects of every index of the dim.
absl::StatusOr<std::vector<HostTensor>> UnbindReference(const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  const int d = WrapCheckedDim(ctx.arg(1).i, t.rank());
  std::vector<int64_t> strides = t.strides();
  strides.erase(strides.begin() + d);
  std::vector<HostTensor> out;
  for (size_t o = 0; o < ctx.out_sizes.size(); ++o) {
    out.push_back(HostTensor::View(
        t, ctx.out_sizes[o], strides,
        t.offset() + static_cast<int64_t>(o) * t.strides()[d]));
  }
  return out;
}

}  // namespace

void RegisterViewReferences(OpReferences& table) {
  table.Add("aten.view.default", ViewReference);
  table.Add("aten.reshape.default", ViewReference);
  table.Add("aten._unsafe_view.default", ViewReference);
  table.Add("aten.permute.default", PermuteReference);
  table.Add("aten.transpose.int", TransposeReference);
  table.Add("aten.t.default", TReference);
  table.Add("aten.expand.default", ExpandReference);
  table.Add("aten.repeat.default", RepeatReference);
  table.Add("aten.unsqueeze.default", UnsqueezeReference);
  table.Add("aten.squeeze.default", SqueezeReference);
  table.Add("aten.squeeze.dim", SqueezeReference);
  table.Add("aten.squeeze.dims", SqueezeReference);
  table.Add("aten.as_strided.default", AsStridedReference);
  table.Add("aten.as_strided_scatter.default", AsStridedScatterReference);
  table.Add("aten.lift_fresh_copy.default", CloneReference);
  table.Add("aten.clone.default", CloneReference);
  table.Add("aten.alias.default", AliasReference);
  table.Add("aten.copy.default", CopyReference);
  table.Add("aten.split.Tensor", SplitReference);
  table.Add("aten.split_with_sizes.default", SplitReference);
  table.Add("aten.unbind.int", UnbindReference);
}

}  // namespace kiln
