// Fused scaled-dot-product attention on the CPU, forward and backward: what
// the CPU runtime runs for an Attention extern step (artifact.proto;
// ExternCall KILN_RUNTIME), with the semantics of runtime/cuda_attention.h
// in float32, float16 or bfloat16:
//   q [B, H, L, E], k [B, H, S, E], v [B, H, S, Ev], contiguous
//   s = scale * q @ k^T (+ bias [B or 1, H or 1, L, S]), -inf where the
//       key is after the query when causal (column j > row i), in float32
//   forward:  out = softmax(s) @ v, lse = logsumexp(s) (float32 [B, H, L])
//   backward: grad_q, grad_k, grad_v from grad_out, out and lse, and with
//             Attention.bias_grad the bias's gradient, the scores'
//             gradient before the scale summed over the heads that read
//             each bias slice (in float32, in a fixed order: up to 8
//             partial sums per slice, added at the end)
// A row whose every score is -inf gives NaN (out, lse and the gradients it
// reaches), as the reference and PyTorch's math path do.
//
// It is flash attention (Dao et al., 2022), as ATen's CPU kernel
// (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) computes it: the
// scores of a block of queries against a block of keys at a time, their
// products by the BLAS (CpuBlas::TileSgemm), the softmax online in
// float32. The score matrix is never written out, and causal attention
// skips the key blocks after a query block's last row (about half the
// work): as GEMMs around a softmax Kiln computed them all, 1.4-1.9x
// slower than PyTorch's flash kernel (bench/README.md, session 36).
//   forward   one task per (batch, head, block of queries): the running
//             max and sum per row, the output block accumulated in
//             float32 and divided by the sum at the end
//   backward  one task per (batch, head): the probabilities again from
//             lse, then per block pair
//               dv += (p * keep)^T @ dout   dp = dout @ v^T * keep
//               ds = p * (dp - rowsum(dout * out)) * scale
//               dq += ds @ k            dk += ds^T @ q
//             in float32 accumulators, rounded once at the end
// With dropout (Attention.dropout > 0, the int64 [2] (seed, offset) read
// after the other inputs) a probability is kept as Kiln's written-out
// dropout keeps it, Philox at the score element's row-major index over
// [B, H, L, S] (Attention.keep_threshold, keep_scale): the forward and
// backward draw the same mask, and either may be written out instead.
// float16 and bfloat16 inputs are widened to float32 first; the
// probabilities and ds are rounded to the dtype before their products, as
// PyTorch's kernels and Kiln's written-out attention round them. The exp
// is the code generator's (SLEEF's expf_u10 reduction, within 1 ulp),
// vectorised for AVX-512, AVX2 or baseline x86-64 by the CPU it runs on.
//
// Threads: the tasks are spread over `pool` where its tiles' products run
// on the calling thread (CpuBlas::TilesRunOnCaller: a CBLAS, or MKL and
// oneDNN inside the process's OpenMP threads); otherwise they run one
// after the other, each product threaded by the library.
//
// Thread-safety: RunCpuAttention may be called from several threads at
// once; it keeps no state between calls.
#ifndef KILN_RUNTIME_CPU_ATTENTION_H_
#define KILN_RUNTIME_CPU_ATTENTION_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kiln/v1/artifact.pb.h"
#include "runtime/program_plan.h"
#include "runtime/thread_pool.h"

namespace kiln {

// Runs `attention` (its sizes `dims` from EvaluateAttention, which has
// checked them against the buffers) over `buffers`, the step's buffers in
// its order: q, k, v[, bias][, out, lse, grad_out] then the tensors it
// writes (artifact.proto, Attention). Errors: UNIMPLEMENTED for a dtype
// other than float32, float16 and bfloat16; INVALID_ARGUMENT for the wrong
// number of buffers;
// FAILED_PRECONDITION when no BLAS loads (CpuBlas::Get); INTERNAL when the
// BLAS reports a failure.
absl::Status RunCpuAttention(const v1::Attention& attention,
                             const AttentionDims& dims,
                             absl::Span<void* const> buffers, ThreadPool* pool);

}  // namespace kiln

#endif  // KILN_RUNTIME_CPU_ATTENTION_H_
