"""Issue 17 item 3 through torch.compile(backend=kiln) on the CPU: dropout
and the random ops (rand, randn, rand_like, randn_like, bernoulli) run in
Kiln from a Philox stream whose seed each call draws from torch's
generator. Checked: nothing random falls back; gradients match eager
recomputed with Kiln's mask (the mask native_dropout saved for backward);
torch.manual_seed makes runs reproducible and successive calls differ; the
keep fraction and the distributions are PyTorch's; eval mode is unaffected.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import kiln

RANDOM_OPS = {"native_dropout", "native_dropout_backward", "rand", "randn",
              "rand_like", "randn_like", "bernoulli"}


class DropoutMLP(nn.Module):
    """Sigmoid before the dropout: its input is never 0, so the mask is
    exactly where the dropout output is nonzero."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x):
        h = self.drop(torch.sigmoid(self.fc1(x)))
        return self.fc2(h), h


def _no_random_fallback(report) -> None:
    for op, r in report.ops.items():
        if op.split(".")[1] in RANDOM_OPS:
            assert not r.fallback, f"{op} fell back: {dict(r.fallback)}"
            assert r.kiln > 0


def test_dropout_train_step_matches_eager_with_kilns_mask(daemon):
    torch.manual_seed(0)
    eager = DropoutMLP(0.1)
    mine = copy.deepcopy(eager)
    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(mine, backend=backend)
    x = torch.randn(32, 16)
    out, h = compiled(x)
    # Kiln's mask, then eager recomputed with it.
    mask = h != 0
    keep = mask.float().mean().item()
    assert 0.8 < keep < 0.97, keep
    s = torch.sigmoid(eager.fc1(x))
    h_ref = s * mask / 0.9
    torch.testing.assert_close(h, h_ref, atol=1e-6, rtol=1e-6)
    out_ref = eager.fc2(h_ref)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    out.square().mean().backward()
    out_ref.square().mean().backward()
    for (name, p_ref), p in zip(eager.named_parameters(), mine.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=1e-5, rtol=1e-4,
                                   msg=lambda m: f"grad of {name}: {m}")
    report = backend.report
    print(f"\ndropout MLP (train): {report.kiln_nodes}/"
          f"{report.kiln_nodes + report.fallback_nodes} ATen nodes in Kiln, "
          f"{report.compiled_partitions} partitions\n{report}")
    _no_random_fallback(report)
    assert "aten.native_dropout.default" in report.ops
    assert "aten.native_dropout_backward.default" in report.ops


def test_dropout_reproducible_from_manual_seed(daemon):
    torch.manual_seed(0)
    model = DropoutMLP(0.5)
    compiled = torch.compile(model, backend=kiln.backend(
        server=daemon.address, fallback="error"))
    x = torch.randn(64, 16)
    torch.manual_seed(123)
    a, ha = compiled(x)
    b, hb = compiled(x)  # the next call draws a new seed
    torch.manual_seed(123)
    c, hc = compiled(x)
    assert torch.equal(a, c) and torch.equal(ha, hc)
    assert not torch.equal(ha != 0, hb != 0)
    keep = (ha != 0).float().mean().item()
    assert 0.4 < keep < 0.6, keep


def test_dropout_keep_fraction_and_scale(daemon):
    f = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.1, True),
                      backend=kiln.backend(server=daemon.address,
                                           fallback="error"))
    x = torch.ones(1 << 20)
    y = f(x)
    kept = y != 0
    # 2^20 draws: the standard error of the keep fraction is 2.9e-4.
    assert abs(kept.float().mean().item() - 0.9) < 2e-3
    assert torch.all(y[kept] == torch.tensor(1 / 0.9, dtype=torch.float32))


def test_dropout_eval_mode_is_identity(daemon):
    torch.manual_seed(0)
    eager = DropoutMLP(0.3).eval()
    compiled = torch.compile(copy.deepcopy(eager), backend=kiln.backend(
        server=daemon.address, fallback="error"))
    x = torch.randn(8, 16)
    out, h = compiled(x)
    ref, h_ref = eager(x)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(h, h_ref)


def _random_fn(x):
    u = torch.rand_like(x)
    z = torch.randn_like(x)
    n = torch.randn(x.shape[0], 4)
    r = torch.rand(x.shape[0], 4, dtype=torch.float16)
    b = torch.bernoulli(torch.full_like(x, 0.25))
    bp = torch.empty_like(x).bernoulli_(0.75)
    return u, z, n, r, b, bp


def test_random_ops_run_in_kiln_with_pytorchs_distributions(daemon):
    backend = kiln.backend(server=daemon.address, fallback="error")
    f = torch.compile(_random_fn, backend=backend)
    x = torch.zeros(1 << 18)
    torch.manual_seed(7)
    u, z, n, r, b, bp = f(x)
    assert u.dtype == torch.float32 and r.dtype == torch.float16
    assert 0 <= u.min() and u.max() < 1 and 0 <= r.min() and r.max() < 1
    assert abs(u.mean().item() - 0.5) < 3e-3
    assert abs(u.var().item() - 1 / 12) < 2e-3
    assert abs(z.mean().item()) < 1e-2 and abs(z.var().item() - 1) < 1.5e-2
    assert abs(n.mean().item()) < 1e-2
    assert abs(b.mean().item() - 0.25) < 5e-3
    assert abs(bp.mean().item() - 0.75) < 5e-3
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    # The streams of one call are distinct.
    assert not torch.equal(u, z)
    torch.manual_seed(7)
    again = f(x)
    assert all(torch.equal(p, q) for p, q in zip((u, z, n, r, b, bp), again))
    _no_random_fallback(backend.report)


def test_partition_seed_follows_placeholders_declared_after_random_ops(daemon):
    """A partition's seed is passed after all of its FX arguments, however
    late its submodule declares some of them. torch.fx's
    fuse_as_graphmodule declares a partition's inputs where they are first
    used in torch 2.11 (2.15 declares them first): with GPT-2's attention
    dropout on CUDA the seed was bound to a weight and every call fell
    back. This builds such a submodule by hand."""
    from torch.fx.experimental.proxy_tensor import make_fx  # noqa: PLC0415

    def f(x, w):
        y, mask = torch.ops.aten.native_dropout(x, 0.5, True)
        return y * w, mask

    x, w = torch.rand(64, 8) + 0.5, torch.rand(8) + 0.5
    sub = make_fx(f, tracing_mode="fake")(x, w)
    w_node = [n for n in sub.graph.nodes if n.op == "placeholder"][1]
    dropout = next(n for n in sub.graph.nodes if n.op == "call_function" and
                   "native_dropout" in str(n.target))
    dropout.append(w_node)  # declared after the random op, as 2.11 did
    sub.recompile()
    assert [n.op for n in sub.graph.nodes][:3] == [
        "placeholder", "call_function", "placeholder"], sub.graph
    backend = kiln.backend(server=daemon.address, fallback="error")
    module = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    module.add_submodule("kiln_0", sub)
    assert backend._compile_partition(module, "kiln_0", sub) is None
    out, mask = module.kiln_0(x, w)
    keep = mask.float().mean().item()
    assert 0.35 < keep < 0.65, keep
    torch.testing.assert_close(out, x * mask / 0.5 * w, atol=1e-6, rtol=1e-6)


def _mixer(x: torch.Tensor) -> torch.Tensor:
    """Random ops between Kiln's pointwise ones, as a routing jitter or a
    sampled gate draws them (transformers' Phimoe)."""
    a = torch.sigmoid(x) * 2
    gate = (torch.rand_like(a) > 0.75).float()
    noise = torch.randn(x.shape) * 0.1
    h = torch.nn.functional.dropout(a + noise, 0.3, training=True)
    keep = torch.bernoulli(torch.full_like(x, 0.6))
    return (h * gate + keep * a).tanh().sum(-1)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_eager_random_draws_pytorchs_numbers(daemon, how, monkeypatch):
    """kiln.backend(eager_random=True), or KILN_EAGER_RANDOM=1, runs the
    random ops eagerly: a seeded forward and backward equal eager's bit for
    bit in the random parts and within rounding elsewhere; the report names
    the reason; the rest is in Kiln. Without it the same seed draws Kiln's
    own numbers (differing)."""
    x = torch.randn(64, 32)
    torch.manual_seed(3)
    xe = x.clone().requires_grad_()
    want = _mixer(xe)
    want.sum().backward()
    if how == "option":
        monkeypatch.delenv("KILN_EAGER_RANDOM", raising=False)
        backend = kiln.backend(server=daemon.address, fallback="error",
                               eager_random=True)
    else:
        monkeypatch.setenv("KILN_EAGER_RANDOM", "1")
        backend = kiln.backend(server=daemon.address, fallback="error")
    torch._dynamo.reset()
    f = torch.compile(_mixer, backend=backend)
    torch.manual_seed(3)
    xk = x.clone().requires_grad_()
    got = f(xk)
    got.sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xk.grad, xe.grad, atol=1e-5, rtol=1e-5)
    report = backend.report
    random_ops = [op for op in report.ops if op.split(".")[1] in
                  (RANDOM_OPS - {"native_dropout_backward"}) | {"uniform"}]
    assert random_ops, report
    for op in random_ops:
        r = report.ops[op]
        assert r.kiln == 0, f"{op} ran in Kiln"
        assert any("eager_random" in why for why in r.fallback), r.fallback
    assert report.kiln_nodes > 0

    # The default: Kiln's own numbers from the same seed.
    monkeypatch.delenv("KILN_EAGER_RANDOM", raising=False)
    torch._dynamo.reset()
    f = torch.compile(_mixer, backend=kiln.backend(
        server=daemon.address, fallback="error"))
    torch.manual_seed(3)
    assert not torch.equal(f(x), _mixer(x))
