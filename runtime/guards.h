// The guards an artifact's inputs must meet, checked the same way by every
// runtime (CPU and CUDA): dtype, rank, sizes and strides as expressions over
// the symbols, the symbols' bounds, and the data pointer's alignment.
//
// Thread-safety: pure functions.
#ifndef KILN_RUNTIME_GUARDS_H_
#define KILN_RUNTIME_GUARDS_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "graph/dtype.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln {

// What the guards look at in one input tensor, wherever it lives.
struct GuardedTensor {
  DType dtype = DType::kFloat32;
  absl::Span<const int64_t> sizes;
  absl::Span<const int64_t> strides;  // in elements
  uint64_t address = 0;  // the data pointer (host or device), offset applied
};

// Evaluates an artifact's symbolic polynomial (wrapping on overflow).
int64_t EvaluateSymPoly(const v1::SymPoly& p,
                        absl::Span<const int64_t> symbols);

// Checks `num_inputs` inputs (`input(i)` describes input i) against the
// artifact's symbol and input guards and writes the symbol values they imply
// into `symbols` (artifact.symbols_size() entries). Strides of dims of size
// 1, and strides and alignment of empty tensors, are not checked. Allocates
// nothing.
//
// Errors: INVALID_ARGUMENT naming the input, the dim and the guard it fails
// ("input 0: stride 3 of dim 1, compiled for 1"), or the count of inputs;
// INVALID_ARGUMENT for an artifact whose symbol guard reads an input it does
// not have.
absl::Status CheckInputGuards(const v1::Artifact& artifact, int num_inputs,
                              absl::FunctionRef<GuardedTensor(int)> input,
                              absl::Span<int64_t> symbols);

// Checks caller memory for output `index` of a run into it (the CPU and
// CUDA runtimes' RunInto): `tensor` (its address may be 0 for an empty
// output) must have the program's `dtype` and `sizes` and be contiguous
// (strides of size-1 dims, and of empty outputs, are not checked).
//
// Errors: INVALID_ARGUMENT naming the output and its dtype, sizes, stride
// or missing data pointer.
absl::Status CheckOutputMemory(size_t index, const GuardedTensor& tensor,
                               DType dtype, absl::Span<const int64_t> sizes);

}  // namespace kiln

#endif  // KILN_RUNTIME_GUARDS_H_
