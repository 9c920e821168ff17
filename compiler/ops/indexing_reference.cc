// Reference semantics of the indexing ops (signatures in
// graph/ops/indexing.cc): slice and select are strided views over the
// input's storage; cat copies its inputs into a new tensor.
#include <cstdint>
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
  ops::SliceBounds b = ops::ClampSlice(t.sizes()[d], OptionalInt(ctx.arg(2)),
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
  table.Add("aten.cat.default", CatReference);
}

}  // namespace kiln
