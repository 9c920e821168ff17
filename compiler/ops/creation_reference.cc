// Reference semantics of the creation ops (signatures in
// graph/ops/creation.cc): full, scalar_tensor, arange and the *_like and
// empty ops (empty contents are zeros).
#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/creation.h"

namespace kiln {
namespace {

// Every element of `out` set to the scalar `value`.
void Fill(HostTensor& out, const Attr& value) {
  for (int64_t l = 0; l < out.numel(); ++l) {
    if (value.kind == Attr::Kind::kFloat)
      out.SetDoubleAt(l, value.f);
    else
      out.SetIntAt(l, value.kind == Attr::Kind::kBool ? value.b : value.i);
  }
}

absl::StatusOr<std::vector<HostTensor>> FullReference(const RefContext& ctx) {
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  Fill(out, ctx.arg(1));
  return std::vector<HostTensor>{std::move(out)};
}

// A tensor of the output's sizes and dtype filled with `value`.
std::vector<HostTensor> Filled(const RefContext& ctx, const Attr& value) {
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  Fill(out, value);
  return {std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> FullLikeReference(
    const RefContext& ctx) {
  return Filled(ctx, ctx.arg(1));
}

// zeros_like, and empty_like, empty.memory_format and empty_strided, whose
// unspecified contents Kiln gives as zeros.
absl::StatusOr<std::vector<HostTensor>> ZerosReference(const RefContext& ctx) {
  return Filled(ctx, Attr::Int(0));
}

absl::StatusOr<std::vector<HostTensor>> OnesLikeReference(
    const RefContext& ctx) {
  return Filled(ctx, Attr::Int(1));
}

absl::StatusOr<std::vector<HostTensor>> ScalarTensorReference(
    const RefContext& ctx) {
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], {});
  Fill(out, ctx.arg(0));
  return std::vector<HostTensor>{std::move(out)};
}

// arange.default, .start, .start_step: start + i * step, in double.
absl::StatusOr<std::vector<HostTensor>> ArangeReference(const RefContext& ctx) {
  auto [start, end, step] = ops::ArangeRangeOf(ctx.node);
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.SetDoubleAt(i, start + static_cast<double>(i) * step);
  }
  return std::vector<HostTensor>{std::move(out)};
}

}  // namespace

void RegisterCreationReferences(OpReferences& table) {
  table.Add("aten.full.default", FullReference);
  table.Add("aten.scalar_tensor.default", ScalarTensorReference);
  table.Add("aten.arange.default", ArangeReference);
  table.Add("aten.arange.start", ArangeReference);
  table.Add("aten.arange.start_step", ArangeReference);
  table.Add("aten.full_like.default", FullLikeReference);
  table.Add("aten.zeros_like.default", ZerosReference);
  table.Add("aten.ones_like.default", OnesLikeReference);
  table.Add("aten.empty_like.default", ZerosReference);
  table.Add("aten.empty.memory_format", ZerosReference);
  table.Add("aten.empty_strided.default", ZerosReference);
}

}  // namespace kiln
