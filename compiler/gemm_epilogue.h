// Compiler stage (CUDA targets), between lowering and fusion: a matrix
// product's bias add and activation become the library call's epilogue
// (issue 16, item 4), so the product is written once, already biased and
// activated, instead of being written, read back by a Kiln kernel and
// written again.
//
//   %2 = gemm of %0, %1                   %3 = gemm of %0, %1
//   %3 = %2[v0,v1] + %b[v1]      ==>           epilogue relu_bias bias %b
//   %4 = relu(%3[v0,v1])                  (%2 and the old %3 are dead)
//
// What folds is what the lowerings marked (LoopNode::epilogue: addmm's bias
// add with beta 1, relu, tanh-gelu) and only when it changes nothing else:
// the product (and the bias sum before an activation) has no other reader
// and is not a graph output, the product's k is static and positive, the pointwise node has the product's dtype,
// the bias is an n-vector of that dtype read in place. The combinations
// are cuBLASLt's: bias, relu, relu_bias, gelu_tanh, gelu_tanh_bias.
//
// Numerics: the library adds the bias and applies the activation to the
// float32 accumulator and rounds once; the unfused program rounds the
// product to float16/bfloat16 first (two roundings). PyTorch's own addmm on
// CUDA uses the same bias epilogue. CompileOptions.unfused_gemm_epilogues
// turns the stage off (part of the key).
//
// Training graphs: AOTAutograd saves a pre-activation for the backward of
// gelu, so there only the bias folds; relu's backward reads relu's output,
// so bias + relu fold whole.
//
// Backward: a linear layer's bias gradient, the output gradient summed over
// its rows, is written by the weight gradient's product, which reads those
// rows anyway (cuBLASLt's bias-gradient epilogues):
//
//   %5 = gemm of %3 (gy^T), %4 (x)          %5 = gemm of %3, %4
//   %6 = sum over v0 of %2[v0, v1]   ==>         epilogue bgrad_a, also
//        (%2 = gy, read as %3)                   writing %6
//
// when the sum reads exactly one operand over the product's k (also as
// several dims: a [batch, tokens, n] gradient summed over both, read as
// [batch * tokens, n] by the product), is read only by nodes after the
// product (it may come before it: AOTAutograd puts the sum first), and has
// its dtype; the product has batch 1, alpha 1, static m, n > 0 and
// no other epilogue (k may be symbolic: over k = 0 the runtime writes zeros
// to both). The sum's node becomes an extern result of the call
// (LoopNode::extern_owner). The operand must be read with a unit stride
// along what is kept: gy^T as A column-major (bgrad_a, cuBLASLt's BGRADB:
// AOTAutograd's form, mm(t(gy), x)) or gy as B row-major (bgrad_b,
// BGRADA: mm(t(x), gy)), the layouts cuBLASLt takes for these
// (bench/python/bgrad_probe.py). Numerics: the library sums in float32 and
// rounds once, as Kiln's reduction kernel does, in another order.
#ifndef KILN_COMPILER_GEMM_EPILOGUE_H_
#define KILN_COMPILER_GEMM_EPILOGUE_H_

#include "compiler/loop_ir.h"

namespace kiln {

// `graph` with every foldable epilogue folded (the folded pointwise node
// becomes the extern node; the product it read is left unread, and fusion
// drops it). Pure; the result dumps as 02-epilogues.txt.
LoopGraph FoldGemmEpilogues(LoopGraph graph);

}  // namespace kiln

#endif  // KILN_COMPILER_GEMM_EPILOGUE_H_
