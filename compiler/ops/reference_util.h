// Building blocks of the compiler's reference tables
// (compiler/ops/*_reference.cc): broadcasting host tensors, iterating
// indices, and the elementwise engine.
#ifndef KILN_COMPILER_OPS_REFERENCE_UTIL_H_
#define KILN_COMPILER_OPS_REFERENCE_UTIL_H_

#include <functional>
#include <vector>

#include "compiler/op_reference.h"
#include "graph/host_tensor.h"

namespace kiln::ops {

// `t` broadcast (stride-0 expanded) to `sizes`.
HostTensor BroadcastTo(const HostTensor& t, const std::vector<int64_t>& sizes);

// The elementwise engine. Operands (tensor or scalar arguments, by
// position) are broadcast to the output, converted to `compute` (rounded
// like a cast), and combined by `fd` when `compute` is floating or `fi`
// otherwise; the result is stored with `out`'s rounding.
using FloatFn = std::function<double(const double*)>;
using IntFn = std::function<int64_t(const int64_t*)>;
HostTensor Elementwise(const RefContext& ctx, const std::vector<int>& operands,
                       DType compute, const FloatFn& fd, const IntFn& fi);

// Iterates the multi-indices of `sizes` in row-major order.
void ForEachIndex(const std::vector<int64_t>& sizes,
                  const std::function<void(const std::vector<int64_t>&)>& fn);

// Calls fn(row) for each "row" over the `reduced` dims: the list of
// multi-indices sharing all other coordinates (rows in row-major order of
// the kept dims, each row's indices in row-major order).
void ForEachRow(
    const std::vector<int64_t>& sizes, const std::vector<bool>& reduced,
    const std::function<void(const std::vector<std::vector<int64_t>>&)>& fn);

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_REFERENCE_UTIL_H_
