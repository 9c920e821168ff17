// Reference semantics of the convolutions (signatures: graph/ops/conv.cc)
// as the definition reads: every product of an input element, a weight
// element and the output position they meet at, summed in double and
// rounded once to the output dtype. One enumeration of those triples
// (ForEachTerm) serves the forward op and all three gradients, regular and
// transposed.
#include <cstdint>
#include <functional>
#include <vector>

#include "compiler/op_reference.h"
#include "graph/ops/conv.h"

namespace kiln {
namespace {

using ops::ConvGeometry;

std::vector<SymExpr> SymSizes(const HostTensor& t) {
  return std::vector<SymExpr>(t.sizes().begin(), t.sizes().end());
}

absl::StatusOr<ConvGeometry> GeometryOf(const RefContext& ctx, int input,
                                        int weight, int first_arg) {
  return ops::ConvGeometryOf(ctx.node, first_arg, SymSizes(ctx.tensors[input]),
                             SymSizes(ctx.tensors[weight]));
}

std::vector<double> Doubles(const HostTensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.GetDoubleAt(i);
  return v;
}

HostTensor FromDoubles(DType dtype, const std::vector<int64_t>& sizes,
                       const std::vector<double>& v) {
  HostTensor t = HostTensor::Empty(dtype, sizes);
  for (int64_t i = 0; i < t.numel(); ++i) t.SetDoubleAt(i, v[i]);
  return t;
}

int64_t Static(const SymExpr& e) { return e.AsConstant().value_or(0); }

// Calls fn(x, w, y) with the row-major element numbers of every input
// element x, weight element w and output element y that meet in a product
// of the convolution: regular, y's position p and x's position
// p * stride - padding + k * dilation; transposed, the other way round.
void ForEachTerm(const ConvGeometry& g,
                 const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  // The spatial dims padded to 3 with size-1 dims.
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1};
  int64_t s[3] = {1, 1, 1}, p[3] = {0, 0, 0}, dl[3] = {1, 1, 1};
  for (int d = 0; d < g.dims; ++d) {
    const int e = 3 - g.dims + d;
    in[e] = Static(g.in_spatial[d]);
    out[e] = Static(g.out_spatial[d]);
    k[e] = g.kernel[d];
    s[e] = g.stride[d];
    p[e] = g.padding[d];
    dl[e] = g.dilation[d];
  }
  const int64_t n_batch = Static(g.batch), groups = g.groups;
  const int64_t cg = g.in_channels / groups, og = g.out_channels / groups;
  const int64_t l_in = in[0] * in[1] * in[2], l_out = out[0] * out[1] * out[2];
  const int64_t kk = k[0] * k[1] * k[2];
  // The small side (regular: the output, transposed: the input) indexes
  // the large one at small * s - p + k * d.
  const int64_t* small = g.transposed ? in : out;
  const int64_t* large = g.transposed ? out : in;
  for (int64_t n = 0; n < n_batch; ++n)
    for (int64_t gr = 0; gr < groups; ++gr)
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t o = 0; o < og; ++o) {
          const int64_t xc = n * g.in_channels + gr * cg + c;
          const int64_t yc = n * g.out_channels + gr * og + o;
          const int64_t wc =
              g.transposed ? (gr * cg + c) * og + o : (gr * og + o) * cg + c;
          for (int64_t a0 = 0; a0 < small[0]; ++a0)
            for (int64_t a1 = 0; a1 < small[1]; ++a1)
              for (int64_t a2 = 0; a2 < small[2]; ++a2)
                for (int64_t k0 = 0; k0 < k[0]; ++k0)
                  for (int64_t k1 = 0; k1 < k[1]; ++k1)
                    for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                      const int64_t b0 = a0 * s[0] - p[0] + k0 * dl[0];
                      const int64_t b1 = a1 * s[1] - p[1] + k1 * dl[1];
                      const int64_t b2 = a2 * s[2] - p[2] + k2 * dl[2];
                      if (b0 < 0 || b0 >= large[0] || b1 < 0 ||
                          b1 >= large[1] || b2 < 0 || b2 >= large[2])
                        continue;
                      const int64_t sp = (a0 * small[1] + a1) * small[2] + a2;
                      const int64_t lp = (b0 * large[1] + b1) * large[2] + b2;
                      const int64_t w = wc * kk + (k0 * k[1] + k1) * k[2] + k2;
                      if (g.transposed)
                        fn(xc * l_in + sp, w, yc * l_out + lp);
                      else
                        fn(xc * l_in + lp, w, yc * l_out + sp);
                    }
        }
}

absl::StatusOr<std::vector<HostTensor>> ConvolutionReference(
    const RefContext& ctx) {
  auto g = GeometryOf(ctx, 0, 1, 3);
  if (!g.ok()) return g.status();
  const std::vector<double> x = Doubles(ctx.tensors[0]);
  const std::vector<double> w = Doubles(ctx.tensors[1]);
  const std::vector<int64_t>& sizes = ctx.out_sizes[0];
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  std::vector<double> y(numel, 0);
  ForEachTerm(
      *g, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += x[xi] * w[wi]; });
  if (ctx.arg(2).kind == Attr::Kind::kTensor) {
    const std::vector<double> b = Doubles(ctx.tensors[2]);
    const int64_t plane = numel / std::max<int64_t>(sizes[0] * sizes[1], 1);
    for (int64_t i = 0; i < numel; ++i) y[i] += b[(i / plane) % sizes[1]];
  }
  return std::vector<HostTensor>{FromDoubles(ctx.out_dtypes[0], sizes, y)};
}

bool MaskBit(const RefContext& ctx, int i) {
  return ctx.arg(10).ints[i].AsConstant().value_or(1) != 0;
}

absl::StatusOr<std::vector<HostTensor>> ConvolutionBackwardReference(
    const RefContext& ctx) {
  auto g = GeometryOf(ctx, 1, 2, 4);
  if (!g.ok()) return g.status();
  const std::vector<double> gy = Doubles(ctx.tensors[0]);
  const std::vector<double> x = Doubles(ctx.tensors[1]);
  const std::vector<double> w = Doubles(ctx.tensors[2]);
  std::vector<double> gx(x.size(), 0), gw(w.size(), 0);
  ForEachTerm(*g, [&](int64_t xi, int64_t wi, int64_t yi) {
    gx[xi] += gy[yi] * w[wi];
    gw[wi] += gy[yi] * x[xi];
  });
  const std::vector<int64_t>& ys = ctx.tensors[0].sizes();
  const int64_t channels = ys[1];
  int64_t plane = 1;
  for (size_t d = 2; d < ys.size(); ++d) plane *= ys[d];
  std::vector<double> gb(channels, 0);
  for (size_t i = 0; i < gy.size(); ++i) gb[(i / plane) % channels] += gy[i];
  std::vector<std::vector<double>> grads{std::move(gx), std::move(gw),
                                         std::move(gb)};
  std::vector<HostTensor> out;
  for (int o = 0; o < 3; ++o) {
    if (!MaskBit(ctx, o)) std::fill(grads[o].begin(), grads[o].end(), 0.0);
    out.push_back(FromDoubles(ctx.out_dtypes[o], ctx.out_sizes[o], grads[o]));
  }
  return out;
}

}  // namespace

void RegisterConvReferences(OpReferences& table) {
  table.Add("aten.convolution.default", ConvolutionReference);
  table.Add("aten.convolution_backward.default", ConvolutionBackwardReference);
}

}  // namespace kiln
