"""Attention in Kiln (kiln/attention.py, issue 16 item 5): every argument of
F.scaled_dot_product_attention and of nn.MultiheadAttention, forward and
backward through torch.compile(backend=kiln) against eager PyTorch on
random inputs, with a real kilnd; and the policy switch."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.attention import resolve_policy, sdpa_math

FUSED = {"aten._scaled_dot_product_flash_attention_for_cpu.default",
         "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}


def _run(fn, backend, *inputs, dynamic=False, compiled=None, mark=None):
    """fn on copies of inputs eagerly and compiled (torch.compile with
    backend, or `compiled`): outputs and grads."""
    results = []
    for use in (False, True):
        xs = [x.detach().clone().requires_grad_(x.is_floating_point())
              for x in inputs]
        for x in xs if mark is not None else ():
            torch._dynamo.mark_dynamic(x, mark)
        f = fn if not use else compiled or torch.compile(
            fn, backend=backend, dynamic=dynamic)
        out = f(*xs)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                           dtype=torch.float32).to(out.dtype)
        out.backward(grad)
        results.append((out, [x.grad for x in xs if x.requires_grad]))
    return results


def _close(a, b, dtype):
    tol = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2)}[dtype]
    torch.testing.assert_close(a, b, atol=tol[0], rtol=tol[1])


def _no_fused(report):
    """Neither the fused attention op nor its backward reached the graph,
    and every compute node ran in Kiln (what fell back are views)."""
    assert not FUSED & set(report.ops), report
    assert report.op("aten.bmm.default").kiln >= 2, report
    for op, reasons in report.fallbacks.items():
        assert all("view" in r for r in reasons), (op, reasons)


CASES = [
    dict(),
    dict(is_causal=True),
    dict(is_causal=True, l=5, s=9),   # top-left causal with L < S
    dict(is_causal=True, l=9, s=5),
    dict(mask="bool"),
    dict(mask="float", scale=0.37),
    dict(mask="bool-broadcast"),
    dict(gqa=True, is_causal=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(
    f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("policy", ["auto", "decompose"])
def test_sdpa_arguments_match_eager(daemon, case, dtype, policy):
    """Both ways the CPU computes a call: "auto" (Kiln's fused op, the CPU
    runtime's flash kernel) and "decompose" (GEMMs around a softmax)."""
    case = dict(case)
    g = torch.Generator().manual_seed(1)
    b, h, e = 2, 4, 16
    l, s = case.pop("l", 7), case.pop("s", 7)
    hk = 2 if case.pop("gqa", False) else h
    q = torch.randn(b, h, l, e, generator=g).to(dtype)
    k = torch.randn(b, hk, s, e, generator=g).to(dtype)
    v = torch.randn(b, hk, s, e, generator=g).to(dtype)
    mask_kind = case.pop("mask", None)
    kwargs = dict(case, enable_gqa=hk != h)
    extra = ()
    if mask_kind == "bool":
        extra = (torch.rand(b, 1, l, s, generator=g) > 0.3,)
    elif mask_kind == "bool-broadcast":
        extra = (torch.rand(l, s, generator=g) > 0.3,)
    elif mask_kind == "float":
        extra = (torch.randn(b, h, l, s, generator=g).to(dtype),)
    for m in extra:  # no row fully masked (PyTorch's kernels differ there)
        if m.dtype == torch.bool:
            m[..., 0] = True

    def fn(q, k, v, *mask):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask[0] if mask else None, **kwargs)

    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention=policy)
    (a, ga), (c, gc) = _run(fn, backend, q, k, v, *extra)
    _close(a, c, dtype)
    for x, y in zip(ga, gc):
        _close(x, y, dtype)
    if policy == "decompose":
        _no_fused(backend.report)
    elif mask_kind == "float":
        # The mask needs a gradient here (_run's inputs all do): the fused
        # op's backward that gives the bias one.
        assert KILN_DBIAS <= set(backend.report.ops), backend.report
        assert not FUSED & set(backend.report.ops), backend.report
    else:
        assert KILN_FUSED <= set(backend.report.ops), backend.report
        assert not FUSED & set(backend.report.ops), backend.report


def test_sdpa_dynamic_sequence_length(daemon):
    """The sequence length symbolic (as a model's batch and heads are
    usually static in its code)."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = torch.compile(fn, backend=backend)
    for t in (6, 11):
        g = torch.Generator().manual_seed(t)
        q, k, v = (torch.randn(3, 4, t, 8, generator=g) for _ in range(3))
        (a, ga), (c, gc) = _run(fn, None, q, k, v, compiled=compiled, mark=2)
        _close(a, c, torch.float32)
        for x, y in zip(ga, gc):
            _close(x, y, torch.float32)
    assert not FUSED & set(backend.report.ops)


MHA_CASES = [
    dict(),
    dict(key_padding_mask=True),
    dict(causal=True),
    dict(causal=True, key_padding_mask=True),  # merged: no causal hint
    dict(attn_mask="bool"),
    dict(attn_mask="float3d"),  # one (L, S) mask per batch and head
    dict(unbatched=True),
    dict(kdim=24, l=5, s=9),  # separate projections, cross-attention
    dict(bias_kv=True),  # not the fused op's: decomposed under both
]


@pytest.mark.parametrize("case", MHA_CASES, ids=lambda c: "-".join(
    f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("policy", ["auto", "decompose"])
def test_multihead_attention_module(daemon, case, policy):
    """nn.MultiheadAttention with need_weights=False: "auto" writes its
    branch out around Kiln's fused op (mha_fused), "decompose" computes it
    as bmm and softmax (mha_math); both against eager, forward and the
    gradients of the input and of every parameter."""
    torch.manual_seed(0)
    case = dict(case)
    l, s, kdim = case.pop("l", 7), case.pop("s", 7), case.pop("kdim", None)
    bias_kv = case.pop("bias_kv", False)
    mha = nn.MultiheadAttention(32, 4, batch_first=True, kdim=kdim,
                                vdim=kdim, add_bias_kv=bias_kv)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, l, 32, generator=g)
    mem = torch.randn(3, s, kdim, generator=g) if kdim else None
    call = {}
    if case.get("key_padding_mask"):
        kpm = torch.zeros(3, s, dtype=torch.bool)
        kpm[1, 5:] = True
        call["key_padding_mask"] = kpm
    if case.get("causal"):
        call["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(l)
        if "key_padding_mask" in call:  # one mask type (else a warning)
            call["attn_mask"] = call["attn_mask"].isinf()
        call["is_causal"] = True
    if case.get("attn_mask") == "bool":
        m = torch.rand(l, s, generator=g) > 0.7  # True masks out
        m[:, 0] = False
        call["attn_mask"] = m
    elif case.get("attn_mask") == "float3d":
        call["attn_mask"] = torch.randn(3 * 4, l, s, generator=g)
    unbatched = case.get("unbatched", False)

    def fn(x, *params):
        if unbatched:
            x = x[0]
        kv = mem if mem is not None else x
        return mha(x, kv, kv, need_weights=False, **call)[0]

    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention=policy)
    (a, ga), (c, gc) = _run(fn, backend, x)
    _close(a, c, torch.float32)
    _close(ga[0], gc[0], torch.float32)
    if policy == "decompose" or bias_kv:
        _no_fused(backend.report)
    else:
        assert KILN_FUSED <= set(backend.report.ops), backend.report
        assert not FUSED & set(backend.report.ops), backend.report


def test_multihead_attention_parameter_grads(daemon):
    """The fused form's parameter gradients (in_proj, out_proj) match
    eager's: a TransformerEncoderLayer, which calls nn.MultiheadAttention
    with need_weights=False and a key-padding mask."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0,
                                       batch_first=True)
    x = torch.randn(2, 9, 32)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[0, 6:] = True
    backend = kiln.backend(server=daemon.address, fallback="error")
    grads = []
    for f in (layer, torch.compile(layer, backend=backend)):
        layer.zero_grad()
        out = f(x, src_key_padding_mask=kpm)
        out.pow(2).sum().backward()
        grads.append((out.detach(), {n: p.grad.clone()
                                     for n, p in layer.named_parameters()}))
    (a, ga), (c, gc) = grads
    _close(a, c, torch.float32)
    assert ga.keys() == gc.keys()
    for n in ga:
        _close(ga[n], gc[n], torch.float32)
    assert KILN_FUSED <= set(backend.report.ops), backend.report


def test_multihead_attention_dropout_follows_training(daemon):
    """nn.MultiheadAttention's dropout runs inside the fused op while the
    module trains (kiln::attention_dropout) and not in eval mode
    (kiln::attention, the output equal to eager's)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, dropout=0.5, batch_first=True)
    x = torch.randn(2, 40, 32)

    def fn(x):
        return mha(x, x, x, need_weights=False)[0]

    backend = kiln.backend(server=daemon.address, fallback="error")
    out = torch.compile(fn, backend=backend)(x.requires_grad_())
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert KILN_DROPOUT <= set(backend.report.ops), backend.report
    mha.eval()  # with grad enabled: not PyTorch's inference fast path
    backend = kiln.backend(server=daemon.address, fallback="error")
    _close(fn(x), torch.compile(fn, backend=backend)(x), torch.float32)
    assert "kiln.attention.default" in backend.report.ops, backend.report


@pytest.mark.parametrize("policy", ["auto", "decompose"])
def test_attention_dropout_trains_in_kiln(daemon, policy):
    """Dropout inside attention runs as Kiln's Philox dropout (its
    distribution and backward are checked in test_random_models.py), in the
    CPU runtime's flash kernel ("auto": kiln::attention_dropout) or as
    native_dropout ("decompose"): here, that it compiles whole, forward and
    backward, and that with p=0.5 about half of a large probability matrix
    is dropped (v = identity exposes the dropped probabilities)."""
    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention=policy)
    torch.manual_seed(0)
    q = torch.randn(2, 2, 64, 64, requires_grad=True)
    eye = torch.eye(64).expand(2, 2, 64, 64)
    out = torch.compile(lambda q, v: F.scaled_dot_product_attention(
        q, q, v, dropout_p=0.5), backend=backend)(q, eye)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    dropped = (out == 0).float().mean().item()
    assert 0.45 < dropped < 0.55, dropped
    if policy == "decompose":
        assert backend.report.op("aten.native_dropout.default").kiln == 1
    else:
        assert KILN_DROPOUT <= set(backend.report.ops), backend.report
    assert not FUSED & set(backend.report.ops)


def test_attention_inside_activation_checkpointing(daemon):
    """torch.utils.checkpoint (non-reentrant, as Hugging Face's
    gradient_checkpointing_enable() uses it) puts the block in a subgraph
    of Dynamo's graph (tag_activation_checkpoint): its attention is
    rewritten there too, so nothing falls back to the fused kernel, and
    the gradients match eager's."""
    from torch.utils.checkpoint import checkpoint  # noqa: PLC0415
    backend = kiln.backend(server=daemon.address, fallback="eager")
    lin = nn.Linear(16, 48)

    def block(x):
        q, k, v = lin(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(1)

    def f(x):
        return checkpoint(block, x, use_reentrant=False) * 2

    x = torch.randn(2, 8, 16)
    (out, grads), (got, got_grads) = _run(f, backend, x)
    _close(got, out, torch.float32)
    _close(got_grads[0], grads[0], torch.float32)
    assert backend.report.fallback_nodes == 0, backend.report
    assert not FUSED & set(backend.report.ops), backend.report


def test_policy_eager_keeps_the_fused_kernel(daemon, monkeypatch):
    monkeypatch.setenv("KILN_ATTENTION", "eager")
    backend = kiln.backend(server=daemon.address, fallback="error")
    q = torch.randn(2, 2, 5, 8)
    torch.compile(lambda q: F.scaled_dot_product_attention(q, q, q),
                  backend=backend)(q)
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in \
        backend.report.ops


@pytest.mark.parametrize("causal,tokens,dropout", [
    (True, 256, 0.0),    # 2x2x256x256 = 2^18 causal scores
    (True, 64, 0.0),     # 2^14
    (False, 256, 0.0),   # not causal
    (True, 256, 0.2),    # with dropout: kiln::attention_dropout
])
def test_auto_on_the_cpu_fuses_attention(daemon, monkeypatch, causal, tokens,
                                         dropout):
    """"auto" on the CPU: every call fused_eligible takes is Kiln's fused op,
    compiled to the CPU runtime's flash kernel (which skips the masked
    blocks) inside the partition, never PyTorch's flash kernel. Results as
    eager's (with dropout, the eager body of the same op: the mask is
    Kiln's)."""
    from kiln import attention as A
    monkeypatch.delenv("KILN_ATTENTION", raising=False)
    backend = kiln.backend(server=daemon.address, fallback="error")
    q = torch.randn(2, 2, tokens, 16)

    def f(q):
        return F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=causal,
                                              dropout_p=dropout)

    report = backend.report
    if not dropout:
        (out, grads), (got, got_grads) = _run(f, backend, q)
        _close(got, out, torch.float32)
        _close(got_grads[0], grads[0], torch.float32)
        ops = KILN_FUSED
    else:
        x = q.clone().requires_grad_()
        got = torch.compile(f, backend=backend)(x)
        got.backward(torch.ones_like(got))
        # The mask Kiln drew: recomputed by the op's eager body from the
        # same (seed, offset), as the forward and backward ops share it.
        ops = KILN_DROPOUT
        assert got.shape == q.shape and torch.isfinite(x.grad).all()
        kept = (got != 0).float().mean().item()
        assert 0.5 < kept <= 1.0, kept
    assert ops <= set(report.ops), report
    for op in ops:
        assert report.op(op).kiln >= 1 and not report.op(op).fallback, report
    assert not FUSED & set(report.ops), report
    assert report.fallback_nodes == 0 or all(
        "view" in r for rs in report.fallbacks.values() for r in rs), report
    assert A.CPU_MAX_CAUSAL_SCORES == 1 << 16


def test_policy_names():
    assert resolve_policy("decompose") == "decompose"
    assert resolve_policy("fused") == "fused"
    with pytest.raises(ValueError, match="auto, fused, decompose, eager"):
        resolve_policy("flash")


def test_sdpa_math_matches_eager_without_compiling():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    torch.testing.assert_close(
        sdpa_math(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, is_causal=True))


KILN_FUSED = {"kiln.attention.default", "kiln.attention_backward.default"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", [
    dict(), dict(is_causal=True), dict(is_causal=True, l=9, s=5),
    dict(scale=0.37, layout="blhe"), dict(mask="bool"),
    dict(mask="float-ls"),
], ids=["plain", "causal", "causal-l9-s5", "scale-transposed", "bool-mask",
        "float-mask"])
def test_fused_policy_runs_kiln_attention(daemon, case, dtype):
    """attention="fused": scaled_dot_product_attention becomes Kiln's
    kiln::attention op and AOTAutograd's backward its kiln::attention_backward
    (on the CPU Kiln compiles both to the CPU runtime's flash kernel; on
    CUDA to cuDNN's fused attention, tests/gpu/backend_gpu_test.py), in one
    partition with the projections around it, matching eager."""
    case = dict(case)
    g = torch.Generator().manual_seed(3)
    b, h, e = 2, 4, 16
    l, s = case.pop("l", 7), case.pop("s", 7)
    transposed = case.pop("layout", None) == "blhe"
    mask_kind = case.pop("mask", None)
    x = torch.randn(b, l, h * e, generator=g).to(dtype)
    mem = torch.randn(b, s, h * e, generator=g).to(dtype)
    w = torch.randn(3, h * e, h * e, generator=g).to(dtype) / 8
    if mask_kind == "bool":  # [B, 1, L, S], no row fully masked
        mask = torch.rand(b, 1, l, s, generator=g) > 0.3
        mask[..., 0] = True
        case["attn_mask"] = mask
    elif mask_kind == "float-ls":
        case["attn_mask"] = torch.randn(l, s, generator=g).to(dtype)

    def fn(x, mem, w):
        q = (x @ w[0]).view(b, l, h, e).transpose(1, 2)
        k = (mem @ w[1]).view(b, s, h, e).transpose(1, 2)
        v = (mem @ w[2]).view(b, s, h, e).transpose(1, 2)
        if not transposed:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o = F.scaled_dot_product_attention(q, k, v, **case)
        return o.transpose(1, 2).reshape(b, l, h * e) @ w[0].t()

    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention="fused")
    (a, ga), (c, gc) = _run(fn, backend, x, mem, w)
    _close(a, c, dtype)
    for u, y in zip(ga, gc):
        if dtype == torch.float32:
            _close(u, y, dtype)
        else:  # bfloat16 sums through three products: relative to the largest
            err = (u.float() - y.float()).abs().max()
            assert err <= 3e-2 * y.float().abs().max(), (err, y.abs().max())
    report = backend.report
    assert KILN_FUSED <= set(report.ops), report
    for op in KILN_FUSED:
        assert report.op(op).kiln >= 1 and not report.op(op).fallback, report
    assert not FUSED & set(report.ops), report


def test_fused_policy_keeps_what_kiln_fuses_not(daemon):
    """A call Kiln's fused op does not take (3-D query, key and value: no
    heads dim) is decomposed under attention="fused", and the mask gets
    its gradient."""
    q, k, v = (torch.randn(2, 4, 12, requires_grad=True) for _ in range(3))
    mask = torch.randn(4, 4, requires_grad=True)

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention="fused")
    torch.compile(fn, backend=backend)(q, k, v, mask).sum().backward()
    assert mask.grad is not None and mask.grad.abs().sum() > 0
    assert not KILN_FUSED & set(backend.report.ops)
    assert not KILN_DROPOUT & set(backend.report.ops)
    assert backend.report.op("aten.bmm.default").kiln >= 2


KILN_DROPOUT = {"kiln.attention_dropout.default",
                "kiln.attention_dropout_backward.default"}
KILN_DBIAS = {"kiln.attention.default",
              "kiln.attention_backward_dbias.default"}

BIAS_SHAPES = [(2, 4, 7, 9), (1, 4, 7, 9), (2, 1, 7, 9), (7, 9), (4, 1, 9),
               (1, 1, 1, 9)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("shape", BIAS_SHAPES,
                         ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("policy", ["auto", "fused"])
def test_learned_bias_gets_its_gradient(daemon, shape, dtype, policy):
    """A float attn_mask that needs a gradient (a learned position bias, as
    timm's Swin and BEiT pass theirs to scaled_dot_product_attention) runs
    in Kiln's fused op, its backward kiln::attention_backward_dbias (the
    CPU runtime's kernel sums the scores' gradient into the bias), for
    every way the bias broadcasts: the output, q, k, v's gradients and the
    bias's against eager."""
    g = torch.Generator().manual_seed(5)
    b, h, l, s, e = 2, 4, 7, 9, 8
    q = torch.randn(b, h, l, e, generator=g).to(dtype)
    k, v = (torch.randn(b, h, s, e, generator=g).to(dtype) for _ in range(2))
    bias = torch.randn(shape, generator=g).to(dtype)

    def fn(q, k, v, bias):
        return F.scaled_dot_product_attention(torch.tanh(q), k, v,
                                              attn_mask=bias * 2) * 3

    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention=policy)
    (a, ga), (c, gc) = _run(fn, backend, q, k, v, bias)
    _close(a, c, dtype)
    assert len(ga) == len(gc) == 4
    for u, y in zip(ga, gc):
        if dtype == torch.float32:
            _close(u, y, dtype)
        else:  # sums of rounded products: relative to the largest
            err = (u.float() - y.float()).abs().max()
            assert err <= 3e-2 * y.float().abs().max(), (err, y.abs().max())
    report = backend.report
    for op in KILN_DBIAS:
        assert report.op(op).kiln >= 1 and not report.op(op).fallback, report
    assert "kiln.attention_backward.default" not in report.ops, report
    assert not FUSED & set(report.ops), report
    assert report.op("aten.bmm.default").kiln == 0, report


def test_bias_gradient_with_dropout(daemon):
    """kiln::attention_dropout_backward_dbias, compiled and as its eager
    body, equals autograd through attention with the rng's keep mask and
    the bias added, for a bias broadcast over the batch; and a module with
    a learned bias and dropout trains through the dropout ops."""
    from kiln import attention as A
    b, h, l, s, e, p, scale = 2, 3, 5, 9, 8, 0.4, 0.35
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(b, h, n, e, generator=g) for n in (l, s, s))
    bias = torch.randn(1, h, l, s, generator=g)
    backend = kiln.backend(server=daemon.address, fallback="error")
    out, lse, rng = torch.compile(
        lambda q, k, v, bias: torch.ops.kiln.attention_dropout(
            q, k, v, bias, False, scale, p), backend=backend)(q, k, v, bias)
    keep = A.dropout_keep(torch.Size((b, h, l, s)), p, rng).float()
    ys = [x.clone().requires_grad_() for x in (q, k, v, bias)]
    scores = (ys[0] @ ys[1].transpose(-2, -1)) * scale + ys[3]
    want = (torch.softmax(scores, -1) * keep / (1 - p)) @ ys[2]
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    grad = torch.randn(out.shape, generator=g)
    want.backward(grad)
    args = (grad, q, k, v, bias, out, lse, False, scale, p, rng)
    compiled = torch.compile(
        lambda *a: torch.ops.kiln.attention_dropout_backward_dbias(*a),
        backend=backend)(*args)
    assert backend.report.op(
        "kiln.attention_dropout_backward_dbias.default").kiln == 1
    for grads in (compiled, A.attention_dropout_backward_dbias_op(*args)):
        assert len(grads) == 4
        for got, y in zip(grads, ys):
            torch.testing.assert_close(got, y.grad, atol=2e-5, rtol=1e-4)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(h, l, l) / 4)

        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x, attn_mask=self.bias,
                                                  dropout_p=0.25)

    block = Block()
    backend = kiln.backend(server=daemon.address, fallback="error")
    x = torch.randn(b, h, l, e, requires_grad=True)
    torch.compile(block, backend=backend)(x).sum().backward()
    assert block.bias.grad is not None and block.bias.grad.abs().sum() > 0
    assert {"kiln.attention_dropout.default",
            "kiln.attention_dropout_backward_dbias.default"} <= set(
                backend.report.ops), backend.report


def _dropout_reference(q, k, v, keep, p, causal, scale):
    """Attention with the keep mask `keep` applied as dropout, in float32."""
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        rows = torch.arange(q.size(-2)).unsqueeze(-1)
        s = s.masked_fill(torch.arange(k.size(-2)) > rows, float("-inf"))
    probs = torch.softmax(s, dim=-1)
    return (probs * keep / (1 - p)) @ v.float()


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_fused_policy_runs_dropout_in_kiln(daemon, causal):
    """attention="fused" with dropout_p > 0: Kiln's kiln::attention_dropout
    and its backward, compiled whole. The same seed draws the same mask, so
    a first call with v = identity exposes the mask (out = the dropped
    probabilities), and the second call's output and gradients equal
    attention with that mask applied, computed eagerly in float32."""
    b, h, l, s, e, p = 2, 2, 7, 16, 8, 0.3
    scale = 1 / e ** 0.5
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(b, h, n, e, generator=g) for n in (l, s))
    v = torch.randn(b, h, s, s, generator=g)
    eye = torch.eye(s).expand(b, h, s, s).contiguous()

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                              is_causal=causal)

    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention="fused")
    compiled = torch.compile(fn, backend=backend)
    leaves = lambda *xs: [x.clone().requires_grad_() for x in xs]  # noqa: E731
    torch.manual_seed(11)
    dropped = compiled(*leaves(q, k, eye)).detach()
    keep = (dropped != 0).float()
    torch.manual_seed(11)
    xs = leaves(q, k, v)
    out = compiled(*xs)
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad)
    ys = leaves(q, k, v)
    want = _dropout_reference(*ys, keep, p, causal, scale)
    want.backward(grad)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x.grad, y.grad, atol=2e-5, rtol=1e-4)
    # About 1 - p of the probabilities a causal mask leaves are kept.
    live = torch.ones(l, s).tril() if causal else torch.ones(l, s)
    kept = (keep * live).sum() / (live.sum() * b * h)
    assert abs(kept.item() - (1 - p)) < 0.08, kept
    report = backend.report
    for op in KILN_DROPOUT:
        assert report.op(op).kiln >= 1 and not report.op(op).fallback, report
    assert "aten.native_dropout.default" not in report.ops, report


def test_dropout_eager_bodies_draw_kilns_mask(daemon):
    """The custom ops' eager bodies (where Kiln does not run them) draw the
    same Philox mask as Kiln's kernels: a compiled kiln::attention_dropout's
    out equals attention with dropout_keep's mask for the rng it returns,
    the eager backward from that rng equals autograd through that
    reference, and a pair cuDNN drew (LIBRARY_DRAWN) is refused."""
    from kiln import attention as A
    b, h, l, s, e, p, scale = 1, 3, 5, 9, 8, 0.4, 0.35
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(b, h, n, e, generator=g) for n in (l, s, s))
    backend = kiln.backend(server=daemon.address, fallback="error")
    out, lse, rng = torch.compile(
        lambda q, k, v: torch.ops.kiln.attention_dropout(
            q, k, v, None, False, scale, p), backend=backend)(q, k, v)
    assert backend.report.op("kiln.attention_dropout.default").kiln == 1
    assert rng.dtype == torch.int64 and rng.shape == (2,)
    keep = A.dropout_keep(torch.Size((b, h, l, s)), p, rng).float()
    assert 0 < keep.mean() < 1
    ys = [x.clone().requires_grad_() for x in (q, k, v)]
    want = _dropout_reference(*ys, keep, p, False, scale)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    grad = torch.randn(out.shape, generator=g)
    want.backward(grad)
    grads = A.attention_dropout_backward_op(grad, q, k, v, None, out, lse,
                                            False, scale, p, rng)
    for got, y in zip(grads, ys):
        torch.testing.assert_close(got, y.grad, atol=2e-5, rtol=1e-4)
    # The eager forward's own draw: offset 0, its backward consistent.
    _, _, eager_rng = A.attention_dropout_op(q, k, v, None, False, scale, p)
    assert eager_rng[1].item() == 0
    flagged = torch.tensor([rng[0].item(), A.LIBRARY_DRAWN | 3])
    with pytest.raises(RuntimeError, match="cuDNN drew"):
        A.attention_dropout_backward_op(grad, q, k, v, None, out, lse,
                                        False, scale, p, flagged)


def test_fused_head_dim_limit_follows_the_device(daemon):
    """Kiln's fused op takes head dims that are multiples of 8 up to 128 on
    CUDA, up to 256 on devices of sm_90 and later (cuDNN 9), and any head
    dim on the CPU (the runtime's own kernel): here 136 and 12 are fused
    under attention="fused", 136 with dropout too (cuDNN takes up to 128
    with dropout)."""
    from kiln import attention as A
    assert A._fused_max_head_dim(torch.device("cpu")) == 128
    if not torch.cuda.is_available():
        assert A._fused_max_head_dim(torch.device("cuda")) == 128
    for d in (136, 12):
        q, k, v = (torch.randn(1, 2, 4, d, requires_grad=True)
                   for _ in range(3))
        def fn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v)

        backend = kiln.backend(server=daemon.address, fallback="error",
                               attention="fused")
        torch.compile(fn, backend=backend)(q, k, v).sum().backward()
        ops = set(backend.report.ops)
        assert KILN_FUSED <= ops, (d, backend.report)
        torch._dynamo.reset()
    q, k, v = (torch.randn(1, 2, 4, 136, requires_grad=True) for _ in range(3))
    backend = kiln.backend(server=daemon.address, fallback="error",
                           attention="fused")
    torch.compile(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, dropout_p=0.25), backend=backend)(q, k, v).sum().backward()
    assert KILN_DROPOUT <= set(backend.report.ops), backend.report
    torch._dynamo.reset()
