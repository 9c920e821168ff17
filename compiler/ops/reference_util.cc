#include "compiler/ops/reference_util.h"

#include "graph/dtype.h"

namespace kiln::ops {

HostTensor BroadcastTo(const HostTensor& t, const std::vector<int64_t>& sizes) {
  const int rank = static_cast<int>(sizes.size());
  const int lead = rank - t.rank();
  std::vector<int64_t> strides(rank, 0);
  for (int d = 0; d < t.rank(); ++d) {
    strides[lead + d] = t.sizes()[d] == sizes[lead + d] ? t.strides()[d] : 0;
  }
  return HostTensor::View(t, sizes, strides, t.offset());
}

void ForEachIndex(const std::vector<int64_t>& sizes,
                  const std::function<void(const std::vector<int64_t>&)>& fn) {
  for (int64_t s : sizes) {
    if (s == 0) return;
  }
  std::vector<int64_t> index(sizes.size(), 0);
  while (true) {
    fn(index);
    int d = static_cast<int>(sizes.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

HostTensor Elementwise(const RefContext& ctx, const std::vector<int>& operands,
                       DType compute, const FloatFn& fd, const IntFn& fi) {
  const std::vector<int64_t>& sizes = ctx.out_sizes[0];
  const DType out_dtype = ctx.out_dtypes[0];
  HostTensor out = HostTensor::Empty(out_dtype, sizes);
  const bool floating = IsFloating(compute);

  // Each operand: a broadcast tensor view, or a scalar value.
  struct Operand {
    bool is_tensor = false;
    HostTensor view;
    double fv = 0;
    int64_t iv = 0;
  };
  std::vector<Operand> ops(operands.size());
  for (size_t k = 0; k < operands.size(); ++k) {
    const Attr& a = ctx.arg(operands[k]);
    if (a.kind == Attr::Kind::kTensor) {
      ops[k].is_tensor = true;
      ops[k].view = BroadcastTo(ctx.tensors[operands[k]], sizes);
    } else {
      // A Python scalar converts to the compute dtype like a cast, except
      // that float16/bfloat16 ops keep it in float32 (PyTorch's opmath:
      // half * 0.3 multiplies by 0.3f, not by 0.3 rounded to half).
      if (floating) {
        ops[k].fv = RoundToDType(a.ScalarAsDouble(), DType::kFloat32);
      } else if (a.kind == Attr::Kind::kFloat) {
        ops[k].iv = CastDoubleToInt(a.f, compute);
      } else {
        ops[k].iv = WrapInt(a.kind == Attr::Kind::kBool ? a.b : a.i, compute);
      }
    }
  }
  std::vector<double> fargs(ops.size());
  std::vector<int64_t> iargs(ops.size());
  const int64_t n = out.numel();
  for (int64_t l = 0; l < n; ++l) {
    if (floating) {
      for (size_t k = 0; k < ops.size(); ++k) {
        fargs[k] = ops[k].is_tensor
                       ? RoundToDType(ops[k].view.GetDoubleAt(l), compute)
                       : ops[k].fv;
      }
      out.SetDoubleAt(l, fd(fargs.data()));
    } else {
      for (size_t k = 0; k < ops.size(); ++k) {
        iargs[k] = ops[k].is_tensor ? WrapInt(ops[k].view.GetIntAt(l), compute)
                                    : ops[k].iv;
      }
      out.SetIntAt(l, fi(iargs.data()));
    }
  }
  return out;
}

void ForEachRow(
    const std::vector<int64_t>& sizes, const std::vector<bool>& reduced,
    const std::function<void(const std::vector<std::vector<int64_t>>&)>& fn) {
  std::vector<int64_t> outer = sizes, inner(sizes.size(), 1);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (reduced[d]) {
      outer[d] = 1;
      inner[d] = sizes[d];
    }
  }
  ForEachIndex(outer, [&](const std::vector<int64_t>& o) {
    std::vector<std::vector<int64_t>> row;
    ForEachIndex(inner, [&](const std::vector<int64_t>& i) {
      std::vector<int64_t> idx(sizes.size());
      for (size_t d = 0; d < sizes.size(); ++d)
        idx[d] = reduced[d] ? i[d] : o[d];
      row.push_back(std::move(idx));
    });
    fn(row);
  });
}

}  // namespace kiln::ops
