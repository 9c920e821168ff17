// Reference semantics of the 2-d pooling ops (signatures:
// graph/ops/pooling.cc) as PyTorch's CPU kernels loop: each output over its
// window (padding skipped), backward ops scattering each output gradient
// back over its window in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/pooling.h"

namespace kiln {
namespace {

using ops::Pool2dWindow;

// The window of the node whose input is tensor `input`.
absl::StatusOr<Pool2dWindow> WindowOf(const RefContext& ctx, int input,
                                      int kernel_arg, int dilation_arg,
                                      int ceil_arg) {
  const HostTensor& x = ctx.tensors[input];
  return ops::Pool2dWindowOf(ctx.node, kernel_arg, kernel_arg + 1,
                             kernel_arg + 2, dilation_arg, ceil_arg,
                             x.sizes()[x.rank() - 2], x.sizes()[x.rank() - 1]);
}

// Calls fn(plane index prefix, oh, ow) for each output position of `out`
// ([..., OH, OW]).
void ForEachOutput(const std::vector<int64_t>& out,
                   const std::function<void(std::vector<int64_t>&)>& fn) {
  ops::ForEachIndex(out, [&](const std::vector<int64_t>& i) {
    std::vector<int64_t> idx = i;
    fn(idx);
  });
}

// idx with its last two entries replaced by (h, w).
std::vector<int64_t> At(std::vector<int64_t> idx, int64_t h, int64_t w) {
  idx[idx.size() - 2] = h;
  idx[idx.size() - 1] = w;
  return idx;
}

// Max over each window; the index is h * W + w of the first maximum (a
// NaN wins, as PyTorch's `val > max || isnan(val)`: the last NaN).
absl::StatusOr<std::vector<HostTensor>> MaxPoolReference(
    const RefContext& ctx) {
  auto p = WindowOf(ctx, 0, 1, 4, 5);
  if (!p.ok()) return p.status();
  const HostTensor& x = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  HostTensor ind = HostTensor::Empty(ctx.out_dtypes[1], ctx.out_sizes[1]);
  ForEachOutput(ctx.out_sizes[0], [&](std::vector<int64_t>& o) {
    const int64_t oh = o[o.size() - 2], ow = o[o.size() - 1];
    double best = -std::numeric_limits<double>::infinity();
    int64_t best_i = -1;
    for (int64_t kh = 0; kh < p->kh; ++kh) {
      const int64_t ih = oh * p->sh - p->ph + kh * p->dh;
      if (ih < 0 || ih >= p->h) continue;
      for (int64_t kw = 0; kw < p->kw; ++kw) {
        const int64_t iw = ow * p->sw - p->pw + kw * p->dw;
        if (iw < 0 || iw >= p->w) continue;
        const double v = x.GetDouble(At(o, ih, iw));
        if (best_i < 0 || v > best || std::isnan(v)) {
          best = v;
          best_i = ih * p->w + iw;
        }
      }
    }
    out.SetDouble(o, best);
    ind.SetInt(o, best_i);
  });
  return std::vector<HostTensor>{std::move(out), std::move(ind)};
}

// Each output gradient goes to the input position its index names.
absl::StatusOr<std::vector<HostTensor>> MaxPoolBackwardReference(
    const RefContext& ctx) {
  auto p = WindowOf(ctx, 1, 2, 5, 6);
  if (!p.ok()) return p.status();
  const HostTensor& g = ctx.tensors[0];
  const HostTensor& ind = ctx.tensors[7];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  std::vector<double> sums(out.numel(), 0);
  const int64_t plane = p->h * p->w;
  int64_t k = 0;
  ForEachOutput(g.sizes(), [&](std::vector<int64_t>& o) {
    const int64_t plane_index = k++ / (p->oh * p->ow);
    const int64_t i = ind.GetInt(o);
    if (i >= 0 && i < plane) sums[plane_index * plane + i] += g.GetDouble(o);
  });
  for (int64_t i = 0; i < out.numel(); ++i) out.SetDoubleAt(i, sums[i]);
  return std::vector<HostTensor>{std::move(out)};
}

// PyTorch's avg_pool2d window: [start, end) clamped to the input, and the
// divisor (divisor_override, the padded window or the clamped one).
struct AvgWindow {
  int64_t h0, h1, w0, w1;
  double divisor;
};

AvgWindow AvgWindowAt(const Pool2dWindow& p, int64_t oh, int64_t ow,
                      bool count_include_pad, const Attr& divisor_override) {
  int64_t h0 = oh * p.sh - p.ph, w0 = ow * p.sw - p.pw;
  int64_t h1 = std::min(h0 + p.kh, p.h + p.ph);
  int64_t w1 = std::min(w0 + p.kw, p.w + p.pw);
  const int64_t pool = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, p.h);
  w1 = std::min(w1, p.w);
  const double divisor =
      !divisor_override.is_none()
          ? static_cast<double>(divisor_override.i)
          : static_cast<double>(count_include_pad ? pool
                                                  : (h1 - h0) * (w1 - w0));
  return {h0, h1, w0, w1, divisor};
}

absl::StatusOr<std::vector<HostTensor>> AvgPoolReference(
    const RefContext& ctx) {
  auto p = WindowOf(ctx, 0, 1, -1, 4);
  if (!p.ok()) return p.status();
  const HostTensor& x = ctx.tensors[0];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  ForEachOutput(ctx.out_sizes[0], [&](std::vector<int64_t>& o) {
    const AvgWindow a = AvgWindowAt(*p, o[o.size() - 2], o[o.size() - 1],
                                    ctx.arg(5).b, ctx.arg(6));
    double s = 0;
    for (int64_t ih = a.h0; ih < a.h1; ++ih) {
      for (int64_t iw = a.w0; iw < a.w1; ++iw) s += x.GetDouble(At(o, ih, iw));
    }
    out.SetDouble(o, a.h0 >= a.h1 || a.w0 >= a.w1 ? 0 : s / a.divisor);
  });
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> AvgPoolBackwardReference(
    const RefContext& ctx) {
  auto p = WindowOf(ctx, 1, 2, -1, 5);
  if (!p.ok()) return p.status();
  const HostTensor& g = ctx.tensors[0];
  std::vector<double> sums(ctx.tensors[1].numel(), 0);
  const int64_t plane = p->h * p->w;
  int64_t k = 0;
  ForEachOutput(g.sizes(), [&](std::vector<int64_t>& o) {
    const int64_t base = (k++ / (p->oh * p->ow)) * plane;
    const AvgWindow a = AvgWindowAt(*p, o[o.size() - 2], o[o.size() - 1],
                                    ctx.arg(6).b, ctx.arg(7));
    for (int64_t ih = a.h0; ih < a.h1; ++ih) {
      for (int64_t iw = a.w0; iw < a.w1; ++iw) {
        sums[base + ih * p->w + iw] += g.GetDouble(o) / a.divisor;
      }
    }
  });
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t i = 0; i < out.numel(); ++i) out.SetDoubleAt(i, sums[i]);
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> AdaptiveAvgPoolReference(
    const RefContext& ctx) {
  const HostTensor& x = ctx.tensors[0];
  const int64_t h = x.sizes()[x.rank() - 2], w = x.sizes()[x.rank() - 1];
  const std::vector<int64_t>& os = ctx.out_sizes[0];
  const int64_t oh_n = os[os.size() - 2], ow_n = os[os.size() - 1];
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], os);
  ForEachOutput(os, [&](std::vector<int64_t>& o) {
    const int64_t oh = o[o.size() - 2], ow = o[o.size() - 1];
    const int64_t h0 = ops::AdaptiveStart(oh, oh_n, h),
                  h1 = ops::AdaptiveEnd(oh, oh_n, h);
    const int64_t w0 = ops::AdaptiveStart(ow, ow_n, w),
                  w1 = ops::AdaptiveEnd(ow, ow_n, w);
    double s = 0;
    for (int64_t ih = h0; ih < h1; ++ih) {
      for (int64_t iw = w0; iw < w1; ++iw) s += x.GetDouble(At(o, ih, iw));
    }
    out.SetDouble(o, s / static_cast<double>((h1 - h0) * (w1 - w0)));
  });
  return std::vector<HostTensor>{std::move(out)};
}

absl::StatusOr<std::vector<HostTensor>> AdaptiveAvgPoolBackwardReference(
    const RefContext& ctx) {
  const HostTensor& g = ctx.tensors[0];
  const HostTensor& x = ctx.tensors[1];
  const int64_t h = x.sizes()[x.rank() - 2], w = x.sizes()[x.rank() - 1];
  const int64_t oh_n = g.sizes()[g.rank() - 2], ow_n = g.sizes()[g.rank() - 1];
  std::vector<double> sums(x.numel(), 0);
  int64_t k = 0;
  ForEachOutput(g.sizes(), [&](std::vector<int64_t>& o) {
    const int64_t base = (k++ / (oh_n * ow_n)) * h * w;
    const int64_t oh = o[o.size() - 2], ow = o[o.size() - 1];
    const int64_t h0 = ops::AdaptiveStart(oh, oh_n, h),
                  h1 = ops::AdaptiveEnd(oh, oh_n, h);
    const int64_t w0 = ops::AdaptiveStart(ow, ow_n, w),
                  w1 = ops::AdaptiveEnd(ow, ow_n, w);
    const double share =
        g.GetDouble(o) / static_cast<double>((h1 - h0) * (w1 - w0));
    for (int64_t ih = h0; ih < h1; ++ih) {
      for (int64_t iw = w0; iw < w1; ++iw) sums[base + ih * w + iw] += share;
    }
  });
  HostTensor out = HostTensor::Empty(ctx.out_dtypes[0], ctx.out_sizes[0]);
  for (int64_t i = 0; i < out.numel(); ++i) out.SetDoubleAt(i, sums[i]);
  return std::vector<HostTensor>{std::move(out)};
}

}  // namespace

void RegisterPoolingReferences(OpReferences& table) {
  table.Add("aten.max_pool2d_with_indices.default", MaxPoolReference);
  table.Add("aten.max_pool2d_with_indices_backward.default",
            MaxPoolBackwardReference);
  table.Add("aten.avg_pool2d.default", AvgPoolReference);
  table.Add("aten.avg_pool2d_backward.default", AvgPoolBackwardReference);
  table.Add("aten._adaptive_avg_pool2d.default", AdaptiveAvgPoolReference);
  table.Add("aten._adaptive_avg_pool2d_backward.default",
            AdaptiveAvgPoolBackwardReference);
}

}  // namespace kiln
