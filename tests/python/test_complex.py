"""Complex values as real pairs (kiln/complex.py): Meta's Llama rotary
embedding (view_as_complex, a complex multiply by freqs_cis made with
torch.polar, view_as_real) trains in Kiln, forward and backward, static
and dynamic=True, against eager PyTorch with a real kilnd; the graph pass
alone keeps every AOTAutograd graph's results (each complex op with a
rule, on random inputs); an op without a rule (an FFT, a complex matrix
product) keeps its complex operands and runs eagerly while the rest
compiles."""

from __future__ import annotations

import copy
import warnings
from typing import Any, List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd

import kiln
from conftest import symbolic_module_ints
from kiln.complex import lower_complex

_COMPLEX_OPS = ("aten.view_as_complex.default", "aten.view_as_real.default",
                "aten.mul.Tensor", "aten._conj.default", "aten.polar.default")


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    """As Meta's Llama reference and torchtitan write it."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    shape = [d if i in (1, xq_.ndim - 1) else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class RopeAttention(nn.Module):
    """A Llama attention layer with the complex rotary embedding."""

    def __init__(self, dim: int = 32, heads: int = 4, max_len: int = 64):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False)
                                              for _ in range(4))
        self.register_buffer("freqs_cis",
                             precompute_freqs_cis(dim // heads, max_len))

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q = self.wq(x).view(b, t, h, d // h)
        k = self.wk(x).view(b, t, h, d // h)
        v = self.wv(x).view(b, t, h, d // h)
        q, k = apply_rotary_emb(q, k, self.freqs_cis[:t])
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, d))


def _train_against_eager(compiled, model, x):
    """One forward and backward of compiled (a compiled copy of model) and
    of model on x: outputs and accumulated gradients compared."""
    mine = compiled(x)
    want = model(x)
    torch.testing.assert_close(mine, want, rtol=1e-5, atol=1e-5)
    mine.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(),
                            compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("dynamic", [False, True])
def test_complex_rotary_embedding_trains_in_kiln(daemon, dynamic):
    torch._dynamo.reset()
    torch.manual_seed(0)
    # torch 2.6 makes the modules' ints symbols (conftest.py): the nodes
    # Kiln cannot size then run eagerly, the rotary embedding still in Kiln.
    old_torch = dynamic and symbolic_module_ints()
    backend = kiln.backend(server=daemon.address,
                           fallback="eager" if old_torch else "error")
    model = RopeAttention()
    compiled = torch.compile(copy.deepcopy(model), backend=backend,
                             dynamic=dynamic)
    for t in ((8, 12) if dynamic else (12,)):
        _train_against_eager(compiled, model, torch.randn(2, t, 32))
    report = backend.report
    assert report.graphs == 2, str(report)
    if old_torch:
        return  # (the head dim is d // heads of a symbol: FloorDiv)
    for op in _COMPLEX_OPS:
        assert op not in report.fallbacks, str(report)
    # The projections, the rotary embedding and attention: one partition
    # per graph (forward and backward).
    assert report.partitions == 2, str(report)
    print(f"rope attention: {report.kiln_nodes} nodes in Kiln, "
          f"{report.fallback_nodes} eager, {report.partitions} partitions")


def _checked_backend(lowered: List[int]) -> Any:
    """An AOTAutograd backend that runs each graph as lower_complex
    rewrites it and as traced, and checks both give the same results."""

    def compile_graph(gm, example_inputs):
        ref = copy.deepcopy(gm)
        lowered.append(lower_complex(gm))

        def run(*args):
            got, want = gm(*args), ref(*args)
            for a, b in zip(got, want):
                if isinstance(b, torch.Tensor):
                    assert a.dtype == b.dtype and a.shape == b.shape
                    assert a.stride() == b.stride() or b.numel() <= 1, \
                        (a.stride(), b.stride())
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            return got

        return run

    return aot_autograd(fw_compiler=compile_graph, bw_compiler=compile_graph,
                        decompositions=core_aten_decompositions())


def _every_rule(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Every rule of kiln/complex.py on values derived from x and y."""
    a = torch.view_as_complex(x.reshape(3, 4, 2))
    b = torch.polar(y.abs() + 0.5, y)  # (3, 4)
    c = torch.complex(y, -y * 0.5)
    z = a * b + c - a.conj() * 0.5 + (2.0 - a) + (b + y) - (y - c)
    z = torch.cat([z, -z.t().contiguous().t()], dim=0)  # (6, 4)
    z = z.unsqueeze(0).expand(2, 6, 4).permute(1, 0, 2).transpose(0, 2)
    z = z[1:3].squeeze(-1).select(1, 1) / (y.sum() + 4.0)  # (2, 6)
    z = torch.where(z.real > 0, z, z * b.reshape(2, 6))
    w = z.sum(dim=1, keepdim=True) + z.to(torch.complex128).to(
        torch.complex64).mean()
    return (torch.view_as_real(w * z).sum() + z.abs().sum() + z.imag.sum()
            + z.real.square().sum())


def test_every_rule_keeps_the_graphs_results():
    """lower_complex on the forward and backward graph of _every_rule:
    the rewritten graphs give the traced graphs' results, and the
    gradients match eager."""
    torch._dynamo.reset()
    lowered: List[int] = []
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(24, generator=g), torch.randn(3, 4, generator=g)
    xs, ys = (t.clone().requires_grad_() for t in (x, y))
    out = torch.compile(_every_rule, backend=_checked_backend(lowered))(xs, ys)
    xr, yr = (t.clone().requires_grad_() for t in (x, y))
    want = _every_rule(xr, yr)
    torch.testing.assert_close(out, want)
    out.backward()
    want.backward()
    torch.testing.assert_close(xs.grad, xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ys.grad, yr.grad, rtol=1e-5, atol=1e-6)
    assert len(lowered) == 2 and all(n > 10 for n in lowered), lowered


def _fft_and_matmul(x: torch.Tensor) -> torch.Tensor:
    z = torch.view_as_complex(x.reshape(4, 4, 2)) * 1.5
    f = torch.fft.fft(z, dim=-1)  # no rule: stays complex
    m = z @ z.transpose(0, 1)  # no rule either
    return torch.view_as_real(f * 2.0 + m).tanh().sum()


def test_ops_without_a_rule_keep_their_complex_operands(daemon):
    """An FFT and a complex matrix product run eagerly on complex views of
    the pairs around them; the rest runs in Kiln; results match eager."""
    torch._dynamo.reset()
    lowered: List[int] = []
    g = torch.Generator().manual_seed(4)
    x = torch.randn(32, generator=g)
    torch.compile(_fft_and_matmul, backend=_checked_backend(lowered))(
        x.clone().requires_grad_()).backward()
    assert lowered and lowered[0] > 0, lowered

    torch._dynamo.reset()
    backend = kiln.backend(server=daemon.address, fallback="error")
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = torch.compile(_fft_and_matmul, backend=backend)(xs)
    want = _fft_and_matmul(xr)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    out.backward()
    want.backward()
    torch.testing.assert_close(xs.grad, xr.grad, rtol=1e-5, atol=1e-5)
    report = backend.report
    assert report.op("aten._fft_c2c.default").kiln == 0, str(report)
    assert "aten.tanh.default" not in report.fallbacks, str(report)
    assert report.op("aten.tanh.default").kiln >= 1, str(report)


def test_rotary_graphs_keep_their_results_under_dynamic_sizes():
    """The pass on RopeAttention's graphs with symbolic sequence lengths
    (views and slices whose sizes are graph nodes): the same results, two
    lengths through one compile."""
    torch._dynamo.reset()
    lowered: List[int] = []
    torch.manual_seed(1)
    model = RopeAttention()
    compiled = torch.compile(model, backend=_checked_backend(lowered),
                             dynamic=True)
    for t in (7, 10):
        x = torch.randn(2, t, 32)
        torch.testing.assert_close(compiled(x), model(x))
        compiled(x).sum().backward()
    assert len(lowered) == 2 and all(n > 0 for n in lowered), lowered


def _llama4_rotary(x, inv_freq, positions):
    """transformers' Llama 4 rotary embedding: freqs_cis from torch.polar
    of a transposed product (so with transposed strides), saved for the
    backward as a complex tensor."""
    freqs = (inv_freq[None, :, None].expand(positions.shape[0], -1, 1)
             @ positions[:, None, :].float()).transpose(1, 2)
    cis = torch.polar(torch.ones_like(freqs), freqs) * 0.5
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis[:, :, None, :]).flatten(3).square().sum()


def test_saved_complex_values_keep_their_traced_strides(daemon):
    """A complex value the forward saves for the backward is laid out as
    traced (here transposed), so the backward partition compiled for those
    strides runs it: no partition falls back at run time (before, the
    pair came out contiguous and the backward ran eagerly with a warning)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 6, 3, 8, generator=g)
    inv, pos = torch.rand(4, generator=g), torch.arange(6).expand(2, 6)
    backend = kiln.backend(server=daemon.address, fallback="eager")
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(_llama4_rotary, backend=backend)(xs, inv, pos)
        out.backward()
    assert not [w for w in caught if "kiln" in str(w.message)], \
        [str(w.message) for w in caught]
    want = _llama4_rotary(xr, inv, pos)
    want.backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(xs.grad, xr.grad)
    assert backend.report.fallback_nodes == 0, str(backend.report)
