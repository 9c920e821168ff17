"""Attention as Kiln compiles it.

PyTorch's ``F.scaled_dot_product_attention`` reaches a backend as one fused
vendor kernel per device (flash attention for the CPU, flash, memory-
efficient or cuDNN attention on CUDA), each with a backward op of its own.
Kiln writes attention as what those kernels compute instead: two matrix
products (Kiln's GEMM extern: BLAS on the CPU, cuBLASLt on CUDA) around a
masked softmax (fused Kiln kernels), so the projections, the mask, the
softmax and the reshapes around it land in one Kiln partition, forward and
backward (AOTAutograd derives the backward from these ops: two more
products per input and the softmax's backward).

rewrite_attention() does it on Dynamo's graph, before AOTAutograd traces
it: each call of scaled_dot_product_attention (or of
F.multi_head_attention_forward, nn.MultiheadAttention's, which Dynamo keeps
as one call and which calls it inside) that the policy decomposes becomes a
call of sdpa_math() (mha_math()); the others keep the fused kernel, or
become Kiln's own fused attention (sdpa_fused(); mha_fused(), which writes
out nn.MultiheadAttention's need_weights=False branch around it): the
custom op kiln::attention (and
kiln::attention_backward, its gradient through AOTAutograd, or
kiln::attention_backward_dbias where the mask needs a gradient too: a
learned position bias), which Kiln
compiles to one cuDNN fused-attention call per direction on CUDA
(float16/bfloat16, head dims multiples of 8 up to 128, 256 on sm_90;
runtime/cuda_attention.h), to one call of the CPU runtime's flash kernel
per direction on the CPU (runtime/cpu_attention.h), and to GEMMs around a
masked softmax where neither takes a call (compiler/ops/
attention_lowering.cc). It keeps attention inside the partition around it
without writing the scores out. Where a partition runs
eagerly (a fallback), the ops compute the same in PyTorch (float32
softmax, probabilities rounded to the inputs' dtype). The policy, from
kiln.backend(attention=...) or KILN_ATTENTION:

  "auto"      the default: on the CPU Kiln's fused op wherever
              fused_eligible takes the call (any floating dtype and head
              dim, dropout too), which the CPU runtime computes with its
              own flash kernel (runtime/cpu_attention.h: causal attention
              skips the masked key blocks; Llama's training step at 2x512
              tokens 12.4 ms against 18.9 decomposed and 13.5 under
              Inductor), else decomposed (a kilnd without the fused op:
              causal attention over CPU_MAX_CAUSAL_SCORES = 2^16 score
              elements keeps PyTorch's flash kernel, eagerly); on
              CUDA small attention
              (at most CUDA_MAX_SCORES = 2^20 score elements) decomposed,
              larger attention Kiln's fused op where fused_eligible takes
              the call (dropout through kiln::attention_dropout, below; a
              mask becomes an additive bias;
              float16/bfloat16, also under autocast; head dims multiples
              of 8 up to 128, 256 on sm_90 and later), else PyTorch's
              fused kernel, eagerly. As
              GEMMs and softmax, fwd+bwd of causal bf16 attention at
              8x12x256..4x16x2048 ran 4-7x slower than PyTorch's flash
              kernel on an H100 (bench/python/attention.py); the fused op
              runs the same cuDNN flash kernels as PyTorch's.
  "fused"     Kiln's fused op wherever fused_eligible takes the call (any
              floating dtype), else decomposed.
  "decompose" always decomposed.
  "eager"     never: attention runs as PyTorch's fused kernel, eagerly.

Numerics: float16/bfloat16 products run in their dtype accumulating in
float32 (rounded once, as PyTorch's own products), the scaling, masking
and softmax in float32, the probabilities rounded to the inputs' dtype
before the second product; masks follow PyTorch's
rules (a boolean mask keeps True, a float mask is added; is_causal is the
top-left lower triangle), dropout is PyTorch's (native_dropout, Kiln's
Philox kernels) where decomposed and kiln::attention_dropout's where fused
(cuDNN's generator on CUDA, Kiln's Philox elsewhere: "with dropout" below),
GQA repeats key and value heads (enable_gqa). A row whose
every score is masked gives NaN, as PyTorch's math path does (the fused
kernels give 0 or NaN depending on the kernel).
"""

from __future__ import annotations

import inspect
import math
import os
import struct
from typing import Any, List, Optional

import torch
import torch.fx
import torch.nn.functional as F

from .fx_graph import draw_seed, size_hint

__all__ = ["ATTENTION_POLICIES", "fused_eligible", "mha_fused",
           "mha_fused_eligible", "mha_math", "resolve_policy",
           "rewrite_attention", "sdpa_fused", "sdpa_math"]

ATTENTION_POLICIES = ("auto", "fused", "decompose", "eager")

# "auto" on CUDA: the largest score matrix (batch x heads x L x S elements)
# decomposed. Small attention is host-bound: as GEMMs and softmax it joins
# the partition around it (the suite's models on an H100, at most 2^16
# scores: attention's training step 1.04x Inductor's decomposed, 1.24x with
# the fused kernel between two partitions); from 6.3M scores on, PyTorch's
# flash kernel is 4-7x faster (bench/python/attention.py). In between is
# not measured.
CUDA_MAX_SCORES = 1 << 20

# "auto" on the CPU with a kilnd that lacks Kiln's fused op: the largest
# causal score matrix decomposed. The 2-core CPU, one training step,
# decomposed against PyTorch's flash kernel (with the partitions on either
# side), ms: Llama 8x64 tokens (2^17 scores) 6.1 / 5.1, 2x128 6.9 / 5.5,
# 2x256 13.0 / 10.0, 2x512 30.1 / 18.0; GPT-2 2x512 26.8 / 19.8; at 2^15
# scores and below the two are within run-to-run noise, and decomposed
# keeps one partition. (bench/python/model_step.py MODEL --seq S --scale B
# with KILN_ATTENTION=decompose and eager.)
CPU_MAX_CAUSAL_SCORES = 1 << 16

_SDPA_TARGETS = {F.scaled_dot_product_attention,
                 torch._C._nn.scaled_dot_product_attention}

# Dynamo keeps nn.MultiheadAttention's functional form as one call; with
# need_weights=False it calls scaled_dot_product_attention inside, and
# mha_math takes its other branch (the same attention as bmm and softmax).
_MHA_TARGETS = {F.multi_head_attention_forward}


def resolve_policy(policy: Optional[str]) -> str:
    """The attention policy: `policy`, else $KILN_ATTENTION, else "auto".
    Raises ValueError naming the choices for anything else."""
    value = policy if policy is not None else os.environ.get(
        "KILN_ATTENTION", "auto")
    if value not in ATTENTION_POLICIES:
        raise ValueError(f"attention={value!r}: expected one of "
                         f"{', '.join(ATTENTION_POLICIES)}")
    return value


def sdpa_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attn_mask: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, is_causal: bool = False,
              scale: Optional[float] = None,
              enable_gqa: bool = False) -> torch.Tensor:
    """scaled_dot_product_attention as matrix products and a softmax, with
    PyTorch's semantics for every argument (see the module docstring)."""
    dtype = query.dtype
    compute = (torch.float32 if dtype in (torch.float16, torch.bfloat16)
               else dtype)
    q, k, v = query, key, value
    if enable_gqa and k.dim() >= 3 and q.size(-3) != k.size(-3):
        rep = q.size(-3) // k.size(-3)
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1)) if isinstance(q.size(-1), int) \
            else torch.sym_float(q.size(-1)) ** -0.5
    # The products in the inputs' dtype (accumulating in float32: tensor
    # cores on CUDA), the softmax in float32.
    scores = torch.matmul(q, k.transpose(-2, -1)).to(compute) * scale
    if is_causal:
        rows = torch.arange(q.size(-2), device=q.device).unsqueeze(-1)
        cols = torch.arange(k.size(-2), device=q.device)
        scores = scores.masked_fill(cols > rows, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask.to(compute)
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p, training=True)
    return torch.matmul(probs.to(dtype), v)


# ---- Kiln's fused attention as a PyTorch custom op ----

def _attention_scores(q: torch.Tensor, k: torch.Tensor,
                      bias: Optional[torch.Tensor], is_causal: bool,
                      scale: float) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-2, -1)).float() * scale
    if bias is not None:
        s = s + bias.float()
    if is_causal:
        rows = torch.arange(q.size(-2), device=q.device).unsqueeze(-1)
        cols = torch.arange(k.size(-2), device=q.device)
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


@torch.library.custom_op(
    "kiln::attention", mutates_args=(),
    schema="(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, "
           "bool is_causal, float scale) -> (Tensor, Tensor)")
def attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attn_bias: Optional[torch.Tensor], is_causal: bool,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): softmax(scale * q @ k^T + attn_bias, masked) @ v in the
    inputs' dtype and the rows' logsumexp in float32 (the semantics of
    graph/ops/attention.cc). This body runs only where Kiln does not."""
    s = _attention_scores(query, key, attn_bias, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1)).to(query.dtype)
    return torch.matmul(p, value).contiguous(), lse.contiguous()


@attention_op.register_fake
def _attention_fake(query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attn_bias: Optional[torch.Tensor],
                    is_causal: bool, scale: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    out = query.new_empty((*query.shape[:-1], value.shape[-1]))
    return out, query.new_empty(query.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(
    "kiln::attention_backward", mutates_args=(),
    schema="(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
           "Tensor? attn_bias, Tensor out, Tensor lse, bool is_causal, "
           "float scale) -> (Tensor, Tensor, Tensor)")
def attention_backward_op(grad_out: torch.Tensor, query: torch.Tensor,
                          key: torch.Tensor, value: torch.Tensor,
                          attn_bias: Optional[torch.Tensor],
                          out: torch.Tensor, lse: torch.Tensor,
                          is_causal: bool, scale: float
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_q, grad_k, grad_v) of attention_op, from its saved out and lse,
    for a bias that needs no gradient (attention_backward_dbias_op gives
    one). This body runs only where Kiln does not."""
    return _attention_grads(grad_out, query, key, value, attn_bias, out, lse,
                            is_causal, scale)


def _attention_grads(grad_out: torch.Tensor, query: torch.Tensor,
                     key: torch.Tensor, value: torch.Tensor,
                     attn_bias: Optional[torch.Tensor], out: torch.Tensor,
                     lse: torch.Tensor, is_causal: bool, scale: float,
                     dropout: Optional[tuple[float, torch.Tensor]] = None,
                     bias_grad: bool = False) -> tuple[torch.Tensor, ...]:
    """The eager backward bodies: the probabilities recomputed from lse,
    with `dropout` = (dropout_p, rng) times the keep mask drawn from rng
    over 1 - dropout_p (dv's probabilities and dp); with `bias_grad` also
    the bias's gradient (the scores' gradient before the scale, summed
    over the dims where the bias broadcasts)."""
    dtype = query.dtype
    s = _attention_scores(query, key, attn_bias, is_causal, scale)
    p = torch.exp(s - lse.unsqueeze(-1))
    g = grad_out.float()
    dp = torch.matmul(g, value.float().transpose(-2, -1))
    kept = p
    if dropout is not None:
        dropout_p, rng = dropout
        factor = dropout_keep(p.shape, dropout_p, rng) / (1.0 - dropout_p)
        kept = p * factor
        dp = dp * factor
    grad_v = torch.matmul(kept.to(dtype).transpose(-2, -1), grad_out)
    rowsum = (g * out.float()).sum(-1, keepdim=True)
    gs = p * (dp - rowsum)
    ds = (gs * scale).to(dtype)
    grad_q = torch.matmul(ds, key)
    grad_k = torch.matmul(ds.transpose(-2, -1), query)
    grads = (grad_q.contiguous(), grad_k.contiguous(), grad_v.contiguous())
    if not bias_grad:
        return grads
    assert attn_bias is not None
    dims = [d for d in range(4) if attn_bias.shape[d] == 1 and
            gs.shape[d] != 1]
    db = gs.sum(dims, keepdim=True) if dims else gs
    return (*grads, db.to(attn_bias.dtype).contiguous())


@attention_backward_op.register_fake
def _attention_backward_fake(grad_out: torch.Tensor, query: torch.Tensor,
                             key: torch.Tensor, value: torch.Tensor,
                             attn_bias: Optional[torch.Tensor],
                             out: torch.Tensor, lse: torch.Tensor,
                             is_causal: bool, scale: float
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (query.new_empty(query.shape), key.new_empty(key.shape),
            value.new_empty(value.shape))


_DBIAS_SCHEMA = ("(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
                 "Tensor attn_bias, Tensor out, Tensor lse, bool is_causal, "
                 "float scale{}) -> (Tensor, Tensor, Tensor, Tensor)")


@torch.library.custom_op("kiln::attention_backward_dbias", mutates_args=(),
                         schema=_DBIAS_SCHEMA.format(""))
def attention_backward_dbias_op(grad_out: torch.Tensor, query: torch.Tensor,
                                key: torch.Tensor, value: torch.Tensor,
                                attn_bias: torch.Tensor, out: torch.Tensor,
                                lse: torch.Tensor, is_causal: bool,
                                scale: float) -> tuple[torch.Tensor, ...]:
    """(grad_q, grad_k, grad_v, grad_bias): attention_backward_op's, and
    the bias's gradient in its shape and dtype, for a bias that needs one
    (a learned position bias). This body runs only where Kiln does not."""
    return _attention_grads(grad_out, query, key, value, attn_bias, out, lse,
                            is_causal, scale, bias_grad=True)


@attention_backward_dbias_op.register_fake
def _attention_backward_dbias_fake(grad_out: torch.Tensor,
                                   query: torch.Tensor, key: torch.Tensor,
                                   value: torch.Tensor, attn_bias: torch.Tensor,
                                   out: torch.Tensor, lse: torch.Tensor,
                                   is_causal: bool, scale: float
                                   ) -> tuple[torch.Tensor, ...]:
    return (*_attention_backward_fake(grad_out, query, key, value, attn_bias,
                                      out, lse, is_causal, scale),
            attn_bias.new_empty(attn_bias.shape))


def _attention_setup(ctx: Any, inputs: Any, output: Any) -> None:
    query, key, value, attn_bias, is_causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, attn_bias, out, lse)
    ctx.is_causal = is_causal
    ctx.scale = scale


def _bias_needs_grad(ctx: Any, attn_bias: Optional[torch.Tensor]) -> bool:
    return attn_bias is not None and bool(ctx.needs_input_grad[3])


def _attention_backward(ctx: Any, grad_out: torch.Tensor,
                        grad_lse: Optional[torch.Tensor]) -> Any:
    query, key, value, attn_bias, out, lse = ctx.saved_tensors
    args = (grad_out.contiguous(), query, key, value, attn_bias, out, lse,
            ctx.is_causal, ctx.scale)
    if _bias_needs_grad(ctx, attn_bias):
        return (*attention_backward_dbias_op(*args), None, None)
    return (*attention_backward_op(*args), None, None, None)


attention_op.register_autograd(_attention_backward,
                               setup_context=_attention_setup)


# ---- with dropout: kiln::attention_dropout and its backward ----
#
# The keep mask is Bernoulli(1 - dropout_p) per score element, drawn from
# Philox4x32-10 at (seed, offset) as Kiln's native_dropout draws it
# (graph/ops/random.h): these eager bodies compute the same bits with
# tensor ops, so an eager forward and a backward in Kiln's kernels (or the
# reverse) agree. Where cuDNN computes a call on CUDA it draws from its own
# Philox generator instead, from a pair (a seed of the op's own, offset
# LIBRARY_DRAWN). A backward that did not draw the forward's way refuses
# the pair rather than give silently wrong gradients: this body raises for
# a cuDNN pair, Kiln's kernels give NaN gradients for one, and cuDNN's
# backward gives NaN gradients for a pair it did not draw.

LIBRARY_DRAWN = 1 << 62

_M32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_BERNOULLI_BITS = 24


def philox_words(seed: torch.Tensor, offset: torch.Tensor,
                 calls: int) -> torch.Tensor:
    """Words [calls, 4] of Philox4x32-10 (support/philox.h) for counters
    0 .. calls - 1 of stream (seed, offset) (int64 0-dim tensors), as int64
    holding uint32 values, on their device. int64 products wrap as uint64
    products do, so the high and low halves are exact."""
    index = torch.arange(calls, dtype=torch.int64, device=seed.device)
    c = [index & _M32, index >> 32, (offset & _M32).expand_as(index),
         ((offset >> 32) & _M32).expand_as(index)]
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        p0 = c[0] * _PHILOX_M[0]
        p1 = c[2] * _PHILOX_M[1]
        c = [((p1 >> 32) & _M32) ^ c[1] ^ k0, p1 & _M32,
             ((p0 >> 32) & _M32) ^ c[3] ^ k1, p0 & _M32]
        k0 = (k0 + _PHILOX_W[0]) & _M32
        k1 = (k1 + _PHILOX_W[1]) & _M32
    return torch.stack(c, dim=-1)


def dropout_keep(shape: torch.Size, dropout_p: float,
                 rng: torch.Tensor) -> torch.Tensor:
    """The keep mask (bool, `shape`) of stream rng = (seed, offset): element
    i (row-major) keeps iff the low 24 bits of word i % 4 of Philox call
    i // 4 are below ceil((1 - dropout_p) * 2^24) (graph/ops/random.h)."""
    n = math.prod(shape)
    words = philox_words(rng[0], rng[1], (n + 3) // 4).reshape(-1)[:n]
    keep = 1.0 - dropout_p
    threshold = 0 if keep <= 0 else (1 << _BERNOULLI_BITS) if keep >= 1 \
        else math.ceil(keep * (1 << _BERNOULLI_BITS))
    bits = words & ((1 << _BERNOULLI_BITS) - 1)
    return (bits < threshold).reshape(shape)


def _dropout_schema(backward: bool) -> str:
    if backward:
        return ("(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
                "Tensor? attn_bias, Tensor out, Tensor lse, bool is_causal, "
                "float scale, float dropout_p, Tensor rng) "
                "-> (Tensor, Tensor, Tensor)")
    return ("(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, "
            "bool is_causal, float scale, float dropout_p) "
            "-> (Tensor, Tensor, Tensor)")


# Not merged with an identical call by common-subexpression elimination
# (torch versions whose custom_op takes tags).
_RANDOM_TAGS = ({"tags": (torch.Tag.nondeterministic_seeded,)}
                if "tags" in inspect.signature(
                    torch.library.custom_op).parameters else {})


@torch.library.custom_op("kiln::attention_dropout", mutates_args=(),
                         schema=_dropout_schema(False), **_RANDOM_TAGS)
def attention_dropout_op(query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor,
                         attn_bias: Optional[torch.Tensor], is_causal: bool,
                         scale: float, dropout_p: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, rng): attention_op with dropout on the probabilities,
    out = (p * keep / (1 - dropout_p)) @ v, lse the undropped softmax's,
    rng = (seed, offset) int64 [2] for the backward: a seed drawn from
    torch's generator of the device (draw_seed), offset 0. This body runs
    only where Kiln does not."""
    rng = torch.stack([draw_seed(query.device),
                       torch.zeros((), dtype=torch.int64,
                                   device=query.device)])
    s = _attention_scores(query, key, attn_bias, is_causal, scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    keep = dropout_keep(p.shape, dropout_p, rng)
    p = (p * keep / (1.0 - dropout_p)).to(query.dtype)
    return torch.matmul(p, value).contiguous(), lse.contiguous(), rng


@attention_dropout_op.register_fake
def _attention_dropout_fake(query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor,
                            attn_bias: Optional[torch.Tensor],
                            is_causal: bool, scale: float, dropout_p: float
                            ) -> tuple[torch.Tensor, torch.Tensor,
                                       torch.Tensor]:
    out, lse = _attention_fake(query, key, value, attn_bias, is_causal, scale)
    return out, lse, query.new_empty((2,), dtype=torch.int64)


def _check_rng(rng: torch.Tensor) -> None:
    """Raises RuntimeError for a pair cuDNN drew (flagged LIBRARY_DRAWN),
    whose mask the eager backward bodies cannot draw again."""
    if int(rng[1]) >= LIBRARY_DRAWN:
        raise RuntimeError(
            "kiln::attention_dropout_backward: cuDNN drew this attention's "
            "dropout mask in a Kiln-compiled forward, and this backward runs "
            "eagerly, where that mask cannot be drawn again; run the "
            "backward through Kiln too, or use attention='decompose'")


@torch.library.custom_op("kiln::attention_dropout_backward",
                         mutates_args=(), schema=_dropout_schema(True))
def attention_dropout_backward_op(
        grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
        value: torch.Tensor, attn_bias: Optional[torch.Tensor],
        out: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: float,
        dropout_p: float, rng: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_q, grad_k, grad_v) of attention_dropout_op, the mask drawn
    again from rng. Raises RuntimeError for a pair cuDNN drew (its offset
    marked LIBRARY_DRAWN): that mask cannot be drawn here. This body runs
    only where Kiln does not."""
    _check_rng(rng)
    return _attention_grads(grad_out, query, key, value, attn_bias, out, lse,
                            is_causal, scale, (dropout_p, rng))


@torch.library.custom_op("kiln::attention_dropout_backward_dbias",
                         mutates_args=(),
                         schema=_DBIAS_SCHEMA.format(
                             ", float dropout_p, Tensor rng"))
def attention_dropout_backward_dbias_op(
        grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
        value: torch.Tensor, attn_bias: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, is_causal: bool, scale: float, dropout_p: float,
        rng: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """attention_dropout_backward_op's gradients and the bias's, as
    attention_backward_dbias_op gives it (dp dropped); raises as
    attention_dropout_backward_op does. This body runs only where Kiln
    does not."""
    _check_rng(rng)
    return _attention_grads(grad_out, query, key, value, attn_bias, out, lse,
                            is_causal, scale, (dropout_p, rng),
                            bias_grad=True)


@attention_dropout_backward_dbias_op.register_fake
def _attention_dropout_backward_dbias_fake(
        grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
        value: torch.Tensor, attn_bias: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, is_causal: bool, scale: float, dropout_p: float,
        rng: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return _attention_backward_dbias_fake(grad_out, query, key, value,
                                          attn_bias, out, lse, is_causal,
                                          scale)


@attention_dropout_backward_op.register_fake
def _attention_dropout_backward_fake(
        grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
        value: torch.Tensor, attn_bias: Optional[torch.Tensor],
        out: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: float,
        dropout_p: float, rng: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _attention_backward_fake(grad_out, query, key, value, attn_bias,
                                    out, lse, is_causal, scale)


def _attention_dropout_setup(ctx: Any, inputs: Any, output: Any) -> None:
    query, key, value, attn_bias, is_causal, scale, dropout_p = inputs
    out, lse, rng = output
    ctx.save_for_backward(query, key, value, attn_bias, out, lse, rng)
    ctx.is_causal = is_causal
    ctx.scale = scale
    ctx.dropout_p = dropout_p


def _attention_dropout_backward(ctx: Any, grad_out: torch.Tensor,
                                grad_lse: Optional[torch.Tensor],
                                grad_rng: Optional[torch.Tensor]) -> Any:
    query, key, value, attn_bias, out, lse, rng = ctx.saved_tensors
    args = (grad_out.contiguous(), query, key, value, attn_bias, out, lse,
            ctx.is_causal, ctx.scale, ctx.dropout_p, rng)
    if _bias_needs_grad(ctx, attn_bias):
        return (*attention_dropout_backward_dbias_op(*args), None, None, None)
    return (*attention_dropout_backward_op(*args), None, None, None, None)


attention_dropout_op.register_autograd(
    _attention_dropout_backward, setup_context=_attention_dropout_setup)

# The head dims cuDNN's fused engines take (runtime/cuda_attention.h): up to
# 128, and up to 256 on sm_90 and later (compiler/compile.cc: cuDNN 9 ran
# 160, 192 and 256 forward and backward on an H200).
_FUSED_MAX_HEAD_DIM = 128
_FUSED_MAX_HEAD_DIM_SM90 = 256


# With dropout, head dims up to 128: compiler/ops/attention_lowering.cc
# computes larger ones without cuDNN (kLibraryDropoutMaxHeadDim), as GEMMs
# around a softmax, which PyTorch's fused kernel outruns.
_FUSED_DROPOUT_MAX_HEAD_DIM = 128


def _fused_max_head_dim(device: torch.device) -> int:
    """The largest head dim Kiln's fused op takes on CUDA `device`s (the
    CPU's takes any)."""
    if device.type != "cuda":
        return _FUSED_MAX_HEAD_DIM
    try:
        major, _ = torch.cuda.get_device_capability(device)
    except (RuntimeError, AssertionError):
        return _FUSED_MAX_HEAD_DIM
    return _FUSED_MAX_HEAD_DIM_SM90 if major >= 9 else _FUSED_MAX_HEAD_DIM


def sdpa_fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attn_mask: Optional[torch.Tensor] = None,
               dropout_p: float = 0.0, is_causal: bool = False,
               scale: Optional[float] = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """scaled_dot_product_attention through Kiln's fused op, for the calls
    fused_eligible accepts (kiln::attention_dropout where dropout_p > 0;
    dropout applies whether or not the module trains, as in the call
    itself); grouped key and value heads are
    repeated; inputs under autocast are cast as autocast casts SDPA's; a
    boolean mask becomes an additive one of 0 and -inf and a float mask is
    added, both in the query's dtype, 4-D with the scores' query and key
    dims."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    device = query.device.type
    if torch.is_autocast_enabled(device):  # as autocast casts SDPA's inputs
        dtype = torch.get_autocast_dtype(device)
        query, key, value = (x.to(dtype) for x in (query, key, value))
    if enable_gqa and key.size(-3) != query.size(-3):
        rep = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    bias = None
    if attn_mask is not None:
        bias = attn_mask
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=query.dtype,
                               device=bias.device).masked_fill(
                                   bias.logical_not(), float("-inf"))
        bias = bias.to(query.dtype)
        while bias.dim() < 4:
            bias = bias.unsqueeze(0)
        bias = bias.expand(bias.shape[0], bias.shape[1], query.shape[-2],
                           key.shape[-2])
    q, k, v = query.contiguous(), key.contiguous(), value.contiguous()
    if dropout_p > 0.0:
        return attention_dropout_op(q, k, v, bias, bool(is_causal),
                                    float(scale), float(dropout_p))[0]
    return attention_op(q, k, v, bias, bool(is_causal), float(scale))[0]


_SDPA_SIGNATURE = inspect.signature(sdpa_math)


def _float32(x: float) -> float:
    """x rounded to float32 (as a library takes dropout_p)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def fused_eligible(node: torch.fx.Node, any_dtype: bool = False,
                   autocast: Optional[torch.dtype] = None,
                   dropout: bool = True, bias_grad: bool = False) -> bool:
    """Whether Kiln's fused op takes the scaled_dot_product_attention call
    `node` of Dynamo's graph (from its example values): 4-D query, key and
    value with one batch size and the query's head count (a multiple of the
    key's and value's with enable_gqa), dropout_p a Python number below 1
    (0 unless `dropout`: kilnd has kiln.attention_dropout; with dropout on
    CUDA, head dims up to 128), a static head dim (on CUDA a multiple of 8
    up to 128, 256 on devices of sm_90 and later; any on the CPU, whose
    runtime has a kernel of its own), float16/bfloat16 (any floating dtype
    with `any_dtype`; under autocast to `autocast`, the floating inputs
    count as that dtype), a Python-number scale, and attn_mask None or a
    boolean or floating tensor of at most 4 dims that broadcasts to the
    scores with its batch and head dims 1 or theirs and that needs no
    gradient unless `bias_grad` (kilnd has kiln.attention_backward_dbias,
    which gives a floating mask its gradient)."""
    if node.target not in _SDPA_TARGETS:
        return False
    try:
        bound = _SDPA_SIGNATURE.bind(*node.args, **node.kwargs)
    except TypeError:
        return False
    bound.apply_defaults()
    a = bound.arguments
    p = a["dropout_p"]
    if not _dropout_ok(p, dropout) or \
            not isinstance(a["is_causal"], bool) or \
            not (a["scale"] is None or isinstance(a["scale"], float)):
        return False
    vals = [_example(a[name]) for name in ("query", "key", "value")]
    if any(v is None or v.dim() != 4 for v in vals):
        return False
    q, k, v = vals
    if not _dtype_ok(vals, any_dtype, autocast):
        return False
    heads = [x.shape[1] for x in vals]
    if any(isinstance(n, torch.SymInt) for n in heads) or heads[1] < 1 or \
            heads[1] != heads[2] or heads[0] % heads[1] or \
            (heads[0] != heads[1] and a["enable_gqa"] is not True):
        return False
    if q.shape[0] != k.shape[0] or q.shape[0] != v.shape[0] or \
            k.shape[2] != v.shape[2]:
        return False
    if not _head_dims_ok(q.device, (q.shape[-1], k.shape[-1], v.shape[-1]),
                         p != 0.0) or q.shape[-1] != k.shape[-1]:
        return False
    mask = a["attn_mask"]
    if mask is None:
        return True
    m = _example(mask)
    if not _mask_ok(m, bias_grad) or m.dim() > 4:
        return False
    scores = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    dims = (1,) * (4 - m.dim()) + tuple(m.shape)
    return all(d == 1 or d == s for d, s in zip(dims, scores))


def _example(x: Any) -> Optional[torch.Tensor]:
    """The example value of Dynamo graph argument `x`, if a tensor."""
    v = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _dropout_ok(p: Any, dropout: bool) -> bool:
    """Whether the fused op takes dropout_p `p`: a Python number in [0, 1),
    and 0 unless `dropout` (its float32 value also strictly inside)."""
    return isinstance(p, (int, float)) and 0.0 <= p < 1.0 and \
        (p == 0.0 or (dropout and 0.0 < _float32(p) < 1.0))


def _dtype_ok(tensors: List[torch.Tensor], any_dtype: bool,
              autocast: Optional[torch.dtype]) -> bool:
    """Whether `tensors` share one dtype the fused op takes: float16 or
    bfloat16, float32 too with `any_dtype`; under autocast to `autocast`
    the floating ones count as that dtype."""
    dtypes = (torch.float16, torch.bfloat16) + \
        ((torch.float32,) if any_dtype else ())
    kinds = {x.dtype if autocast is None or not x.is_floating_point()
             else autocast for x in tensors}
    return len(kinds) == 1 and kinds.pop() in dtypes


def _head_dims_ok(device: torch.device, dims: Any, dropout: bool) -> bool:
    """Whether the fused op takes head dims `dims` on `device`: static and
    positive; on CUDA multiples of 8 up to _fused_max_head_dim, and up to
    _FUSED_DROPOUT_MAX_HEAD_DIM with `dropout`."""
    cuda = device.type == "cuda"
    for d in dims:
        if not isinstance(d, int) or d < 1 or \
                (cuda and (d % 8 or d > _fused_max_head_dim(device))):
            return False
        if cuda and dropout and d > _FUSED_DROPOUT_MAX_HEAD_DIM:
            return False
    return True


def _mask_ok(m: Optional[torch.Tensor], bias_grad: bool = False) -> bool:
    """Whether a mask's example value is one the fused op takes: boolean or
    floating, needing no gradient unless `bias_grad` (the _dbias backward
    ops give the bias one)."""
    return isinstance(m, torch.Tensor) and \
        (bias_grad or not m.requires_grad) and \
        (m.dtype == torch.bool or m.is_floating_point())


_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def _mha_arguments(args: Any, kwargs: Any) -> "inspect.BoundArguments":
    bound = _MHA_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def mha_math(*args: Any, **kwargs: Any) -> Any:
    """F.multi_head_attention_forward with need_weights=False computed by
    its need_weights=True branch (the same attention, written as bmm,
    softmax and dropout) and returned as the need_weights=False call
    returns it: (output, None). The averaged weights it also computes are
    dead code, which AOTAutograd removes."""
    bound = _mha_arguments(args, kwargs)
    bound.arguments["need_weights"] = True
    bound.arguments["average_attn_weights"] = False
    out, _ = F.multi_head_attention_forward(*bound.args, **bound.kwargs)
    return out, None


def _mha_mask(mask: Optional[torch.Tensor],
              dtype: torch.dtype) -> Optional[torch.Tensor]:
    """An nn.MultiheadAttention mask as its additive form (F's
    _canonical_mask): a boolean mask is 0 where False and -inf where True
    (True masks out, unlike SDPA's), a floating one as given."""
    if mask is None or mask.is_floating_point():
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device
                       ).masked_fill(mask, float("-inf"))


def mha_fused(*args: Any, **kwargs: Any) -> Any:
    """F.multi_head_attention_forward with need_weights=False, its
    attention through sdpa_fused (Kiln's fused op), for the calls
    mha_fused_eligible accepts: the need_weights=False branch of PyTorch's
    function (projections, the causal hint, the key-padding mask merged
    into attn_mask, dropout only in training, the output projection)
    written out, so the SDPA call inside is Kiln's. Returns (output,
    None)."""
    a = _mha_arguments(args, kwargs).arguments
    query, key, value = a["query"], a["key"], a["value"]
    heads = a["num_heads"]
    kpm, attn_mask, is_causal = a["key_padding_mask"], a["attn_mask"], \
        a["is_causal"]
    batched = query.dim() == 3
    if not batched:
        query, key, value = (x.unsqueeze(1) for x in (query, key, value))
        if kpm is not None:
            kpm = kpm.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    head_dim = embed_dim // heads
    if not a["use_separate_proj_weight"]:
        q, k, v = F._in_projection_packed(query, key, value,
                                          a["in_proj_weight"],
                                          a["in_proj_bias"])
    else:
        bias = a["in_proj_bias"]
        b_q, b_k, b_v = bias.chunk(3) if bias is not None else (None,) * 3
        q, k, v = F._in_projection(query, key, value, a["q_proj_weight"],
                                   a["k_proj_weight"], a["v_proj_weight"],
                                   b_q, b_k, b_v)
    if is_causal and attn_mask is None:
        raise RuntimeError(  # PyTorch's function says the same
            "Need attn_mask if specifying the is_causal hint. You may use "
            "the Transformer module method `generate_square_subsequent_mask`"
            " to create this mask.")
    kpm = _mha_mask(kpm, query.dtype)
    if is_causal and kpm is None:
        attn_mask = None  # the hint alone, as PyTorch's function does
    else:
        attn_mask = _mha_mask(attn_mask, query.dtype)
        if kpm is not None:
            is_causal = False
    if attn_mask is not None and attn_mask.dim() == 2:
        attn_mask = attn_mask.unsqueeze(0)
    if kpm is not None:
        kpm = kpm.view(bsz, 1, 1, src_len).expand(-1, heads, -1, -1).reshape(
            bsz * heads, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    if attn_mask is not None:
        attn_mask = attn_mask.unsqueeze(0) if attn_mask.size(0) == 1 \
            else attn_mask.view(bsz, heads, -1, src_len)
    q = q.view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    k = k.view(src_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    v = v.view(src_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    dropout_p = a["dropout_p"] if a["training"] else 0.0
    out = sdpa_fused(q, k, v, attn_mask, dropout_p, bool(is_causal))
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = F.linear(out, a["out_proj_weight"], a["out_proj_bias"])
    out = out.view(tgt_len, bsz, embed_dim)
    return (out if batched else out.squeeze(1)), None


def mha_fused_eligible(node: torch.fx.Node, any_dtype: bool = False,
                       autocast: Optional[torch.dtype] = None,
                       dropout: bool = True, bias_grad: bool = False) -> bool:
    """Whether mha_fused takes the F.multi_head_attention_forward call
    `node` of Dynamo's graph: need_weights=False; no bias_k, bias_v,
    add_zero_attn, static_k or static_v; a batched (3-D) or unbatched (2-D)
    query, key and value whose (projected) dtype fused_eligible would take;
    an int num_heads dividing a static embed dim into head dims it takes;
    dropout_p as fused_eligible takes it (when training); boolean or
    floating masks, needing no gradient unless `bias_grad`."""
    if node.target not in _MHA_TARGETS or \
            not hasattr(F, "_in_projection_packed"):
        return False
    try:
        a = _mha_arguments(node.args, node.kwargs).arguments
    except TypeError:
        return False
    p = a["dropout_p"] if a["training"] else 0.0  # applied in training only
    if a["need_weights"] is not False or a["add_zero_attn"] is not False or \
            any(a[n] is not None for n in ("bias_k", "bias_v", "static_k",
                                           "static_v")) or \
            not isinstance(a["training"], bool) or \
            not isinstance(a["is_causal"], bool) or \
            not isinstance(a["use_separate_proj_weight"], bool) or \
            not _dropout_ok(p, dropout):
        return False
    vals = [_example(a[n]) for n in ("query", "key", "value")]
    if any(v is None or v.dim() not in (2, 3) or v.dim() != vals[0].dim()
           for v in vals):
        return False
    if not _dtype_ok(vals, any_dtype, autocast):
        return False
    heads, embed = a["num_heads"], vals[0].shape[-1]
    if not isinstance(heads, int) or heads < 1 or \
            not isinstance(embed, int) or embed % heads:
        return False
    if not _head_dims_ok(vals[0].device, (embed // heads,), p != 0.0):
        return False
    for name in ("attn_mask", "key_padding_mask"):
        if a[name] is not None and not _mask_ok(_example(a[name]),
                                                bias_grad):
            return False
    return True


def _hint(size: Any) -> int:
    """A size's example value; unknown counts as huge (not decomposed)."""
    return size_hint(size, unknown=1 << 62)


def _causal_call(node: torch.fx.Node) -> bool:
    """Whether an SDPA call says is_causal=True (a literal, no mask)."""
    try:
        bound = _SDPA_SIGNATURE.bind(*node.args, **node.kwargs)
    except TypeError:
        return False
    bound.apply_defaults()
    return bound.arguments["is_causal"] is True and \
        bound.arguments["attn_mask"] is None


def _scores(node: torch.fx.Node) -> Optional[int]:
    """Elements of the score matrix of an SDPA or MHA call, from Dynamo's
    example values; None when unknown."""
    vals = []
    for a in node.args[:2]:
        v = a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None
        if not isinstance(v, torch.Tensor) or v.dim() < 2:
            return None
        vals.append(v)
    q, k = vals
    if node.target in _MHA_TARGETS:
        # (L, N, E) and (S, N, E), or unbatched (L, E); heads: argument 4.
        bound = _mha_arguments(node.args, node.kwargs)
        n = _hint(q.shape[0]) * _hint(k.shape[0]) * _hint(
            bound.arguments["num_heads"])
        return n * _hint(q.shape[1]) if q.dim() == 3 else n
    n = _hint(q.shape[-2]) * _hint(k.shape[-2])
    for s in q.shape[:-2]:
        n *= _hint(s)
    return n


def _device(node: torch.fx.Node) -> Optional[torch.device]:
    a = node.args[0] if node.args else None
    v = a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None
    return v.device if isinstance(v, torch.Tensor) else None


def _cudnn_fused_ok(device: torch.device) -> bool:
    """Whether cuDNN's fused attention can run on `device`: an sm_80 or
    later GPU and cuDNN 9.6 or later (its backward)."""
    try:
        major, _ = torch.cuda.get_device_capability(device)
        version = torch.backends.cudnn.version() or 0
    except (RuntimeError, AssertionError):
        return False
    return major >= 8 and version >= 90600


_ENTER_AUTOCAST = getattr(torch.amp, "_enter_autocast", None)
_EXIT_AUTOCAST = getattr(torch.amp, "_exit_autocast", None)


def _autocast_dtype(stack: List[Any],
                    device: Optional[torch.device]) -> Optional[torch.dtype]:
    """The dtype autocast casts to on `device` at this point of Dynamo's
    graph (the innermost _enter_autocast(device_type, dtype, enabled,
    cache) for the device, else the autocast in force around the compile),
    or None."""
    if device is None:
        return None
    for args in reversed(stack):
        if len(args) >= 3 and args[0] == device.type:
            if not args[2]:
                return None
            return args[1] if isinstance(args[1], torch.dtype) \
                else torch.get_autocast_dtype(device.type)
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return None


def rewrite_attention(gm: torch.fx.GraphModule, policy: str,
                      fused: bool = True, dropout: bool = True,
                      bias_grad: bool = True) -> int:
    """Replaces the scaled_dot_product_attention calls of Dynamo's graph
    `gm` that `policy` decomposes by sdpa_math, and those it gives Kiln's
    fused op by sdpa_fused (in place; recompiles gm), the latter only with
    `fused` (kilnd has kiln.attention), with dropout only with `dropout`
    (kilnd has kiln.attention_dropout), and with a mask that needs a
    gradient only with `bias_grad` (kilnd has kiln.attention_backward_dbias:
    on CUDA cuDNN's backward gives that gradient). Returns how many were
    replaced."""
    if policy == "eager":
        return 0
    return _rewrite_graph(gm, policy, fused, [], dropout, bias_grad)


def _rewrite_graph(gm: torch.fx.GraphModule, policy: str, fused: bool,
                   autocast: List[Any], dropout: bool = True,
                   bias_grad: bool = True) -> int:
    """rewrite_attention on gm and on the subgraphs its higher-order ops
    call (activation checkpointing's tag_activation_checkpoint, cond, ...:
    a get_attr argument naming a GraphModule), each under the autocast
    state in force at its call. `autocast`: the _enter_autocast args in
    force at gm's start (copied, not changed)."""
    replaced = 0
    autocast = list(autocast)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _ENTER_AUTOCAST:
            autocast.append(node.args)
        elif node.op == "call_function" and node.target is _EXIT_AUTOCAST:
            if autocast:
                autocast.pop()
        if node.op == "call_function":
            for arg in node.args:
                if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                    sub = getattr(gm, str(arg.target), None)
                    if isinstance(sub, torch.fx.GraphModule):
                        replaced += _rewrite_graph(sub, policy, fused,
                                                   autocast, dropout,
                                                   bias_grad)
        if node.op != "call_function" or (node.target not in _SDPA_TARGETS and
                                          node.target not in _MHA_TARGETS):
            continue
        if node.target in _MHA_TARGETS:
            try:
                bound = _mha_arguments(node.args, node.kwargs)
            except TypeError:
                continue
            if bound.arguments["need_weights"] is not False:
                continue  # already bmm and softmax
        mha = node.target in _MHA_TARGETS
        target, fused_target, eligible = (
            (mha_math, mha_fused, mha_fused_eligible) if mha else
            (sdpa_math, sdpa_fused, fused_eligible))
        amp = _autocast_dtype(autocast, _device(node))
        if policy == "fused" and fused and eligible(
                node, any_dtype=True, autocast=amp, dropout=dropout,
                bias_grad=bias_grad):
            target = fused_target
        elif policy == "auto":
            device = _device(node)
            if device is None:
                continue
            if device.type == "cpu":
                if fused and eligible(node, any_dtype=True, autocast=amp,
                                      dropout=dropout, bias_grad=bias_grad):
                    target = fused_target
                elif not mha and _causal_call(node):
                    # A kilnd without Kiln's fused op: large causal
                    # attention keeps PyTorch's flash kernel.
                    n = _scores(node)
                    if n is None or n > CPU_MAX_CAUSAL_SCORES:
                        continue
            else:
                n = _scores(node)
                if n is None or n > CUDA_MAX_SCORES:
                    if not (fused and _cudnn_fused_ok(device) and
                            eligible(node, autocast=amp, dropout=dropout,
                                     bias_grad=bias_grad)):
                        continue
                    target = fused_target
        node.target = target
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced

