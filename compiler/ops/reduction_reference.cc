// Reference semantics of the reduction family (graph/ops/reduction.h):
// for each output element, the input values it reduces (in row-major order
// of the reduced dims) folded in double (floating outputs) or wrapping int64
// (integral outputs).
#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/op_reference.h"
#include "compiler/ops/reference_util.h"
#include "graph/ops/reduction.h"

namespace kiln {
namespace {

double Sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// The first extreme; NaN counts as the extreme on both sides.
template <typename T>
size_t ArgExtreme(Reduction kind, const std::vector<T>& v) {
  size_t best = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(v[i])) return i;
    }
    if (kind == Reduction::kArgMax ? v[i] > v[best] : v[i] < v[best]) best = i;
  }
  return best;
}

// Folds one output element's values.
double FoldFloat(Reduction kind, const std::vector<double>& v,
                 double correction) {
  switch (kind) {
    case Reduction::kSum:
      return Sum(v);
    case Reduction::kMean:
      return Sum(v) / static_cast<double>(v.size());
    case Reduction::kProd: {
      double p = 1;
      for (double x : v) p *= x;
      return p;
    }
    case Reduction::kMax: {
      double m = -INFINITY;
      for (double x : v) {
        if (std::isnan(x)) return x;
        m = std::max(m, x);
      }
      return m;
    }
    case Reduction::kMin: {
      double m = INFINITY;
      for (double x : v) {
        if (std::isnan(x)) return x;
        m = std::min(m, x);
      }
      return m;
    }
    case Reduction::kVar: {
      const double mean = Sum(v) / static_cast<double>(v.size());
      double ss = 0;
      for (double x : v) ss += (x - mean) * (x - mean);
      const double divisor =
          std::max(0.0, static_cast<double>(v.size()) - correction);
      return ss / divisor;
    }
    case Reduction::kArgMax:
    case Reduction::kArgMin:
      return static_cast<double>(ArgExtreme(kind, v));
    case Reduction::kAny:
      return std::any_of(v.begin(), v.end(), [](double x) { return x != 0; });
    case Reduction::kAll:
      return std::all_of(v.begin(), v.end(), [](double x) { return x != 0; });
  }
  return 0;
}

int64_t FoldInt(Reduction kind, const std::vector<int64_t>& v) {
  switch (kind) {
    case Reduction::kSum: {
      uint64_t s = 0;
      for (int64_t x : v) s += static_cast<uint64_t>(x);
      return static_cast<int64_t>(s);
    }
    case Reduction::kProd: {
      uint64_t p = 1;
      for (int64_t x : v) p *= static_cast<uint64_t>(x);
      return static_cast<int64_t>(p);
    }
    case Reduction::kMax: {
      int64_t m = std::numeric_limits<int64_t>::min();
      for (int64_t x : v) m = std::max(m, x);
      return m;
    }
    case Reduction::kMin: {
      int64_t m = std::numeric_limits<int64_t>::max();
      for (int64_t x : v) m = std::min(m, x);
      return m;
    }
    case Reduction::kArgMax:
    case Reduction::kArgMin:
      return static_cast<int64_t>(ArgExtreme(kind, v));
    case Reduction::kAny:
      return std::any_of(v.begin(), v.end(), [](int64_t x) { return x != 0; });
    case Reduction::kAll:
      return std::all_of(v.begin(), v.end(), [](int64_t x) { return x != 0; });
    default:
      return 0;  // mean/var are floating only
  }
}

// Every reduction: gather each output element's values, fold them.
absl::StatusOr<std::vector<HostTensor>> ReductionReference(
    const RefContext& ctx) {
  const ReductionOp& op = *FindReduction(ctx.node.op->name);
  const HostTensor& in = ctx.tensors[0];
  const DType out_dtype = ctx.out_dtypes[0];
  const std::vector<bool> reduced = ReducedMask(ctx.node, op, in.rank());
  // Keepdim-shaped output index space; its row-major order is the same
  // with or without the kept size-1 dims.
  std::vector<int64_t> keep_sizes = in.sizes();
  for (int d = 0; d < in.rank(); ++d) {
    if (reduced[d]) keep_sizes[d] = 1;
  }
  int64_t out_numel = 1;
  for (int64_t s : keep_sizes) out_numel *= s;
  const bool float_fold = IsFloating(in.dtype()) || IsFloating(out_dtype);
  // sum/prod with a dtype argument cast the input first.
  const bool cast_first = op.kind == Reduction::kSum ||
                          op.kind == Reduction::kProd ||
                          op.kind == Reduction::kMean;
  std::vector<std::vector<double>> fbuckets(float_fold ? out_numel : 0);
  std::vector<std::vector<int64_t>> ibuckets(float_fold ? 0 : out_numel);
  ops::ForEachIndex(in.sizes(), [&](const std::vector<int64_t>& index) {
    int64_t o = 0;
    for (int d = 0; d < in.rank(); ++d)
      o = o * keep_sizes[d] + (reduced[d] ? 0 : index[d]);
    if (float_fold) {
      double v = in.GetDouble(index);
      if (cast_first) v = RoundToDType(v, out_dtype);
      fbuckets[o].push_back(v);
    } else {
      ibuckets[o].push_back(in.GetInt(index));
    }
  });
  const double correction = Correction(ctx.node, op);
  HostTensor out = HostTensor::Empty(out_dtype, ctx.out_sizes[0]);
  for (int64_t o = 0; o < out_numel; ++o) {
    if (float_fold) {
      const double v = FoldFloat(op.kind, fbuckets[o], correction);
      if (IsFloating(out_dtype)) {
        out.SetDoubleAt(o, v);
      } else {
        out.SetIntAt(o, CastDoubleToInt(v, out_dtype));
      }
    } else {
      out.SetIntAt(o, FoldInt(op.kind, ibuckets[o]));
    }
  }
  return std::vector<HostTensor>{std::move(out)};
}

}  // namespace

void RegisterReductionReferences(OpReferences& table) {
  for (const ReductionOp& op : ReductionOps()) {
    table.Add(op.name, ReductionReference);
  }
}

}  // namespace kiln
