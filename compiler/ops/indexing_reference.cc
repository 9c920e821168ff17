// Reference semantics of the indexing ops (signatures in
// graph/ops/indexing.cc): slice and select are strided views over the
// input's storage; cat copies its inputs into a new tensor.
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/indexing.h"
#include "graph/ops/views.h"

namespace kiln {
namespace {

using ops::OptionalInt;
using ops::WrapCheckedDim;

absl::StatusOr<std::vector<HostTensor>> SliceReference(const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  const int d = WrapCheckedDim(ctx.arg(1).i, t.rank());
  const int64_t step = ctx.arg(4).i;
  ops::SliceBounds b =
      ctx.arg(3).kind == Attr::Kind::kInts  // a symbolic end: checked bounds
          ? ops::SliceBounds{OptionalInt(ctx.arg(2)).value_or(0),
                             ctx.out_sizes[0][d]}
          : ops::ClampSlice(t.sizes()[d], OptionalInt(ctx.arg(2)),
                            OptionalInt(ctx.arg(3)), step);
  std::vector<int64_t> sizes = t.sizes(), strides = t.strides();
  sizes[d] = b.length;
  const int64_t offset = t.offset() + b.start * strides[d];
  strides[d] *= step;
  return std::vector<HostTensor>{HostTensor::View(t, sizes, strides, offset)};
}

absl::StatusOr<std::vector<HostTensor>> SelectReference(const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  const int d = WrapCheckedDim(ctx.arg(1).i, t.rank());
  int64_t index = ctx.arg(2).i;
  if (index < 0) index += t.sizes()[d];
  std::vector<int64_t> sizes = t.sizes(), strides = t.strides();
  const int64_t offset = t.offset() + index * strides[d];
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return std::vector<HostTensor>{HostTensor::View(t, sizes, strides, offset)};
}

// slice_scatter / select_scatter: self, with src written over the slice
// (the select) along `dim`: src element i lands at out index i with dim d
// replaced by map(i[d]) (select: inserted).
HostTensor ScatterInto(const RefContext& ctx, int d, bool insert,
                       const std::function<int64_t(int64_t)>& map) {
  const HostTensor& self = ctx.tensors[0];
  const HostTensor& src = ctx.tensors[1];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  ops::ForEachIndex(self.sizes(), [&](const std::vector<int64_t>& i) {
    out.SetDouble(i, self.GetDouble(i));
  });
  ops::ForEachIndex(src.sizes(), [&](const std::vector<int64_t>& i) {
    std::vector<int64_t> o = i;
    if (insert) {
      o.insert(o.begin() + d, map(0));
    } else {
      o[d] = map(i[d]);
    }
    out.SetDouble(o, src.GetDouble(i));
  });
  return out;
}

absl::StatusOr<std::vector<HostTensor>> SliceScatterReference(
    const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  const int d = WrapCheckedDim(ctx.arg(2).i, t.rank());
  const int64_t step = ctx.arg(5).i;
  const ops::SliceBounds b = ops::ClampSlice(
      t.sizes()[d], OptionalInt(ctx.arg(3)), OptionalInt(ctx.arg(4)), step);
  return std::vector<HostTensor>{ScatterInto(
      ctx, d, false, [&](int64_t i) { return b.start + i * step; })};
}

absl::StatusOr<std::vector<HostTensor>> SelectScatterReference(
    const RefContext& ctx) {
  const HostTensor& t = ctx.tensors[0];
  const int d = WrapCheckedDim(ctx.arg(2).i, t.rank());
  int64_t index = ctx.arg(3).i;
  if (index < 0) index += t.sizes()[d];
  return std::vector<HostTensor>{
      ScatterInto(ctx, d, true, [index](int64_t) { return index; })};
}

// cat: each input (but legacy empty 1-D ones) copied at its offset along
// `dim`.
absl::StatusOr<std::vector<HostTensor>> CatReference(const RefContext& ctx) {
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  if (out.numel() == 0) return std::vector<HostTensor>{std::move(out)};
  const int d = WrapCheckedDim(ctx.arg(1).i, out.rank());
  int64_t base = 0;
  for (const HostTensor& t : ctx.tensor_lists[0]) {
    if (t.rank() == 1 && t.sizes()[0] == 0) continue;
    ops::ForEachIndex(t.sizes(), [&](const std::vector<int64_t>& index) {
      std::vector<int64_t> o = index;
      o[d] += base;
      if (IsFloating(out.dtype()))
        out.SetDouble(o, t.GetDouble(index));
      else
        out.SetInt(o, t.GetInt(index));
    });
    base += t.sizes()[d];
  }
  return std::vector<HostTensor>{std::move(out)};
}

}  // namespace

void RegisterIndexingReferences(OpReferences& table) {
  table.Add("aten.slice.Tensor", SliceReference);
  table.Add("aten.select.int", SelectReference);
  table.Add("aten.slice_scatter.default", SliceScatterReference);
  table.Add("aten.select_scatter.default", SelectScatterReference);
  table.Add("aten.cat.default", CatReference);
}

}  // namespace kiln
