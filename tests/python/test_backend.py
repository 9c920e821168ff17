"""torch.compile(backend="kiln") on the CPU against a real kilnd: small
models of pointwise ops, reductions, softmax, layer norm and GELU, forward
and backward, compared with eager; ops Kiln lacks (kthvalue) run
eagerly and the fallback report names them; strided inputs; dynamic=True;
a daemon that is down (eager with one warning; fallback="error" raises);
two processes and 8 processes at once on one graph (one compile per key);
the autostarted per-user kilnd (and its exit when idle);
KILN_LOG=fallback; the torch_dynamo_backends entry point; the package
imports without torch. See conftest.py for how it runs.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
import warnings
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

import kiln
from conftest import PYTHON_DIR, ROOT

torch.manual_seed(0)


def kiln_warnings(caught):
    return [w for w in caught if str(w.message).startswith("kiln:")]


def check_fwd_bwd(model, backend, *inputs, dynamic=False, atol=1e-5, rtol=1e-5):
    """Runs model eagerly and compiled on the same inputs (leaf copies that
    require grad), compares outputs and the inputs' and parameters' grads."""
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    eager_in = [x.detach().clone().requires_grad_(x.is_floating_point())
                for x in inputs]
    kiln_in = [x.detach().clone().requires_grad_(x.is_floating_point())
               for x in inputs]
    ref = model(*eager_in)
    out = compiled(*kiln_in)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    ref_grads = torch.autograd.grad(ref.sum(), eager_in + params,
                                    allow_unused=True)
    kiln_grads = torch.autograd.grad(out.sum(), kiln_in + params,
                                     allow_unused=True)
    for r, k in zip(ref_grads, kiln_grads):
        torch.testing.assert_close(k, r, atol=atol, rtol=rtol)
    return out


class PointwiseReductions(torch.nn.Module):
    def forward(self, x, y):
        a = torch.tanh(x * 1.5 + y) - torch.sigmoid(y) * x
        b = a.exp().sum(dim=-1, keepdim=True)
        c = (a / b).amax(dim=0) + a.mean(dim=1).sum()
        return c * torch.rsqrt(x.pow(2).mean() + 1e-5)


class SoftmaxLayerNorm(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x):
        h = F.gelu(self.ln(x))
        return torch.softmax(h * 0.5, dim=-1) + F.log_softmax(h, dim=-1) * 0.1


class MLP(torch.nn.Module):
    """Linear layers: mm/addmm run in Kiln as extern GEMM calls."""

    def __init__(self, d=32):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def test_pointwise_and_reductions_forward_backward(daemon):
    backend = kiln.backend(server=daemon.address, fallback="error")
    check_fwd_bwd(PointwiseReductions(), backend, torch.randn(16, 33),
                  torch.randn(16, 33))
    report = backend.report
    assert report.graphs == 2  # forward and backward
    assert report.compiled_partitions == report.partitions >= 2
    assert report.op("aten.tanh.default").kiln >= 1
    assert report.op("aten.amax.default").kiln == 1
    # Every compute node ran in Kiln: what fell back are views at edges.
    for op, reasons in report.fallbacks.items():
        assert all("view" in r for r in reasons), (op, reasons)


def test_recompute_saves_fewer_tensors_and_keeps_compared_values(
        daemon, monkeypatch):
    """recompute=True (AOTAutograd's min-cut partitioner as Inductor uses
    it): the backward of a pointwise chain recomputes it from
    the input instead of reading tensors the forward saved. A value the
    backward compares (amax's backward: eq(max, input)) is still saved:
    recomputed by another kernel it could differ in its last bit and make
    the gradient 0/0 (dynamo.recompute_partition)."""
    from kiln import dynamo

    saved = {}
    compile_graph = dynamo.KilnBackend._compile_graph

    def record(self, gm, example_inputs):
        names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
        if any(n.startswith("tangents") for n in names):
            saved[self.recompute] = [n for n in names
                                     if not n.startswith("tangents")]
        return compile_graph(self, gm, example_inputs)

    monkeypatch.setattr(dynamo.KilnBackend, "_compile_graph", record)

    def chain(x):
        return torch.sigmoid(torch.tanh(x * 1.5) * 3).exp()

    x = torch.randn(8, 16)
    for recompute in (False, True):
        torch._dynamo.reset()
        backend = kiln.backend(server=daemon.address, fallback="error",
                               recompute=recompute)
        check_fwd_bwd(chain, backend, x)
    # The default partitioner saves tanh, sigmoid and exp's outputs; min-cut
    # the input and exp's output (exp's gradient is its output).
    computed = {k: [n for n in v if not n.startswith("primals")]
                for k, v in saved.items()}
    assert len(computed[True]) < len(computed[False]), saved

    def peak(x):
        return (x.exp() / x.exp().sum(-1, keepdim=True)).amax(0)

    # (test_pointwise_and_reductions_forward_backward's amax gave NaN
    # gradients before compared values were saved.)
    torch._dynamo.reset()
    check_fwd_bwd(peak, kiln.backend(server=daemon.address, fallback="error",
                                     recompute=True),
                  torch.randn(24, 22))
    check_fwd_bwd(PointwiseReductions(),
                  kiln.backend(server=daemon.address, fallback="error",
                               recompute=True),
                  torch.randn(16, 33), torch.randn(16, 33))


class NormAct(torch.nn.Module):
    """A norm, SiLU, and a loss that reads the SiLU's output in its
    backward (as a square's derivative does); with `linear`, also a Linear
    that reads the SiLU's output (a GEMM reads its input from memory)."""

    def __init__(self, norm, linear=None):
        super().__init__()
        self.norm, self.linear = norm, linear

    def forward(self, x):
        h = F.silu(self.norm(x))
        if self.linear is not None:
            h = self.linear(h)
        return h.square().mean()


def compare_step(eager, compiled, x):
    """One step (forward, backward of the scalar loss) of each on copies of
    x: the losses and x's gradients agree."""
    xe, xk = (x.clone().requires_grad_() for _ in range(2))
    ref, out = eager(xe), compiled(xk)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    ref.backward()
    out.backward()
    torch.testing.assert_close(xk.grad, xe.grad, atol=1e-5, rtol=1e-5)


def check_module_fwd_bwd(model, backend, x):
    """check_fwd_bwd for a module with state (batch norm's running
    statistics): eager runs a copy, and the copy's gradients and state are
    compared with the compiled module's."""
    eager = copy.deepcopy(model)
    compare_step(eager, torch.compile(model, backend=backend), x)
    for (name, k), e in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(k.grad, e.grad, atol=1e-5, rtol=1e-5,
                                   msg=name)
    for k, e in zip(model.buffers(), eager.buffers()):
        torch.testing.assert_close(k, e)


@pytest.mark.parametrize("norm,shape", [
    (lambda: torch.nn.GroupNorm(4, 16), (2, 16, 5, 6)),
    (lambda: torch.nn.BatchNorm2d(16), (3, 16, 5, 4)),
    (lambda: torch.nn.BatchNorm1d(16, track_running_stats=False), (6, 16)),
    (lambda: torch.nn.LayerNorm(24), (3, 7, 24)),
], ids=["group", "batch", "batch-no-stats", "layer"])
def test_norm_outputs_are_recomputed_in_the_backward(daemon, monkeypatch,
                                                     norm, shape):
    """kiln/remat.py: the backward reads a norm's output and the SiLU of it
    as expressions of the norm's input and statistics, which it has anyway,
    so neither is saved (a write and a read of the tensor fewer), and the
    gradients are eager's. Where a GEMM reads the SiLU's output it stays
    saved (recomputing it would write it in the backward instead)."""
    from kiln import dynamo

    saved = []  # per backward graph: the computed tensors the forward saved
    compile_graph = dynamo.KilnBackend._compile_graph

    def record(self, gm, example_inputs):
        nodes = list(gm.graph.find_nodes(op="placeholder"))
        if any(n.name.startswith("tangents") for n in nodes):
            saved.append([(n.name, n.meta["val"].numel()) for n in nodes
                          if not n.name.startswith(("tangents", "primals"))])
        return compile_graph(self, gm, example_inputs)

    monkeypatch.setattr(dynamo.KilnBackend, "_compile_graph", record)
    torch.manual_seed(0)
    x = torch.randn(*shape)
    torch._dynamo.reset()
    check_module_fwd_bwd(NormAct(norm()), kiln.backend(
        server=daemon.address, fallback="error"), x)
    # Saved: the input, weight, bias (graph inputs) and the statistics.
    assert saved and all(numel < x.numel() for _, numel in saved[-1]), saved
    torch._dynamo.reset()
    check_module_fwd_bwd(NormAct(norm(), torch.nn.Linear(shape[-1], 8)),
                         kiln.backend(server=daemon.address, fallback="error"),
                         x)
    # The GEMM's operand (the SiLU's output or its view) is saved.
    assert any(numel == x.numel() for _, numel in saved[-1]), saved


@pytest.mark.parametrize("norm", [
    lambda: torch.nn.GroupNorm(4, 16),
    lambda: torch.nn.BatchNorm2d(16),
], ids=["group", "batch"])
def test_norm_outputs_are_recomputed_under_dynamic_shapes(daemon, monkeypatch,
                                                          norm):
    """The same with dynamic=True: two batch sizes, one graph per direction
    (the expression adds no guard on the batch), eager's values and
    gradients, only the statistics saved (rank 2 or 1, x's is 4)."""
    from kiln import dynamo

    graphs, saved = [], []
    compile_graph = dynamo.KilnBackend._compile_graph

    def record(self, gm, example_inputs):
        nodes = list(gm.graph.find_nodes(op="placeholder"))
        graphs.append(gm)
        if any(n.name.startswith("tangents") for n in nodes):
            saved.append([n.meta["val"].dim() for n in nodes
                          if isinstance(n.meta.get("val"), torch.Tensor) and
                          not n.name.startswith(("tangents", "primals"))])
        return compile_graph(self, gm, example_inputs)

    monkeypatch.setattr(dynamo.KilnBackend, "_compile_graph", record)
    torch._dynamo.reset()
    model = NormAct(norm())
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=kiln.backend(
        server=daemon.address, fallback="error"), dynamic=True)
    torch.manual_seed(0)
    for batch in (3, 5):
        compare_step(eager, compiled, torch.randn(batch, 16, 5, 6))
    assert len(graphs) == 2, graphs  # forward and backward, no recompile
    assert saved and all(rank < 4 for rank in saved[0]), saved


def test_input_mutations_are_one_foreach_copy(daemon, monkeypatch):
    """Batch norm's running statistics and count are input mutations: the
    forward graph writes them (keep_inference_input_mutations) and
    fx_graph.batch_input_writes makes the two float32 statistics' copy_ one
    torch._foreach_copy_ per step, the int64 count (alone in its dtype)
    keeping its copy_; they are eager's after each step, and no copy_ is
    reported as a fallback."""
    from kiln import fx_graph

    calls = []
    foreach = fx_graph._FOREACH_COPY
    if foreach is None:
        pytest.skip("this torch has no _foreach_copy_")

    def counted(dsts, srcs):
        calls.append(len(dsts))
        return foreach(dsts, srcs)

    monkeypatch.setattr(fx_graph, "_FOREACH_COPY", counted)
    torch._dynamo.reset()
    model = NormAct(torch.nn.BatchNorm2d(16))
    eager = copy.deepcopy(model)
    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(model, backend=backend)
    torch.manual_seed(0)
    for _ in range(3):
        x = torch.randn(4, 16, 5, 6)
        compiled(x.clone().requires_grad_()).backward()
        eager(x.clone().requires_grad_()).backward()
        for k, e in zip(model.buffers(), eager.buffers()):
            torch.testing.assert_close(k, e)
    # One for the float32 statistics per step; the count's group of one
    # keeps its copy_.
    assert calls == [2, 2, 2], calls
    assert "aten.copy_.default" not in backend.report.fallbacks


def _steps_alongside(model: torch.nn.Module, eager: torch.nn.Module,
                     step: Callable[[], Any], eager_step: Callable[[], Any],
                     steps: int) -> Iterator[None]:
    """`steps` training steps of `model` (its optimizer step `step`) and
    its copy `eager` (`eager_step`) on the same random batches of (8, 16);
    yields after each."""
    for _ in range(steps):
        x = torch.randn(8, 16)
        for m in (model, eager):
            m.zero_grad()
            m(x).square().mean().backward()
        step()
        eager_step()
        yield


def test_compiled_optimizer_step_writes_parameters_in_place(daemon,
                                                           monkeypatch):
    """A compiled AdamW step (foreach=True: one Kiln partition) mutates
    every parameter and state. Kiln stores the new values into the
    parameters' and states' own memory (kiln.v1.Graph.input_writes): the
    graph's trailing copies are of each tensor onto itself, so no
    _foreach_copy_ runs, and the parameters and states are eager's after
    each step."""
    from kiln import fx_graph

    copied = []
    foreach = fx_graph._FOREACH_COPY
    if foreach is not None:
        def counted(dsts, srcs):
            copied.append(len(dsts))
            return foreach(dsts, srcs)
        monkeypatch.setattr(fx_graph, "_FOREACH_COPY", counted)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    eager = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2, foreach=True)
    backend = kiln.backend(server=daemon.address, fallback="error",
                           foreach=True)

    @torch.compile(backend=backend)
    def step():
        opt.step()

    addresses = [p.data_ptr() for p in model.parameters()]
    for _ in _steps_alongside(model, eager, step, eager_opt.step, 3):
        for k, e in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(k, e)
            for name in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opt.state[k][name],
                                           eager_opt.state[e][name])
    assert [p.data_ptr() for p in model.parameters()] == addresses
    assert sum(copied) == 0, copied
    assert backend.report.fallback_nodes == 0, backend.report


def test_partitioned_graph_keeps_its_order_after_a_breadth_first_sort(
        daemon, monkeypatch):
    """torch 2.6's fuse_by_partitions re-sorted the partitioned graph
    breadth-first (tools_common.legalize_graph): an optimizer step's graph,
    which returns nothing, came out with its `return ()` before the Kiln
    call and the copies into the parameters, so the parameters never moved.
    kiln.partition restores the graph's order after fusing. This sorts
    breadth-first after torch's fusion here too (torch 2.15 sorts stably),
    then checks an SGD step and a batch-norm training step (its running
    statistics are written into buffers) against eager."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.tools_common import legalize_graph

    fuse = CapabilityBasedPartitioner.fuse_partitions

    def fuse_then_sort_breadth_first(self, partitions, prefix="fused_"):
        return legalize_graph(fuse(self, partitions, prefix=prefix))

    monkeypatch.setattr(CapabilityBasedPartitioner, "fuse_partitions",
                        fuse_then_sort_breadth_first)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9,
                          foreach=True)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=1e-2, momentum=0.9,
                                foreach=True)
    backend = kiln.backend(server=daemon.address, fallback="error",
                           foreach=True)
    step = torch.compile(opt.step, backend=backend)
    for _ in _steps_alongside(model, eager, step, eager_opt.step, 2):
        for k, e in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(k, e)
    assert backend.report.compiled_partitions >= 1, backend.report

    torch._dynamo.reset()
    bn = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8))
    eager_bn = copy.deepcopy(bn)
    compiled = torch.compile(bn, backend=kiln.backend(
        server=daemon.address, fallback="error"))
    x = torch.randn(8, 16)
    # (Not the sum of squares: that of a batch norm's output is nearly
    # constant, its gradient rounding noise on either side.)
    w = torch.randn(8, 8)
    (compiled(x) * w).sum().backward()
    (eager_bn(x) * w).sum().backward()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(bn[1], name),
                                   getattr(eager_bn[1], name), msg=name)
    for (name, k), e in zip(bn.named_parameters(), eager_bn.parameters()):
        torch.testing.assert_close(k.grad, e.grad, msg=name)


def test_refused_input_writes_compile_without_them(daemon, monkeypatch):
    """An input write kilnd refuses (INVALID_ARGUMENT naming it) costs the
    partition nothing: it is compiled again without input writes, runs in
    Kiln and gives eager's results."""
    from kiln import dynamo

    def bogus(module, call, graph):
        return {0: len(graph.tensor_inputs) + 3}  # no such input

    monkeypatch.setattr(dynamo, "input_write_candidates", bogus)
    torch._dynamo.reset()
    backend = kiln.backend(server=daemon.address, fallback="error")
    f = torch.compile(lambda x: (x * 2).sin(), backend=backend)
    x = torch.randn(5, 7)
    torch.testing.assert_close(f(x), (x * 2).sin())
    assert backend.report.fallback_nodes == 0, str(backend.report)
    assert backend.report.compiled_partitions == 1, str(backend.report)


_OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True,
                                               foreach=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(
        p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3,
        foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5,
                                             centered=True, foreach=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2, foreach=True),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-2, foreach=True),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-2, foreach=True),
    "radam": lambda p: torch.optim.RAdam(p, lr=1e-2, foreach=True),
    "adadelta": lambda p: torch.optim.Adadelta(p, foreach=True),
    "rprop": lambda p: torch.optim.Rprop(p, foreach=True),
    "asgd": lambda p: torch.optim.ASGD(p, lr=1e-2, foreach=True),
}


@pytest.mark.parametrize("name", sorted(_OPTIMIZERS))
def test_compiled_optimizers_match_eager(daemon, name):
    """torch.optim's foreach optimizers, their step compiled with the
    default backend (on the CPU the foreach ops run in Kiln, the states
    written in place): parameters and every state tensor as eager's after
    four steps, every node in Kiln."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    eager = copy.deepcopy(model)
    opt = _OPTIMIZERS[name](model.parameters())
    eager_opt = _OPTIMIZERS[name](eager.parameters())
    backend = kiln.backend(server=daemon.address, fallback="error")
    step = torch.compile(opt.step, backend=backend)
    for _ in _steps_alongside(model, eager, step, eager_opt.step, 4):
        pass
    for k, e in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(k, e, atol=1e-5, rtol=1e-5)
        for key, value in eager_opt.state[e].items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(opt.state[k][key], value,
                                           atol=1e-5, rtol=1e-5)
    report = backend.report
    assert report.compiled_partitions >= 1, str(report)
    assert report.fallback_nodes == 0, str(report)


def test_softmax_layer_norm_gelu_forward_backward(daemon):
    backend = kiln.backend(server=daemon.address, fallback="error")
    check_fwd_bwd(SoftmaxLayerNorm(), backend, torch.randn(8, 5, 64))
    report = backend.report
    # The composites are lowered by Kiln, not decomposed.
    assert report.op("aten.native_layer_norm.default").kiln == 1
    assert report.op("aten._softmax.default").kiln == 1
    assert report.op("aten.gelu.default").kiln == 1
    assert report.kiln_nodes > report.fallback_nodes


class EmbeddingCrossEntropy(torch.nn.Module):
    """nn.Embedding feeding cross-entropy: after decomposition embedding,
    _log_softmax and nll_loss_forward; backward nll_loss_backward, the
    log-softmax backward and embedding_dense_backward (a scatter-add)."""

    def __init__(self, vocab=50, d=16, classes=12):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.proj = torch.nn.Parameter(torch.randn(d, classes) * 0.3)

    def forward(self, idx, target):
        h = self.emb(idx).sum(dim=1)           # [N, d]
        logits = (h.unsqueeze(-1) * self.proj).sum(dim=1)  # [N, classes]
        # constant_pad_nd; its backward is constant_pad_nd with a negative pad
        logits = F.pad(logits, (0, 1), value=-1e4)
        return F.cross_entropy(logits, target, ignore_index=3)


def test_slice_and_select_backward_run_in_kiln(daemon):
    """The backward of slicing and selecting is slice_scatter and
    select_scatter (into zeros): both run in Kiln."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x):
        return (x[:, 1:5:2].exp() * 2).sum() + x[:, 0].tanh().sum()

    check_fwd_bwd(f, backend, torch.randn(3, 7))
    ran = {op for op in ("aten.slice_scatter.default",
                         "aten.select_scatter.default")
           if backend.report.op(op).kiln >= 1}
    assert ran == {"aten.slice_scatter.default",
                   "aten.select_scatter.default"}, str(backend.report)


def test_embedding_cross_entropy_forward_backward(daemon):
    backend = kiln.backend(server=daemon.address, fallback="error")
    torch.manual_seed(1)
    model = EmbeddingCrossEntropy()
    idx = torch.randint(0, 50, (24, 5))
    target = torch.randint(0, 12, (24,))
    compiled = torch.compile(model, backend=backend)
    out = compiled(idx, target)
    ref = model(idx, target)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    kiln_grads = torch.autograd.grad(out, list(model.parameters()))
    for r, k in zip(ref_grads, kiln_grads):
        torch.testing.assert_close(k, r, atol=1e-5, rtol=1e-5)
    report = backend.report
    assert report.graphs == 2
    for op in ("aten.embedding.default", "aten.nll_loss_forward.default",
               "aten.nll_loss_backward.default",
               "aten.embedding_dense_backward.default",
               "aten.constant_pad_nd.default"):
        assert report.op(op).kiln >= 1, (op, str(report))
    total = report.kiln_nodes + report.fallback_nodes
    print(f"\nkiln: {report.kiln_nodes} of {total} nodes in Kiln; "
          f"fallbacks: {report.fallbacks}")
    # What falls back are views at partition edges only.
    for op, reasons in report.fallbacks.items():
        assert all("view" in r for r in reasons), (op, reasons)


@pytest.mark.parametrize("fallback", ["error", "eager"])
def test_out_of_range_index_raises_index_error_like_eager(daemon, fallback):
    # An id past the vocabulary (or below -V): IndexError as eager raises,
    # naming Kiln's node and op, whatever the fallback; never a silent
    # clamped read or an eager retry. A good call afterwards works.
    backend = kiln.backend(server=daemon.address, fallback=fallback)
    torch.manual_seed(2)
    emb = torch.nn.Embedding(50, 8)
    compiled = torch.compile(lambda ids: emb(ids) * 2.0, backend=backend)
    good = torch.randint(0, 50, (4, 6))
    torch.testing.assert_close(compiled(good), emb(good) * 2.0)
    for bad_id in (50, 1000, -51):
        bad = good.clone()
        bad[1, 3] = bad_id
        with pytest.raises(IndexError):
            emb(bad)  # eager
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(IndexError) as info:
                compiled(bad)
        assert not kiln_warnings(caught), caught
        assert isinstance(info.value, kiln.KilnIndexError)
        message = str(info.value)
        assert "aten.embedding.default" in message, message
        assert (f"index {bad_id} is out of range for dimension 0 of size 50"
                in message), message
        torch.testing.assert_close(compiled(good), emb(good) * 2.0)
    assert backend.report.op("aten.embedding.default").kiln >= 1


def test_fast_math_is_another_compile(daemon):
    """fast_math=True is part of the request: a second compile (another
    guard key) whose results stay close to eager's."""
    x = torch.randn(8, 5, 64)
    compiles = []
    for fast_math in (False, True):
        torch._dynamo.reset()
        backend = kiln.backend(server=daemon.address, fast_math=fast_math,
                               fallback="error")
        model = SoftmaxLayerNorm()
        start = backend.counters()
        check_fwd_bwd(model, backend, x, atol=1e-4, rtol=1e-4)
        end = backend.counters()
        served = {k: end[k] - start[k] for k in end}
        assert sum(served.values()) == backend.report.compiled_partitions > 0
        compiles.append(served["compiles"])
    # The same graphs with fast_math are new keys: each one compiled.
    assert compiles[1] == backend.report.compiled_partitions, compiles


def test_cuda_matmul_options_follow_pytorchs_flags():
    """The CompileOptions a CUDA graph is compiled with are PyTorch's
    matrix-product and convolution flags at compile time (TF32,
    reduced-precision reductions, cuDNN's TF32 and determinism) and the
    backend's fuse_gemm_epilogues: each a different guard key (the flags'
    keys are checked in cuda_codegen_test)."""
    from kiln import _binding
    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    saved = (torch.get_float32_matmul_precision(),
             matmul.allow_fp16_reduced_precision_reduction,
             matmul.allow_bf16_reduced_precision_reduction,
             cudnn.allow_tf32, cudnn.deterministic)
    try:
        cudnn.allow_tf32 = False
        cudnn.deterministic = False
        torch.set_float32_matmul_precision("highest")
        matmul.allow_fp16_reduced_precision_reduction = True
        matmul.allow_bf16_reduced_precision_reduction = True
        assert kiln.backend()._cuda_options() == 0
        assert (kiln.backend(fuse_gemm_epilogues=False)._cuda_options()
                == _binding.OPTION_UNFUSED_GEMM_EPILOGUES)
        torch.set_float32_matmul_precision("high")
        assert kiln.backend()._cuda_options() == _binding.OPTION_ALLOW_TF32
        torch.set_float32_matmul_precision("highest")
        matmul.allow_fp16_reduced_precision_reduction = False
        matmul.allow_bf16_reduced_precision_reduction = False
        assert kiln.backend()._cuda_options() == (
            _binding.OPTION_STRICT_FP16_REDUCTION
            | _binding.OPTION_STRICT_BF16_REDUCTION)
        matmul.allow_fp16_reduced_precision_reduction = True
        matmul.allow_bf16_reduced_precision_reduction = True
        # cuDNN's flags: TF32 convolutions (PyTorch's default), and
        # determinism from either of PyTorch's two switches.
        cudnn.allow_tf32 = True
        assert (kiln.backend()._cuda_options()
                == _binding.OPTION_ALLOW_TF32_CONVOLUTION)
        cudnn.allow_tf32 = False
        cudnn.deterministic = True
        assert (kiln.backend()._cuda_options()
                == _binding.OPTION_DETERMINISTIC_CONVOLUTIONS)
        cudnn.deterministic = False
        # cudnn.benchmark: each convolution's algorithm timed (Kiln's
        # runtime, per shape).
        cudnn.benchmark = True
        try:
            assert (kiln.backend()._cuda_options()
                    == _binding.OPTION_CUDNN_BENCHMARK)
        finally:
            cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
        try:
            assert (kiln.backend()._cuda_options()
                    == _binding.OPTION_DETERMINISTIC_CONVOLUTIONS
                    | _binding.OPTION_DETERMINISTIC_ALGORITHMS)
        finally:
            torch.use_deterministic_algorithms(False)
    finally:
        torch.set_float32_matmul_precision(saved[0])
        matmul.allow_fp16_reduced_precision_reduction = saved[1]
        matmul.allow_bf16_reduced_precision_reduction = saved[2]
        cudnn.allow_tf32, cudnn.deterministic = saved[3], saved[4]


def test_unsupported_ops_fall_back_and_are_reported(daemon):
    backend = kiln.backend(server=daemon.address, fallback="error")
    model = MLP()
    check_fwd_bwd(model, backend, torch.randn(4, 7, 32), atol=1e-4, rtol=1e-4)
    fallbacks = backend.report.fallbacks
    # The linear layers' products are Kiln's now (issue 16).
    assert "aten.addmm.default" not in fallbacks
    assert "aten.mm.default" not in fallbacks
    assert backend.report.op("aten.addmm.default").kiln >= 1
    assert backend.report.op("aten.native_layer_norm.default").kiln == 1

    # Convolutions are Kiln's too (issue 16); kthvalue is not.
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    report = kiln.explain(conv, torch.randn(2, 3, 8, 8), server=daemon.address)
    assert "aten.convolution.default" not in report.fallbacks, str(report)
    assert report.op("aten.convolution.default").kiln == 1

    class KthValue(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x).kthvalue(2, dim=-1).values

    report = kiln.explain(KthValue(), torch.randn(2, 8),
                          server=daemon.address)
    assert "aten.kthvalue.default" in report.fallbacks, str(report)
    assert report.op("aten.relu.default").kiln == 1
    assert "aten.kthvalue.default" in str(report)


def test_bfloat16(daemon):
    """bfloat16 pointwise ops and reductions run in Kiln (computed in float32,
    rounded per op as eager does). Layer norm's mean/rstd, float32 in Kiln,
    are bfloat16 in PyTorch's CPU kernels: the backend rounds them to it
    (fx_graph.FLOAT32_STATS), so the whole graph runs in Kiln."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x, y):
        return (torch.tanh(x) * y + x.sigmoid()).sum(-1)

    x, y = (torch.randn(8, 64, dtype=torch.bfloat16) for _ in range(2))
    check_fwd_bwd(f, backend, x, y, atol=1e-2, rtol=1e-2)
    assert backend.report.compiled_partitions == backend.report.partitions == 2

    torch._dynamo.reset()
    backend = kiln.backend(server=daemon.address, fallback="error")
    ln = torch.nn.LayerNorm(64).to(torch.bfloat16)
    # weight's grad sums 8 rows of terms up to ~4: a bfloat16 ulp there is
    # 0.03, and eager sums in another order.
    check_fwd_bwd(ln, backend, x, atol=3e-2, rtol=1e-2)
    report = backend.report
    assert report.compiled_partitions == report.partitions == 2, str(report)
    assert report.op("aten.native_layer_norm.default").kiln == 1, str(report)


class ConvNormBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.ln = torch.nn.LayerNorm(8 * 6 * 6)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x))).flatten(1)
        return self.fc(self.ln(h))


def test_autocast_bfloat16_runs_in_kiln(daemon):
    """Mixed precision as CPU training scripts write it: float32 parameters,
    the forward under torch.autocast("cpu", bfloat16). Autocast leaves
    batch and layer norm mixed (bfloat16 activations, float32 weight and
    running statistics; bfloat16 saved statistics): every node runs in Kiln
    and the step matches eager's within bfloat16's rounding."""
    torch.manual_seed(0)
    model = ConvNormBlock()
    mine = copy.deepcopy(model)
    x = torch.randn(4, 3, 6, 6)
    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(mine, backend=backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = model(x), compiled(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    ref.float().square().sum().backward()
    out.float().square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=5e-2, rtol=5e-2,
                                   msg=lambda m, n=name: f"grad of {n}: {m}")
    for b, c in zip(model.buffers(), mine.buffers()):  # running statistics
        torch.testing.assert_close(c, b, atol=1e-2, rtol=1e-2)
    report = backend.report
    assert report.compiled_partitions == report.partitions == 2, str(report)
    for op in ("aten._native_batch_norm_legit_functional.default",
               "aten.native_layer_norm.default"):
        assert report.op(op).kiln == 1 and not report.op(op).fallback, \
            str(report)


def test_mixed_norm_statistics_are_float32_as_eager_keeps_them():
    """Under CPU autocast a batch norm is mixed (bfloat16 input, float32
    weight): PyTorch's kernel returns its saved statistics in float32, its
    fake kernel (the traced graph's meta) in bfloat16.
    align_norm_stats_with_eager sets the forward's statistics and the
    backward's reads of them to float32, as the kernels have them."""
    from torch._functorch.aot_autograd import (aot_module_simplified,
                                               make_boxed_func)

    from kiln.fx_graph import align_norm_stats_with_eager

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=capture,
                                     bw_compiler=capture)

    bn = torch.nn.BatchNorm2d(4)
    x = torch.randn(2, 4, 3, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.compile(lambda t: bn(t.to(torch.bfloat16)),
                          backend=backend)(x)
    y.float().sum().backward()
    eager = torch.ops.aten._native_batch_norm_legit_functional(
        x.detach().bfloat16(), bn.weight, bn.bias, bn.running_mean.clone(),
        bn.running_var.clone(), True, 0.1, 1e-5)
    assert [t.dtype for t in eager[1:3]] == [torch.float32] * 2
    forward, backward = graphs
    for gm in graphs:
        align_norm_stats_with_eager(gm)
    bn_fwd = next(n for n in forward.graph.nodes if "batch_norm" in str(n.target))
    stats = [u for u in bn_fwd.users if u.args[1] in (1, 2)]
    assert stats and all(u.meta["val"].dtype == torch.float32 for u in stats)
    assert bn_fwd.meta["val"][0].dtype == torch.bfloat16  # the output
    bn_bwd = next(n for n in backward.graph.nodes
                  if "batch_norm_backward" in str(n.target))
    assert [bn_bwd.args[i].meta["val"].dtype for i in (5, 6)] == \
        [torch.float32] * 2


def test_a_node_whose_dtype_differs_runs_eagerly_alone(daemon, monkeypatch):
    """Where Kiln's dtype for a node's output differs from PyTorch's, that
    node runs eagerly (the graph is partitioned again without it) and the
    rest in Kiln; the report says which dtypes differ. Made to happen by
    turning off the cast of layer norm's statistics to bfloat16."""
    from kiln import fx_graph

    monkeypatch.setattr(fx_graph, "FLOAT32_STATS", {})
    backend = kiln.backend(server=daemon.address, fallback="eager")
    ln = torch.nn.LayerNorm(64).to(torch.bfloat16)

    def f(x):
        return ln(x * 2).exp()

    x = torch.randn(8, 64, dtype=torch.bfloat16)
    check_fwd_bwd(f, backend, x, atol=1e-2, rtol=1e-2)
    report = backend.report
    reasons = report.fallbacks["aten.native_layer_norm.default"]
    assert any("Kiln gives float32 where PyTorch gives bfloat16" in r
               for r in reasons), str(report)
    assert report.op("aten.mul.Tensor").kiln >= 1, str(report)
    assert report.op("aten.exp.default").kiln >= 1, str(report)


def test_dtypes_kiln_lacks_fall_back(daemon):
    """float64 is not a Kiln dtype: the ops run eagerly, the report says why."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x):
        return torch.softmax(x * 2, dim=-1)

    x = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(torch.compile(f, backend=backend)(x), f(x))
    assert backend.report.partitions == 0
    assert any("float64" in r for r in
               backend.report.fallbacks["aten._softmax.default"]), \
        str(backend.report)


def test_strided_inputs_and_expected_output_strides(daemon):
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x, y):
        return x * 2 + y  # x transposed: eager keeps x's layout

    base = torch.randn(40, 40)
    x = base[3:27, 5:37].t()  # a storage offset and strides (1, 40)
    y = torch.randn(32, 24)
    out = torch.compile(f, backend=backend)(x, y)
    ref = f(x, y)
    torch.testing.assert_close(out, ref)
    assert out.stride() == ref.stride()
    assert backend.report.compiled_partitions == 1


def test_expanded_output_keeps_its_broadcast_strides(daemon):
    """An expand that the partition computes and also returns (BERT's
    token-type ids: gather, then expand over the batch) is expected with
    stride 0; no tensor can be written through overlapping strides, so it
    comes back as its first slice expanded (it once raised "more than one
    element of the written-to tensor refers to a single memory location")."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x, y):
        e = (x * 2).expand(4, 16)
        return e, (e * y).sum()

    x, y = torch.randn(1, 16), torch.randn(4, 16)
    out, ref = torch.compile(f, backend=backend)(x, y), f(x, y)
    torch.testing.assert_close(out, ref)
    assert out[0].stride() == ref[0].stride() == (0, 1)
    assert backend.report.compiled_partitions == 1
    assert backend.report.fallback_nodes == 0


def test_empty_outputs_forward_backward(daemon):
    """Outputs with no element come back from Kiln, forward and backward.
    PyTorch gives an empty tensor strides counted with sizes of at least 1
    ((4, 0) has (1, 1)); the CPU runtime once refused such an output ("the
    program writes contiguous outputs") and the partition fell back."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x, y):
        return (x[:, 0:0] * 2, torch.cat([x, y], 1).relu() + 1, y.sum(1),
                x.t() @ y, y.t().exp())

    x, y = torch.randn(4, 3), torch.randn(4, 0)
    kx, ky = (t.clone().requires_grad_() for t in (x, y))
    ex, ey = (t.clone().requires_grad_() for t in (x, y))
    out, ref = torch.compile(f, backend=backend)(kx, ky), f(ex, ey)
    torch.testing.assert_close(out, ref)
    assert [o.shape for o in out] == [r.shape for r in ref]
    kgrads = torch.autograd.grad(sum(o.sum() for o in out), (kx, ky))
    egrads = torch.autograd.grad(sum(r.sum() for r in ref), (ex, ey))
    torch.testing.assert_close(kgrads, egrads)
    assert backend.report.compiled_partitions == backend.report.partitions == 2


def test_float64_scalar_converts_are_shared(daemon):
    """Under dynamic=True Dynamo passes an unspecialised Python float (an
    RMSNorm eps) as a 0-dim float64 tensor, and AOTAutograd converts it to
    float64 (a no-op) and then to float32 at each use. Kiln has no float64:
    the backend drops the no-op converts and shares one narrowing convert
    per scalar (fx_graph.share_float64_scalar_converts), so one node runs
    eagerly instead of four, and the results are eager's."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    class TwiceNormed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.eps = 1e-6

        def forward(self, x):
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)

    check_fwd_bwd(TwiceNormed(), backend, torch.randn(4, 8, 32), dynamic=True)
    converts = backend.report.op("prims.convert_element_type.default")
    assert sum(converts.fallback.values()) <= 1, converts.fallback
    assert backend.report.compiled_partitions == backend.report.partitions


def test_as_strided_and_as_strided_scatter_run_in_kiln(daemon):
    """as_strided addresses its input's memory (functionalization emits it
    for views of channels-last tensors, e.g. ConvNeXt's and Swin's): of a
    computed value, of a transposed one (Kiln permutes it into memory order
    first), and as_strided_scatter with dims in another order than their
    strides'; forward and backward against eager, nothing left outside but
    views at the edge."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x, y, z):
        a = torch.as_strided(x * 2, (3, 4), (1, 5), 2)
        b = torch.as_strided((y + 1).t(), (2, 3), (6, 1), 1)
        c = torch.as_strided_scatter(x * 3, z.sin(), (2, 2), (1, 6), 3)
        return a.exp(), b * 2, c + 1

    inputs = [torch.randn(4, 6, requires_grad=True),
              torch.randn(4, 6, requires_grad=True),
              torch.randn(2, 2, requires_grad=True)]
    out, ref = torch.compile(f, backend=backend)(*inputs), f(*inputs)
    torch.testing.assert_close(out, ref)
    weights = [torch.randn_like(r) for r in ref]
    grads = [torch.autograd.grad(sum((o * w).sum() for o, w in zip(res, weights)),
                                 inputs) for res in (out, ref)]
    torch.testing.assert_close(grads[0], grads[1])
    assert backend.report.compiled_partitions == 2  # forward, backward
    assert all("edge" in reason for reasons in backend.report.fallbacks.values()
               for reason in reasons), dict(backend.report.fallbacks)


_INDEX_WITH_NONES = {
    "x[:, i]": lambda x, i, j, v: x[:, i] * 2,
    "x[:, i, j]": lambda x, i, j, v: x[:, i, j].exp(),
    "x[i, :, j]": lambda x, i, j, v: x[i, :, j] + 1,  # apart: batch dims first
    "x[..., j]": lambda x, i, j, v: x[..., j].sin(),
    "x[:, :, j[None]]": lambda x, i, j, v: x[:, :, j.unsqueeze(0)] * 3,
    "index_put [:, i] = v": lambda x, i, j, v: torch.ops.aten.index_put(
        x * 1, [None, i], v[:6]) * 2,
    "index_put [:, i, j] += v": lambda x, i, j, v: torch.ops.aten.index_put(
        x * 1, [None, i, j], v[:4], True),
    "index_put [i, :, j] += v": lambda x, i, j, v: torch.ops.aten.index_put(
        x * 1, [i, None, j], v[:5].unsqueeze(0), True),
}


@pytest.mark.parametrize("case", list(_INDEX_WITH_NONES))
def test_index_with_nones_runs_in_kiln(daemon, case):
    """x[:, i] and the like reach a backend as index.Tensor with None for
    the dims taken whole (and their backward as index_put): Kiln indexes
    the leading dims, so the backend permutes the indexed dims first and
    the broadcast dims back to PyTorch's place (kept in place when the
    indexed dims are adjacent, first otherwise); index_put's values are
    broadcast and permuted the same way. Falcon's, Mixtral's and
    Whisper's graphs have them."""
    backend = kiln.backend(server=daemon.address, fallback="error")
    f = _INDEX_WITH_NONES[case]
    x = torch.randn(4, 5, 6, requires_grad=True)
    i, j = torch.tensor([0, 3, 2, 1]), torch.tensor([5, 0, 2, 2])
    v = torch.randn(6, requires_grad=True)
    out, ref = torch.compile(f, backend=backend)(x, i, j, v), f(x, i, j, v)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    got = torch.autograd.grad((out * w).sum(), (x, v), allow_unused=True)
    want = torch.autograd.grad((ref * w).sum(), (x, v), allow_unused=True)
    torch.testing.assert_close(got, want)
    assert all("edge" in reason for reasons in backend.report.fallbacks.values()
               for reason in reasons), dict(backend.report.fallbacks)


def test_dynamic_non_contiguous_outputs(daemon):
    """Eager keeps a transposed input's layout in x.t() * 2 + 1; with symbolic
    sizes the expected strides are expressions evaluated per call."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x):
        return x.t() * 2 + 1

    compiled = torch.compile(f, backend=backend, dynamic=True)
    for shape in ((5, 7), (6, 9)):
        x = torch.randn(*shape)
        out, ref = compiled(x), f(x)
        torch.testing.assert_close(out, ref)
        assert out.stride() == ref.stride() == (1, shape[1])
    assert backend.report.compiled_partitions == 1
    assert backend.report.dynamic_partitions == 1


@pytest.fixture
def parts(monkeypatch):
    """The KilnPartitions the test's compiles make, in order."""
    from kiln import dynamo

    made = []
    init = dynamo.KilnPartition.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(dynamo.KilnPartition, "__init__", record)
    return made


def test_permuted_outputs_are_written_in_place_not_copied(daemon, parts):
    """An output PyTorch expects in a permuted dense layout (a transpose, a
    channels-last tensor) is written by Kiln in that order and handed over
    as a view: no partition keeps a copy for it (KilnPartition._strides
    all None) and each has the permutation (fx_graph.permuted_layout)."""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def f(x, y):
        return (x * 2 + 1).sin(), (y.t() * 3).exp()

    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    y = torch.randn(6, 7)
    for dynamic in (False, True):
        torch._dynamo.reset()
        parts.clear()
        compiled = torch.compile(f, backend=backend, dynamic=dynamic)
        got, want = compiled(x, y), f(x, y)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride()
        assert parts and all(all(s is None for s in p._strides) for p in parts)
        assert sorted(len(perm) for p in parts for _, perm in p._perms) == [2, 4]


def test_views_leaving_a_partition_alias_their_base(daemon, parts):
    """Views that leave a partition and that Kiln need not write (of its
    inputs, as a forward saves t(weight) for the backward; an expand; a
    view of a value it returns anyway; a slice with gaps) stay in it and
    come back as views of those tensors (fx_graph.ViewOutput), as eager's
    do: nothing is left out of the partition, and each result has eager's
    values and strides and shares its base's storage. Static (the
    extension's call path) and symbolic sizes (the Python path)."""
    from torch.fx.experimental.proxy_tensor import make_fx


    def f(x, w):
        wt = w.t()
        h = torch.tanh(x * 2.0)
        s = h.sum(1, keepdim=True)
        return (h, wt, h.view(-1), s.expand(-1, 6), (wt * 3).exp().t(),
                x[1:, 1:], torch.ops.aten.alias(h))

    x, w = torch.randn(5, 6), torch.randn(6, 3)
    want = f(x, w)
    for mode in ("fake", "symbolic"):
        parts.clear()
        backend = kiln.backend(server=daemon.address, fallback="error")
        gm = make_fx(f, tracing_mode=mode)(x, w)
        compiled = backend._compile_graph(gm, [x, w])
        got = compiled([x, w])
        assert backend.report.fallback_nodes == 0, str(backend.report)
        assert len(parts) == 1 and len(parts[0].graph.view_outputs) == 5
        assert (parts[0]._fast is not None) == (mode == "fake") or \
            kiln._binding.extension() is None
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
            assert g.stride() == e.stride()
        h, wt, flat, expanded, _, sliced, alias = got
        assert wt.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
        assert sliced.untyped_storage().data_ptr() == \
            x.untyped_storage().data_ptr()
        assert sliced.storage_offset() == 7
        for v in (flat, alias):
            assert v.data_ptr() == h.data_ptr() and v is not h
        assert expanded.stride() == (1, 0)


def test_dynamic_convolutions_compile_per_size(daemon):
    """dynamic=True on a ConvNet (convolution, batch norm, pooling over
    symbolic spatial sizes, which Kiln lays out at compile time): one
    Dynamo graph per direction, a Kiln compile per concrete size on its
    first call (dynamo.SpecializedGraph; the first call runs compiled
    too), reused for the size's later calls; every node in Kiln, outputs
    and gradients as eager's."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 4, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten())
    mine = copy.deepcopy(model)
    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(mine, backend=backend, dynamic=True)
    specializations = []
    for n, hw in ((4, 16), (3, 12), (4, 16)):
        x = torch.randn(n, 3, hw, hw)
        out = compiled(x)
        ref = model(x)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        out.square().sum().backward()
        ref.square().sum().backward()
        for p_k, p_e in zip(mine.parameters(), model.parameters()):
            torch.testing.assert_close(p_k.grad, p_e.grad, atol=1e-4,
                                       rtol=1e-4)
        specializations.append(backend.report.specializations)
    report = backend.report
    assert report.graphs == 2, str(report)  # no Dynamo recompile
    assert specializations == [2, 4, 4], specializations  # fw + bw per size
    assert report.fallback_nodes == 0, str(report)
    assert report.compiled_partitions == report.partitions


def test_permuted_layout_rules():
    from kiln.fx_graph import permuted_layout

    assert permuted_layout(torch.empty(3, 4).t()) == [1, 0]
    assert permuted_layout(torch.empty(2, 3, 4, 5).to(
        memory_format=torch.channels_last)) == [0, 2, 3, 1]
    assert permuted_layout(torch.empty(6, 8)[:, ::2]) is None  # gaps
    assert permuted_layout(torch.empty(4, 1).expand(4, 5)) is None  # overlap


def test_dynamic_shapes(daemon):
    backend = kiln.backend(server=daemon.address, fallback="error")
    model = SoftmaxLayerNorm(d=16)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch in (3, 5, 9):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5,
                                       rtol=1e-5)
    assert backend.report.graphs == 1  # one graph for all batch sizes
    assert backend.report.compiled_partitions >= 1
    assert backend.report.dynamic_partitions == backend.report.compiled_partitions
    assert backend.report.op("aten._softmax.default").kiln == 1
    for rows in (6, 11):
        check_fwd_bwd(PointwiseReductions(), backend, torch.randn(rows, 10),
                      torch.randn(rows, 10), dynamic=True)
    # A forward and a backward graph for both sizes (no recompile), with
    # symbolic sizes in Kiln (a partition over 0-dim values has none).
    assert backend.report.graphs == 3
    assert backend.report.dynamic_partitions >= 3
    # mean's backward divides by a symbolic count: a 0-dim input to Kiln.
    reasons = [r for rs in backend.report.fallbacks.values() for r in rs]
    assert not [r for r in reasons if "Sym" in r], reasons


def test_daemon_down_runs_eagerly_with_one_warning():
    backend = kiln.backend(server="127.0.0.1:1")
    model = SoftmaxLayerNorm(d=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_fwd_bwd(model, backend, torch.randn(4, 16))
    ours = kiln_warnings(caught)
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "unreachable" in str(ours[0].message)
    assert backend.report.compiled_partitions == 0
    assert any("unreachable" in r for reasons in backend.report.fallbacks.values()
               for r in reasons)


def test_daemon_killed_then_back(monkeypatch):
    """Compiled partitions keep running without kilnd; a graph compiled
    while it is down runs eagerly (one warning); once kilnd is back (same
    address), the next graph compiles in Kiln again."""
    from conftest import Daemon
    from kiln import dynamo

    monkeypatch.setattr(dynamo, "_RETRY_SECONDS", 0.0)
    daemon = Daemon()
    backend = kiln.backend(server=daemon.address)
    def f0(x):
        return torch.softmax(x * 2, dim=-1)

    def f1(x):
        return torch.tanh(x * 3).sum(-1)

    def f2(x):
        return torch.sigmoid(x + 4).amax(-1)

    fns = [f0, f1, f2]  # three code objects: three Dynamo compiles
    x = torch.randn(4, 16)
    first = torch.compile(fns[0], backend=backend)
    torch.testing.assert_close(first(x), fns[0](x))
    assert backend.report.compiled_partitions == 1
    port = daemon.address.rsplit(":", 1)[1]
    daemon.stop()
    torch.testing.assert_close(first(x * 2), fns[0](x * 2))  # no daemon needed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(fns[1], backend=backend)(x),
                                   fns[1](x))
    assert len(kiln_warnings(caught)) == 1
    assert backend.report.compiled_partitions == 1
    back = Daemon(extra=[f"--listen=127.0.0.1:{port}"])
    try:
        torch.testing.assert_close(torch.compile(fns[2], backend=backend)(x),
                                   fns[2](x))
        assert backend.report.compiled_partitions == 2, str(backend.report)
    finally:
        back.stop()


def test_two_processes_one_compile(daemon):
    """Two processes compile the same model one after the other: the first
    sends a Compile, the second gets the artifact by Lookup."""
    code = (
        "import sys, torch, kiln\n"
        "b = kiln.backend(server=sys.argv[1], fallback='error')\n"
        "f = lambda x: torch.nn.functional.gelu(x * 1.25).sum(-1)\n"
        "x = torch.randn(3, 40)\n"
        "torch.testing.assert_close(torch.compile(f, backend=b)(x), f(x))\n"
        "c = b.counters()\n"
        "print(c['compiles'], c['lookup_hits'])\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    got = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code, daemon.address],
                             env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        got.append(out.stdout.split())
    assert got == [["1", "0"], ["0", "1"]], got


def test_ddp_of_a_compiled_module_matches_eager_ddp(daemon):
    """Two ranks (gloo, loopback) train DistributedDataParallel(torch.compile(
    model, backend=kiln)) with buckets small enough that Dynamo's
    DDPOptimizer splits the graph at their boundaries: every node runs in
    Kiln, and after three steps each rank's gradients are eager DDP's."""
    import socket  # noqa: PLC0415
    code = (
        "import copy, os, sys, torch, torch.nn as nn, kiln\n"
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "rank = int(sys.argv[2])\n"
        "dist.init_process_group('gloo', rank=rank, world_size=2)\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(64, 256), *[nn.Sequential(\n"
        "    nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU())\n"
        "    for _ in range(8)], nn.Linear(256, 10))\n"
        "ref = copy.deepcopy(model)\n"
        "b = kiln.backend(server=sys.argv[1], fallback='error')\n"
        "ddp = DDP(torch.compile(model, backend=b), bucket_cap_mb=1)\n"
        "ddp_ref = DDP(ref, bucket_cap_mb=1)\n"
        "torch.manual_seed(rank + 1)\n"
        "x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))\n"
        "for _ in range(3):\n"
        "    nn.functional.cross_entropy(ddp(x), y).backward()\n"
        "    nn.functional.cross_entropy(ddp_ref(x), y).backward()\n"
        "for p, q in zip(model.parameters(), ref.parameters()):\n"
        "    torch.testing.assert_close(p.grad, q.grad)\n"
        "r = b.report\n"
        "print(r.kiln_nodes, r.fallback_nodes, r.graphs)\n"
        "dist.destroy_process_group()\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    ranks = [subprocess.Popen([sys.executable, "-c", code, daemon.address,
                               str(rank)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    try:
        for proc in ranks:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
            kiln_nodes, fallback_nodes, graphs = map(int, out.split())
            assert kiln_nodes > 0 and fallback_nodes == 0, out
            assert graphs > 2, f"a graph per bucket and direction: {out}"
    finally:  # a rank that failed leaves the other waiting in gloo
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_eight_processes_start_together_one_compile_per_key(tmp_path):
    """8 processes start together against a kilnd with an empty cache and
    compile the same model (forward and backward) at the same moment (a
    start file releases them once all are ready): each is served (every
    partition in Kiln, results equal to eager's) and kilnd compiles each key
    once (single flight: the others join the compile or hit the cache)."""
    from conftest import Daemon

    processes = 8
    go = tmp_path / "go"
    code = (
        "import os, sys, time, torch, kiln\n"
        "torch.set_num_threads(1)\n"
        "b = kiln.backend(server=sys.argv[1], fallback='error')\n"
        "def f(x, w):\n"
        "    h = torch.nn.functional.layer_norm(x * w, (x.shape[-1],))\n"
        "    return torch.softmax(torch.tanh(h) * 2, dim=-1)\n"
        "x = torch.randn(6, 40, requires_grad=True)\n"
        "w = torch.randn(40, requires_grad=True)\n"
        "c = torch.compile(f, backend=b)\n"
        "open(sys.argv[2] + '.' + sys.argv[3], 'w').close()\n"
        "deadline = time.time() + 120\n"
        "while not os.path.exists(sys.argv[2]) and time.time() < deadline:\n"
        "    time.sleep(0.01)\n"
        "out = c(x, w)\n"
        "ref = f(x, w)\n"
        "torch.testing.assert_close(out, ref)\n"
        "g = torch.autograd.grad(out.square().sum(), (x, w))\n"
        "r = torch.autograd.grad(ref.square().sum(), (x, w))\n"
        "torch.testing.assert_close(g, r)\n"
        "rep, cnt = b.report, b.counters()\n"
        "print(rep.partitions, rep.compiled_partitions, cnt['compiles'], "
        "cnt['lookup_hits'])\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    daemon = Daemon()
    try:
        procs = [subprocess.Popen(
            [sys.executable, "-c", code, daemon.address, str(go), str(i)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(processes)]
        try:
            deadline = time.monotonic() + 240
            while (sum((tmp_path / f"go.{i}").exists()
                       for i in range(processes)) < processes and
                   time.monotonic() < deadline and
                   all(p.poll() is None for p in procs)):
                time.sleep(0.05)
            go.touch()  # all ready (or one failed): release them together
            results = [p.communicate(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for p, (out, err) in zip(procs, results):
            assert p.returncode == 0, err[-3000:]
        rows = [list(map(int, out.split())) for out, _ in results]
        partitions = rows[0][0]
        assert partitions >= 2, rows  # a forward and a backward partition
        for parts, compiled, compiles, hits in rows:
            assert parts == compiled == partitions, rows  # each one served
            assert compiles + hits == partitions, rows
        m = daemon.metrics()
        # One compile per key: as many compiles as cache entries, none
        # failed, and the rest of the 8 x partitions requests were joins of
        # a compile in flight or hits.
        assert m["kiln_compile_errors_total"] == 0, m
        assert m["kiln_compiles_total"] == m["kiln_cache_entries"], m
        assert 0 < m["kiln_compiles_total"] <= partitions, m
        assert m["kiln_compiles_total"] + m["kiln_joins_total"] + \
            m["kiln_cache_hits_total"] >= processes * partitions, m
        print(f"\n{processes} processes, {partitions} partitions each: "
              f"{m['kiln_compiles_total']:.0f} compiles, "
              f"{m['kiln_joins_total']:.0f} joins, "
              f"{m['kiln_cache_hits_total']:.0f} hits")
    finally:
        daemon.stop()


def test_fallback_error_raises():
    backend = kiln.backend(server="127.0.0.1:1", fallback="error")
    compiled = torch.compile(SoftmaxLayerNorm(d=16), backend=backend)
    with pytest.raises(Exception) as info:
        compiled(torch.randn(4, 16))
    assert "UNAVAILABLE" in str(info.value)
    with pytest.raises(ValueError):
        kiln.backend(fallback="sometimes")


def test_a_graph_pass_that_raises_runs_the_graph_eagerly(daemon, monkeypatch):
    """One of Kiln's passes over AOTAutograd's graphs raising (here the
    norm rematerialization, made to) must not fail the user's step: with
    fallback="eager" Dynamo's graph runs eagerly, warns, and the report
    names the reason; with fallback="error" it raises."""
    import kiln.remat  # noqa: PLC0415

    def broken(*args, **kwargs):
        raise RuntimeError("remat went wrong")

    monkeypatch.setattr(kiln.remat, "rematerialize_norm_outputs", broken)
    torch._dynamo.reset()
    # (AOTAutograd must run: an earlier test's graph in the AOT cache would
    # skip it and the pass.)
    backend = kiln.backend(server=daemon.address, aot_cache=False)
    model = SoftmaxLayerNorm(d=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_fwd_bwd(model, backend, torch.randn(4, 16))
    messages = [str(w.message) for w in kiln_warnings(caught)]
    assert any("RuntimeError: remat went wrong" in m for m in messages), messages
    reasons = {r for per_op in backend.report.fallbacks.values() for r in per_op}
    assert reasons == {"the backend raised RuntimeError: remat went wrong"}
    assert backend.report.kiln_nodes == 0
    torch._dynamo.reset()
    strict = torch.compile(SoftmaxLayerNorm(d=16),
                           backend=kiln.backend(server=daemon.address,
                                                fallback="error",
                                                aot_cache=False))
    with pytest.raises(Exception, match="remat went wrong"):
        strict(torch.randn(4, 16, requires_grad=True)).sum().backward()
    torch._dynamo.reset()


def test_kiln_log_fallback(daemon, monkeypatch, capsys):
    monkeypatch.setenv("KILN_LOG", "fallback")
    backend = kiln.backend(server=daemon.address)

    def f(x):
        return torch.softmax(torch.kthvalue(x, 2, keepdim=True).values, dim=-1)

    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(torch.compile(f, backend=backend)(x), f(x))
    err = capsys.readouterr().err
    assert "fallback aten.kthvalue.default x1: not in Kiln's op set" in err, err


def test_aot_graphs_print_only_when_torch_logs_ask(daemon, monkeypatch):
    """AOTAutograd prints its graphs to strings on every compile unless its
    config says enable_log=False (kiln/aot_logs.py): Kiln's compiles skip
    that, and still log them when torch's logs ask for them."""
    from torch._functorch import aot_autograd  # noqa: PLC0415
    printed = []
    real = torch.fx.GraphModule.print_readable

    def spy(self, *args, **kwargs):
        printed.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.GraphModule, "print_readable", spy)
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    monkeypatch.delenv("TORCH_TRACE", raising=False)
    # pytest's log capture adds its handlers to torch's structured-trace
    # logger, and any handler there counts as a reader: torch's own only.
    from torch._logging import _internal  # noqa: PLC0415
    monkeypatch.setattr(_internal.trace_log, "handlers", [
        h for h in _internal.trace_log.handlers
        if type(h).__name__ == "LazyTraceHandler"])
    base = aot_autograd.AOTConfig
    x = torch.randn(4, 8, requires_grad=True)

    def step():
        torch._dynamo.reset()
        f = torch.compile(lambda t: torch.tanh(t) * 2,
                          backend=kiln.backend(server=daemon.address,
                                               fallback="error",
                                               aot_cache=False))
        f(x).sum().backward()

    step()
    assert printed == [] and aot_autograd.AOTConfig is base
    torch._logging.set_logs(aot_graphs=True)
    try:
        step()
    finally:
        torch._logging.set_logs()
    assert printed, "aot_graphs requested: AOTAutograd prints its graphs"
    assert aot_autograd.AOTConfig is base


def test_entry_point_backend_by_name(daemon, tmp_path):
    """pip installs the package (pyproject.toml) into a directory; a fresh
    process finds backend="kiln" through its torch_dynamo_backends entry
    point."""
    target = tmp_path / "site"
    source = tmp_path / "src"  # setuptools writes build/ next to the sources
    shutil.copytree(ROOT / "python", source,
                    ignore=shutil.ignore_patterns("__pycache__", "build",
                                                  "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(source)], check=True)
    code = (
        "import torch, kiln, kiln.dynamo\n"
        "f = lambda x: torch.softmax(x * 2, dim=-1)\n"
        "x = torch.randn(4, 16)\n"
        "torch.testing.assert_close(torch.compile(f, backend='kiln')(x), f(x))\n"
        "r = kiln.dynamo.default_backend().report\n"
        "assert r.compiled_partitions == 1, str(r)\n"
        "torch._dynamo.reset()\n"
        "g = torch.compile(f, backend='kiln', options={'fast_math': True})\n"
        "torch.testing.assert_close(g(x), f(x))\n"
        "assert kiln.dynamo.named_backend({'fast_math': True}).fast_math\n"
        "print(kiln.__file__)\n")
    env = dict(os.environ, PYTHONPATH=str(target), KILN_SERVER=daemon.address)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True)
    assert out.stdout.strip().startswith(str(target)), out.stdout


def test_named_backend_takes_options_and_modes(daemon, monkeypatch):
    """torch.compile(backend="kiln", options={...}) configures the backend
    as kiln.backend(**options) does (one backend per distinct options);
    an unknown key fails the compile naming it; Inductor's modes run with
    one warning. The entry point itself is what the name resolves to."""
    from kiln import _dynamo_backend
    import kiln.dynamo as kd

    f = lambda x: torch.softmax(x * 2, dim=-1)  # noqa: E731
    x = torch.randn(4, 16)
    opts = {"server": daemon.address, "fast_math": True, "fallback": "error"}
    torch._dynamo.reset()
    got = torch.compile(f, backend=_dynamo_backend, options=opts)(x)
    torch.testing.assert_close(got, f(x))
    configured = kd.named_backend(dict(opts))
    assert configured is kd.named_backend(dict(opts))
    assert configured.fast_math and configured.fallback == "error"
    assert configured.report.compiled_partitions == 1, configured.report
    assert kd.named_backend(None) is kd.default_backend()

    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown option.*fast_maths"):
        torch.compile(f, backend=_dynamo_backend,
                      options={"fast_maths": True})(x)
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        kd.named_backend(None, "fastest")
    torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match="max-autotune"):
        got = torch.compile(f, backend=_dynamo_backend, mode="max-autotune",
                            options=None)(x)
    torch.testing.assert_close(got, f(x))
    # reduce-overhead: CUDA graphs (kiln/cudagraphs.py); a CPU graph runs
    # as without them.
    reduced = kd.named_backend(dict(opts), "reduce-overhead")
    assert reduced.cudagraphs and reduced is not configured
    assert not kd.named_backend(dict(opts, cudagraphs=False),
                                "reduce-overhead").cudagraphs
    torch._dynamo.reset()
    monkeypatch.setenv("KILN_SERVER", daemon.address)  # (mode xor options)
    got = torch.compile(f, backend=_dynamo_backend, mode="reduce-overhead")(x)
    torch.testing.assert_close(got, f(x))
    by_mode = kd.named_backend(None, "reduce-overhead")
    assert by_mode.cudagraphs and by_mode.report.compiled_partitions == 1, \
        by_mode.report


def test_imports_without_torch():
    """With torch hidden from the interpreter, the package still imports,
    loads libkiln_c.so and lists Kiln's ops; torch is never imported."""
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch hidden')\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import kiln\n"
        "ops = kiln.supported_ops()\n"
        "assert 'aten.add.Tensor' in ops and 'aten.kthvalue.default' not in ops\n"
        "kiln.Client('127.0.0.1:1')\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n"
        "    kiln.backend()\n"
        "except ImportError:\n"
        "    print('ok')\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    # Where torch is installed, importing kiln does not import it either.
    lazy = subprocess.run(
        [sys.executable, "-c", "import sys, kiln, kiln.autostart; "
         "print('torch' in sys.modules)"],
        env=env, capture_output=True, text=True)
    assert lazy.stdout.strip() == "False", lazy.stderr


def test_cpu_executable_binding(daemon):
    """The binding's CPU executable on strided tensors, without the
    backend: output_sizes and run_into write into torch.empty tensors."""
    client = kiln.Client(daemon.address)
    graph = (ROOT / "examples" / "graphs" / "dynamic_batch.json").read_text()
    exe = client.cpu_executable(graph)
    x, scale = torch.randn(7, 16), torch.randn(16)
    assert exe.output_sizes([x, scale]) == [(7,)]
    (y,) = exe(x, scale)
    torch.testing.assert_close(y, torch.tanh(x * scale + 1).mean(dim=1))
    out = torch.empty(7)
    exe.run_into([x, scale], [out])
    torch.testing.assert_close(out, y)
    with pytest.raises(kiln.KilnError) as info:
        exe.run_into([x, scale], [torch.empty(6)])
    assert info.value.code_name == "INVALID_ARGUMENT"

    # Several threads on one executable, each with its own batch sizes
    # (views cached per thread and layout).
    import threading

    errors = []

    def work(rows):
        try:
            for _ in range(50):
                a = torch.randn(rows, 16)
                out = torch.empty(rows)
                exe.run_into([a, scale], [out])
                torch.testing.assert_close(
                    out, torch.tanh(a * scale + 1).mean(dim=1))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in (3, 5, 9, 17)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_autostart_starts_one_per_user_daemon(tmp_path):
    """With KILN_SERVER unset and nothing on 127.0.0.1:7733, two processes
    one after the other use one kilnd they started on a Unix socket in
    $XDG_RUNTIME_DIR; with KILN_AUTOSTART=0 none is started (eager)."""
    from kiln import autostart

    if autostart._answers_tcp("127.0.0.1", 7733):
        pytest.skip("something serves 127.0.0.1:7733, the default server")
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, XDG_RUNTIME_DIR=str(runtime),
               XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("KILN_SERVER", None)
    code = (
        "import torch, kiln\n"
        "b = kiln.backend()\n"
        "f = lambda x: torch.softmax(x + 1, dim=-1)\n"
        "x = torch.randn(4, 16)\n"
        "torch.testing.assert_close(torch.compile(f, backend=b)(x), f(x))\n"
        "print(b.report.compiled_partitions, b._address)\n")
    sock = runtime / "kiln" / "kilnd.sock"
    try:
        pids = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", code], env=env,
                                 capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stderr
            assert out.stdout.split() == ["1", f"unix:{sock}"], out.stdout
            pids.append((runtime / "kiln" / "kilnd.pid").read_text())
        assert pids[0] == pids[1]  # the second process found the first's
        off = subprocess.run(
            [sys.executable, "-W", "always", "-c", code.replace(
                "kiln.backend()", "kiln.backend(fallback='eager')")],
            env=dict(env, KILN_AUTOSTART="0",
                     XDG_RUNTIME_DIR=str(tmp_path / "other")),
            capture_output=True, text=True, timeout=300)
        assert off.returncode == 0, off.stderr
        assert off.stdout.split() == ["0", "127.0.0.1:7733"], off.stdout
        assert "kiln: kilnd unreachable" in off.stderr
        assert not (tmp_path / "other" / "kiln" / "kilnd.sock").exists()
    finally:
        pid_file = runtime / "kiln" / "kilnd.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), 9)
            except ProcessLookupError:
                pass


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie left for a parent to reap does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_autostarted_daemon_exits_when_idle(tmp_path):
    """The per-user kilnd runs with --idle_exit_seconds
    (KILN_IDLE_EXIT_SECONDS, default 30 minutes): once the process that
    started it is done and nothing calls it, it exits by itself."""
    from kiln import autostart

    if autostart._answers_tcp("127.0.0.1", 7733):
        pytest.skip("something serves 127.0.0.1:7733, the default server")
    assert autostart.IDLE_EXIT_SECONDS == 1800
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, XDG_RUNTIME_DIR=str(runtime),
               XDG_CACHE_HOME=str(tmp_path / "cache"),
               KILN_IDLE_EXIT_SECONDS="2")
    env.pop("KILN_SERVER", None)
    code = (
        "import torch, kiln\n"
        "b = kiln.backend(fallback='error')\n"
        "f = lambda x: torch.tanh(x - 1).sum(-1)\n"
        "x = torch.randn(4, 16)\n"
        "torch.testing.assert_close(torch.compile(f, backend=b)(x), f(x))\n"
        "print(b.report.compiled_partitions)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"], out.stdout
    pid = int((runtime / "kiln" / "kilnd.pid").read_text())
    try:
        deadline = time.monotonic() + 60
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(pid), "the idle kilnd did not exit"
        log = (runtime / "kiln" / "kilnd.log").read_text()
        assert "idle_exit_seconds=2" in log, log  # kilnd's event=serving
        assert "event=stopping reason=idle" in log, log
        assert "event=stopped" in log, log
    finally:
        if _running(pid):
            os.kill(pid, 9)


def test_a_node_kilnd_refuses_runs_eagerly_and_the_rest_in_kiln(
        daemon, monkeypatch):
    """kilnd refuses a sort (quadratic in Kiln) along more than 4096
    elements (UNIMPLEMENTED naming the node). The partitioner knows that
    limit; here it is raised, as in a client whose limits disagree with its
    kilnd's, so the refusal comes from kilnd, unforeseen: the graph is
    partitioned again without that node, which runs eagerly with the
    reason, and its neighbours compile (dynamo._compile_graph). With
    fallback="error" the refusal raises."""
    monkeypatch.setattr(kiln.partition, "_MAX_SORT_SIZE", 1 << 20)

    def f(x):
        return (x * 2).sort().values.sin() + 1

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 13, generator=g)
    backend = kiln.backend(server=daemon.address, fallback="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: a node is left out
        out = torch.compile(f, backend=backend)(x)
    torch.testing.assert_close(out, f(x), rtol=1e-4, atol=1e-4)
    report = backend.report
    assert report.compiled_partitions == report.partitions == 2, str(report)
    reasons = report.fallbacks["aten.sort.default"]
    assert any("kilnd refused it" in r and "4096" in r for r in reasons), reasons
    assert report.op("aten.sin.default").kiln == 1
    assert report.op("aten.mul.Tensor").kiln == 1

    torch._dynamo.reset()
    strict = kiln.backend(server=daemon.address, fallback="error")
    with pytest.raises(Exception, match="4096"):
        torch.compile(f, backend=strict)(x)


def test_cumsum_is_linear_on_the_cpu(daemon):
    """cumsum is a scan on the CPU (gather_scatter_lowering.cc,
    LinearCumsum), with no size bound: RoBERTa's position ids
    (mask.cumsum(1) over 8 x 512 tokens, 2^21 steps as the quadratic
    reduction it was, refused above 2^18) and a float cumsum over 2^14
    elements with its backward (a flipped cumsum) run whole in Kiln and
    match eager."""

    def positions(ids):
        mask = ids.ne(1).int()
        return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1

    def f(x, w):
        return ((x * w).cumsum(0).div(64).sin() * x).sum()

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 5, (8, 512), generator=g)
    backend = kiln.backend(server=daemon.address, fallback="error")
    got = torch.compile(positions, backend=backend)(ids)
    assert torch.equal(got, positions(ids))

    x = torch.randn(1 << 14, generator=g)
    w = torch.randn(1 << 14, generator=g, requires_grad=True)
    w2 = w.detach().clone().requires_grad_(True)
    torch._dynamo.reset()
    backend = kiln.backend(server=daemon.address, fallback="error")
    out = torch.compile(f, backend=backend)(x, w2)
    ref = f(x, w)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
    ref.backward()
    out.backward()
    torch.testing.assert_close(w2.grad, w.grad, rtol=1e-3, atol=1e-4)
    report = backend.report
    assert report.op("aten.cumsum.default").kiln == 2, str(report)
    assert not report.op("aten.cumsum.default").fallback, str(report)


def test_scatters_over_symbolic_sizes_run_in_kiln(daemon):
    """With dynamic=True an embedding's backward (a scatter-add over the
    symbolic token count) and an index_put without accumulate run in Kiln
    on the CPU (linear scatters, any sizes), for two token counts under one
    compile, and match eager."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8)
    mine = copy.deepcopy(emb)

    def f(m, ids, x, idx, v):
        put = torch.index_put(x, (idx,), v * 2, accumulate=False)
        return m(ids).square().sum() + put.sin().sum()

    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(f, backend=backend, dynamic=True)
    for n in (37, 64):
        ids = torch.randint(0, 50, (2, n))
        x = torch.randn(n + 5)
        idx = torch.randperm(n + 5)[:n]
        v = torch.randn(n)
        want = f(emb, ids, x, idx, v)
        got = compiled(mine, ids, x, idx, v)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
        emb.zero_grad()
        mine.zero_grad()
        want.backward()
        got.backward()
        torch.testing.assert_close(mine.weight.grad, emb.weight.grad,
                                   rtol=1e-5, atol=1e-5)
    report = backend.report
    for op in ("aten.embedding_dense_backward.default",
               "aten.index_put.default"):
        assert report.op(op).kiln >= 1 and not report.op(op).fallback, \
            str(report)


def test_bilinear_upsampling_trains_in_kiln(daemon):
    """A bilinear upsampling's backward is four accumulating index_puts per
    upsampling (PyTorch decomposes it before autograd): linear-time
    scatters in Kiln (LoopNode::kScatter), so the whole forward and
    backward of five upsamplings runs in Kiln and matches eager."""

    class Ups(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            outs = [F.interpolate(y * (k + 1), scale_factor=2, mode="bilinear",
                                  align_corners=False) for k in range(5)]
            return torch.stack(outs).sum(0)

    torch.manual_seed(0)
    model = Ups()
    mine = copy.deepcopy(model)
    x = torch.randn(2, 3, 16, 16)
    backend = kiln.backend(server=daemon.address, fallback="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nodes left out: no fallback warning
        out = torch.compile(mine, backend=backend)(x)
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    ref.square().sum().backward()
    out.square().sum().backward()
    for p, q in zip(model.parameters(), mine.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-3)
    report = backend.report
    assert report.compiled_partitions == report.partitions, str(report)
    index_put = report.op("aten.index_put.default")
    assert index_put.kiln >= 20 and not index_put.fallback, str(report)
    for op, reasons in report.fallbacks.items():
        assert all("edge" in r for r in reasons), str(report)


def test_many_refused_copies_of_one_node_are_left_out_in_one_retry(
        daemon, monkeypatch):
    """A sort is quadratic in Kiln, refused by kilnd along more than 4096
    elements; with the partitioner's own limit raised (as in the test
    above) the partitioner cannot see it coming. Twenty of one signature
    are more refused nodes than the graph is partitioned again for one at a
    time. Nodes alike a refused one (same op, same argument dtypes and
    sizes) are left out with it, so every partition compiles and only the
    sorts run eagerly, forward and backward (a scatter of the gradients
    into the sorted positions, in Kiln)."""
    monkeypatch.setattr(kiln.partition, "_MAX_SORT_SIZE", 1 << 20)

    class Sorts(torch.nn.Module):
        # A ramp far steeper than y spaces the values apart: a sort's
        # gradient follows the order, which two values closer than the
        # products' rounding (Kiln's GEMM against PyTorch's) would swap.
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 5000)
            self.register_buffer("ramp", torch.arange(5000.0) * 1000)

        def forward(self, x):
            y = self.lin(x)
            return torch.stack([(y * (k + 1) + self.ramp).sort(
                -1, descending=True).values for k in range(20)]).sum(0)

    torch.manual_seed(0)
    model = Sorts()
    mine = copy.deepcopy(model)
    x = torch.randn(4, 64)
    backend = kiln.backend(server=daemon.address, fallback="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nodes left out: no fallback warning
        out = torch.compile(mine, backend=backend)(x)
    ref = model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
    w = torch.randn(ref.shape)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    for p, q in zip(model.parameters(), mine.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-2)
    report = backend.report
    assert report.compiled_partitions == report.partitions, str(report)
    assert report.op("aten.sort.default").fallback, str(report)
    assert report.op("aten.sort.default").kiln == 0, str(report)
    for op, reasons in report.fallbacks.items():
        assert op == "aten.sort.default" or all(
            "edge" in r for r in reasons), str(report)


def test_a_graph_with_more_than_a_thousand_inputs_compiles(daemon):
    """A partition's inputs are every parameter and saved tensor it reads:
    a deep model's backward has more than 1024 (torchvision's
    EfficientNet-V2-S: 1195), which kilnd refused whole until its limit
    became 16384 (graph/import.h)."""
    params = [torch.randn(8) for _ in range(1100)]

    def f(x, *ps):
        out = x
        for p in ps:
            out = out * 0.5 + p
        return out

    x = torch.randn(8)
    backend = kiln.backend(server=daemon.address, fallback="error")
    out = torch.compile(f, backend=backend)(x, *params)
    torch.testing.assert_close(out, f(x, *params))
    assert backend.report.compiled_partitions == 1, str(backend.report)


def test_weight_norm_backward_and_new_empty_strided_decompose(daemon):
    """Two ops Core ATen's decompositions leave whole and Kiln does not
    lower, decomposed by kiln/decompositions.py: nn.utils.weight_norm's
    backward (its autograd formula in ATen ops, against eager's
    gradients), and new_empty_strided (PyTorch's decomposition)."""
    from kiln.decompositions import extra_decompositions

    aten = torch.ops.aten
    table = extra_decompositions(frozenset())
    assert aten.new_empty_strided.default in table
    assert aten._weight_norm_interface_backward.default in table
    # Kiln's own lowering wins.
    assert aten.new_empty_strided.default not in extra_decompositions(
        frozenset({"aten.new_empty_strided.default"}))

    torch.manual_seed(0)
    for dim in (0, 2):  # the fused op takes the first or the last dim
        v = torch.randn(6, 5, 3)
        g = torch.rand(*[s if d == dim else 1 for d, s in enumerate(v.shape)]) + 0.5
        w, norms = aten._weight_norm_interface(v, g, dim)
        grad_w = torch.randn_like(w)
        ref = aten._weight_norm_interface_backward(grad_w, v, g, norms, dim)
        got = table[aten._weight_norm_interface_backward.default](
            grad_w, v, g, norms, dim)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    def make():  # weight-normed modules cannot be deep-copied
        torch.manual_seed(1)
        return torch.nn.utils.parametrizations.weight_norm(
            torch.nn.Conv1d(4, 6, 3, padding=1), dim=2)

    conv, mine = make(), make()
    x = torch.randn(2, 4, 10)
    backend = kiln.backend(server=daemon.address, fallback="eager")
    out = torch.compile(mine, backend=backend)(x)
    ref = conv(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    ref.square().sum().backward()
    out.square().sum().backward()
    for (name, p), q in zip(conv.named_parameters(), mine.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"grad of {n}: {m}")
    report = backend.report
    assert not report.op("aten._weight_norm_interface_backward.default").fallback
    assert report.compiled_partitions == report.partitions, str(report)

    # linalg_vector_norm (F.normalize; the orders models use) decomposes too.
    for ord_ in (2, 1, float("inf")):
        def normalize(x, o=ord_):
            return F.normalize(x, p=o, dim=-1) * 3 + torch.linalg.vector_norm(
                x, o)

        torch._dynamo.reset()
        x = torch.randn(5, 7, requires_grad=True)
        backend = kiln.backend(server=daemon.address, fallback="eager")
        out = torch.compile(normalize, backend=backend)(x)
        torch.testing.assert_close(out, normalize(x), rtol=1e-5, atol=1e-5)
        assert not backend.report.fallbacks.get(
            "aten.linalg_vector_norm.default"), str(backend.report)


def test_elu_max_min_dim_and_atan_decompose(daemon):
    """ELU (and its backward), x.max(dim) / x.min(dim) (values and
    indices, with ties and a NaN row) and atan run in Kiln through
    kiln/decompositions.py, forward and backward against eager, with no
    fallback."""

    def f(x, w):
        y = F.elu(x @ w, alpha=0.7)
        mx, imx = y.max(dim=1)
        mn, imn = y.min(dim=-1, keepdim=True)
        return mx + torch.atan(mn).sum(), imx, imn, torch.atan(y * 3)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    x[2] = 0.25  # a row of ties: the first index, as eager
    w = torch.randn(5, 7, generator=g, requires_grad=True)
    backend = kiln.backend(server=daemon.address, fallback="eager")
    out = torch.compile(f, backend=backend)(x, w)
    ref = f(x, w)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    grads = [torch.autograd.grad(o[0].sum() + o[3].square().sum(), w)[0]
             for o in (out, ref)]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-5)
    for op in ("aten.elu.default", "aten.elu_backward.default",
               "aten.max.dim", "aten.min.dim", "aten.atan.default"):
        assert not backend.report.fallbacks.get(op), str(backend.report)
    assert backend.report.compiled_partitions == backend.report.partitions

    # A NaN is a row's maximum and minimum, at its first index, as eager.
    torch._dynamo.reset()
    h = lambda x: (*x.max(1), *x.min(0), *(x > 0).max(1))  # noqa: E731
    x = torch.randn(4, 6, generator=g)
    x[1, 3] = float("nan")
    backend = kiln.backend(server=daemon.address, fallback="eager")
    for a, b in zip(torch.compile(h, backend=backend)(x), h(x)):
        torch.testing.assert_close(a, b, equal_nan=True)
    # Bool rows keep aten.max.dim (argmax takes no bool): it runs eagerly.
    assert backend.report.fallbacks.get("aten.max.dim"), str(backend.report)


def _compile_against_eager(daemon, f, args, atol=1e-5):
    """f(*args) compiled with a Kiln backend (eager fallback) and eagerly,
    on copies of args that require grad: the outputs and then every
    argument's gradient of the (scalar) output compared. Returns the
    backend (its report)."""
    torch._dynamo.reset()
    mine = [a.clone().requires_grad_() for a in args]
    ref = [a.clone().requires_grad_() for a in args]
    backend = kiln.backend(server=daemon.address, fallback="eager")
    out = torch.compile(f, backend=backend)(*mine)
    want = f(*ref)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=atol)
    out.backward()
    want.backward()
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    return backend


def test_max_pool3d_and_adaptive_max_pool_decompose(daemon):
    """nn.MaxPool3d (padding, stride, dilation, ceil_mode; batched and
    unbatched) and adaptive max pooling (global, equal bins, and unequal
    ones whose forward stays eager) train in Kiln through
    kiln/decompositions.py on every torch (PyTorch's forward
    decompositions where it has them, Kiln's copy of them where not: 2.11
    and older): the backwards are scatter_adds of the gradient at the
    recorded indices. Forward and gradients against eager, overlapping
    windows and ties included."""

    def f(x, v, w):
        a = F.max_pool3d(x, 3, stride=2, padding=1, ceil_mode=True)
        b = F.max_pool3d(v, 2)  # unbatched (C, D, H, W)
        c = F.adaptive_max_pool2d(w, (4, 4))  # 8x8: equal bins
        d = F.adaptive_max_pool2d(w[:, :, :7], (3, 5))  # unequal bins
        e = F.max_pool3d(x, (2, 3, 2), stride=(1, 2, 3), dilation=(2, 1, 2))
        g = F.adaptive_max_pool3d(x, 1)  # global
        return (a.square().sum() + b.sum() + (c * c).sum() + d.sum()
                + (e * e).sum() + (g * 3).sum())

    g = torch.Generator().manual_seed(3)
    args = [torch.randn(2, 3, 7, 8, 9, generator=g),
            torch.randn(3, 6, 6, 6, generator=g),
            torch.randn(2, 4, 8, 8, generator=g)]
    args[0][0, 0, :3, :3, :3] = 1.5  # ties inside overlapping windows
    backend = _compile_against_eager(daemon, f, args)
    fallbacks = backend.report.fallbacks
    for op in ("aten.max_pool3d_with_indices.default",
               "aten.adaptive_max_pool3d.default",
               "aten.max_pool3d_with_indices_backward.default",
               "aten.adaptive_max_pool2d_backward.default",
               "aten.adaptive_max_pool3d_backward.default"):
        assert op not in fallbacks, str(backend.report)
    # The unequal bins' forward is the one node left to eager.
    assert fallbacks.get("aten.adaptive_max_pool2d.default", {}), \
        str(backend.report)


@pytest.mark.parametrize("case", [
    dict(kernel=3, stride=2, padding=1, dilation=1, ceil_mode=True),
    dict(kernel=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1), dilation=1,
         ceil_mode=False),
    dict(kernel=2, stride=(), padding=0, dilation=(1, 2, 1),
         ceil_mode=True),
    dict(kernel=(3, 2, 1), stride=1, padding=(1, 1, 0), dilation=1,
         ceil_mode=False),
])
def test_kilns_own_max_pool3d_decomposition_matches_aten(case):
    """Kiln's copy of PyTorch 2.15's max_pool3d_with_indices
    decomposition, for the torches without it, gives ATen's values and
    indices (the first maximum of a window, -inf padding never chosen) on
    random and tied inputs, batched and not."""
    from kiln.decompositions import _max_pool3d_with_indices  # noqa: PLC0415
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 5, 7, 6, generator=g)
    x[1, 2, :2, :4, :4] = 0.25  # ties
    args = (case["kernel"], case["stride"], case["padding"],
            case["dilation"], case["ceil_mode"])
    for t in (x, x[0]):
        want = torch.ops.aten.max_pool3d_with_indices(t, *args)
        got = _max_pool3d_with_indices(t, *args)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


def test_avg_pool3d_decomposes_where_windows_divide_alike(daemon):
    """avg_pool3d and its backward run in Kiln as depthwise (transposed)
    convolutions with ones where every window divides by one number:
    padding counted, none, or a divisor_override; batched and unbatched;
    strides that leave input positions past the last window. With
    count_include_pad=False over padding, or ceil_mode, it stays eager.
    Forward and gradients against eager either way."""

    def alike(x, v):
        return (F.avg_pool3d(x, 2).square().sum() +
                F.avg_pool3d(x, 3, stride=2, padding=1).sum() +
                F.avg_pool3d(x, (1, 3, 2), stride=(1, 2, 3),
                             divisor_override=5).square().sum() +
                F.avg_pool3d(v, 2).sum())

    def other(x, v):
        return (F.avg_pool3d(x, 3, stride=2, padding=1,
                             count_include_pad=False).square().sum() +
                F.avg_pool3d(x, 2, ceil_mode=True).sum())

    g = torch.Generator().manual_seed(4)
    args = [torch.randn(2, 3, 7, 8, 9, generator=g),
            torch.randn(3, 6, 5, 4, generator=g)]
    for f, decomposed in ((alike, True), (other, False)):
        backend = _compile_against_eager(daemon, f, args, atol=1e-4)
        fell = {op for op in backend.report.fallbacks if "avg_pool3d" in op}
        assert bool(fell) != decomposed, str(backend.report)


def test_channels_last_clones_run_in_kiln(daemon):
    """A copy to channels_last (SegFormer's `.contiguous(memory_format=
    torch.channels_last)` between layers) has its input's values: it runs
    in Kiln, and an output that is one keeps PyTorch's channels-last
    strides."""

    def f(x, w):
        y = (x * 2).contiguous(memory_format=torch.channels_last)
        z = F.conv2d(y, w).relu()
        return z.sum(1), (z + 1).contiguous(memory_format=torch.channels_last)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 5, generator=g)
    w = torch.randn(4, 3, 3, 3, generator=g)
    backend = kiln.backend(server=daemon.address, fallback="error")
    out = torch.compile(f, backend=backend)(x, w)
    ref = f(x, w)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert a.stride() == b.stride(), (a.stride(), b.stride())
    report = backend.report
    assert report.op("aten.clone.default").kiln >= 1, str(report)
    assert not report.op("aten.clone.default").fallback, str(report)


def test_cpu_literals_stay_out_of_a_cuda_graphs_partitions():
    """A tensor literal made on the CPU in a CUDA model (T5's, BART's and
    DeBERTa's `torch.tensor(...)`, lifted by lift_fresh_copy) stays out of
    the partitions: inside one it would make it a partition of two devices,
    which Kiln refuses whole (on an H100 that sent 107 of DeBERTa's 372
    nodes back to eager). The CUDA op using it as PyTorch does, a 0-dim CPU
    tensor as a scalar, goes in: the partition takes the literal as an
    input it moves to the device per call (KilnGraph.moved_inputs). Fake
    CUDA tensors: no GPU needed."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kiln.partition import KilnOperatorSupport, graph_device, partition

    g = torch.fx.Graph()
    x = g.placeholder("x")
    c = g.call_function(torch.ops.aten.scalar_tensor.default, (2.0,),
                        {"dtype": torch.float32, "device": torch.device("cpu")})
    lit = g.call_function(torch.ops.aten.lift_fresh_copy.default, (c,))
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    z = g.call_function(torch.ops.aten.div.Tensor, (y, lit))
    w = g.call_function(torch.ops.aten.exp.default, (z,))
    g.output((w,))
    with FakeTensorMode():
        for node, device in ((x, "cuda"), (c, "cpu"), (lit, "cpu"),
                             (y, "cuda"), (z, "cuda"), (w, "cuda")):
            node.meta["val"] = torch.empty(() if device == "cpu" else (4, 4),
                                           device=device)
    gm = torch.fx.GraphModule({}, g)
    assert graph_device(gm) == torch.device("cuda", 0)
    support = KilnOperatorSupport(frozenset(kiln.supported_ops()), {},
                                  graph_device(gm))
    result = partition(gm, support)
    assert list(result.partitions.values()) == [
        ["aten.mul.Tensor", "aten.div.Tensor", "aten.exp.default"]]
    reasons = {n.name: why for n, why in support.reasons.items()}
    assert "a graph on cuda:0" in reasons["lift_fresh_copy_default"]
    assert "div_tensor" not in reasons
    from kiln.fx_graph import to_kiln_graph
    graph = to_kiln_graph(getattr(result.module, "kiln_0"))
    assert graph.device == torch.device("cuda", 0)
    assert [graph.graph["inputs"][k]["meta"]["device"]
            for k in graph.moved_inputs] == ["CUDA"]
    assert graph.input_meta[graph.moved_inputs[0]].device.type == "cpu"


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True,
                              foreach=True),
], ids=["adamw", "adam", "sgd-nesterov"])
def test_compiled_optimizer_step_runs_in_kiln(daemon, make_opt):
    """torch.compile(optimizer.step): the foreach ops (kiln/foreach.py)
    become per-tensor ops, so the whole update is one Kiln partition; three
    steps match eager's parameters and optimizer state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(),
                                torch.nn.Linear(48, 8))
    mine = copy.deepcopy(model)
    opt_e, opt_k = make_opt(model.parameters()), make_opt(mine.parameters())
    backend = kiln.backend(server=daemon.address, fallback="error",
                           foreach=True)

    @torch.compile(backend=backend)
    def step():
        opt_k.step()

    for i in range(3):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(i))
        for m in (model, mine):
            m.zero_grad()
            m(x).square().mean().backward()
        opt_e.step()
        step()
        for p_e, p_k in zip(model.parameters(), mine.parameters()):
            torch.testing.assert_close(p_k, p_e, atol=1e-6, rtol=1e-5)
    for p_e, p_k in zip(model.parameters(), mine.parameters()):
        for key, v_e in opt_e.state[p_e].items():
            torch.testing.assert_close(opt_k.state[p_k][key], v_e,
                                       atol=1e-6, rtol=1e-5)
    report = backend.report
    print(f"\ncompiled optimizer step: {report}")
    assert report.compiled_partitions == report.partitions >= 1, str(report)
    # What stays eager: views and copies at a partition's edge (SGD's first
    # step clones the momentum buffers).
    for name, reasons in report.fallbacks.items():
        assert all("edge" in r for r in reasons), str(report)


def test_foreach_ops_as_per_tensor_ops(daemon):
    """Each decomposed foreach overload matches PyTorch's on lists of
    tensors of different shapes: Scalar, List, ScalarList and Tensor
    variants, keyword-only per-tensor arguments (addcdiv's value, add's
    alpha), a Scalar base (pow.ScalarAndTensor). By default they are
    decomposed too on the CPU (foreach=None); with foreach=False they stay
    whole and run eagerly."""
    backend = kiln.backend(server=daemon.address, fallback="error",
                           foreach=True)
    g = torch.Generator().manual_seed(0)
    xs = [torch.rand(s, generator=g) + 0.5 for s in ((3,), (4, 5), (2, 3, 4))]
    ys = [torch.rand(x.shape, generator=g) + 0.5 for x in xs]
    t = torch.tensor(1.5)

    def f(xs, ys, t):
        a = torch._foreach_add(xs, ys, alpha=0.5)
        b = torch._foreach_mul(a, [2.0, 3.0, 4.0])
        c = torch._foreach_addcdiv(b, xs, ys, value=0.25)
        d = torch._foreach_lerp(c, ys, 0.3)
        e = torch._foreach_pow(2.0, torch._foreach_sqrt(d))
        h = torch._foreach_div(torch._foreach_sub(e, 1.0), t)
        return torch._foreach_maximum(torch._foreach_neg(h), xs)

    out = torch.compile(f, backend=backend)(xs, ys, t)
    for o, r in zip(out, f(xs, ys, t)):
        torch.testing.assert_close(o, r, atol=1e-6, rtol=1e-6)
    report = backend.report
    assert report.compiled_partitions == report.partitions == 1, str(report)
    assert report.fallback_nodes == 0, str(report)

    torch._dynamo.reset()
    default = kiln.backend(server=daemon.address, fallback="error")
    out = torch.compile(f, backend=default)(xs, ys, t)
    for o, r in zip(out, f(xs, ys, t)):
        torch.testing.assert_close(o, r, atol=1e-6, rtol=1e-6)
    assert default.report.fallback_nodes == 0, str(default.report)

    torch._dynamo.reset()
    off = kiln.backend(server=daemon.address, fallback="error",
                       foreach=False)
    out = torch.compile(f, backend=off)(xs, ys, t)
    for o, r in zip(out, f(xs, ys, t)):
        torch.testing.assert_close(o, r, atol=1e-6, rtol=1e-6)
    assert any(name.startswith("aten._foreach") for name in
               off.report.fallbacks), str(off.report)


def test_histc_runs_in_kiln_as_aten_counts(daemon):
    """torch.histc (MoE routers' load-balancing statistics: integer expert
    ids in [0, E]; a given range with values outside it and NaN; the data's
    own range, and one value widened by 1) runs in Kiln through
    kiln/decompositions.py's _histc and counts exactly as eager."""

    def f(ids, x, same):
        return (torch.histc(ids, bins=8, min=0, max=8),
                torch.histc(x, bins=13, min=-1.0, max=1.5),
                torch.histc(x[3:], bins=7),
                torch.histc(same, bins=5))

    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 8, (4, 6), generator=g).float()
    x = torch.randn(300, generator=g)
    x[:3] = torch.tensor([float("nan"), 1.5, -1.0])
    same = torch.full((9,), 2.0)
    torch._dynamo.reset()
    backend = kiln.backend(server=daemon.address, fallback="error")
    got = torch.compile(f, backend=backend)(ids, x, same)
    for a, b in zip(got, f(ids, x, same)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert "aten.histc.default" not in backend.report.fallbacks, \
        str(backend.report)
    assert backend.report.op("aten.index_put.default").kiln >= 4, \
        str(backend.report)


def test_partition_of_a_graph_kiln_takes_whole():
    """Where Kiln supports every node, partition() takes the whole graph as
    one partition without CapabilityBasedPartitioner's search (its cost
    grows with every node's downstream set: DenseNet); that is exactly the
    partition the partitioner proposes. With a node Kiln lacks the
    partitioner runs as before."""
    import operator

    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    from kiln.partition import KilnOperatorSupport, graph_device, partition

    def dense(x, w):  # DenseNet-like: every block reads all before it
        feats = [x]
        for _ in range(4):
            h = torch.relu(torch.cat(feats, dim=1) @ w[:sum(
                f.shape[1] for f in feats)]) * 0.5
            feats.append(h[:, :4])
        return torch.cat(feats, dim=1).sum(), feats[-1].t()

    def lacking(x, w):
        return torch.kthvalue(dense(x, w)[1], 2, dim=0).values.exp()

    ops = frozenset(kiln.supported_ops())
    x, w = torch.randn(3, 4), torch.randn(20, 8)
    for fn, whole in ((dense, True), (lacking, False)):
        gm = make_fx(fn, tracing_mode="fake")(x, w)
        ref_gm = copy.deepcopy(gm)
        ref = CapabilityBasedPartitioner(
            ref_gm, KilnOperatorSupport(ops, {}, graph_device(ref_gm)),
            allows_single_node_partition=True).propose_partitions()
        calls = [n.name for n in gm.graph.nodes if n.op == "call_function"]
        support = KilnOperatorSupport(ops, {}, graph_device(gm))
        result = partition(gm, support)
        if whole:
            assert len(ref) == 1
            assert {n.name for n in next(iter(ref)).nodes} == set(calls)
            assert len(result.partitions) == 1 and not support.reasons
        else:
            assert support.reasons, "kthvalue is not Kiln's"
            assert len(result.partitions) == len(
                [p for p in ref if any(n.target is not operator.getitem
                                       for n in p.nodes)]) >= 1
        got = result.module(x, w)
        want = fn(x, w)
        for a, b in zip(got if isinstance(got, (list, tuple)) else [got],
                        want if isinstance(want, (list, tuple)) else [want]):
            torch.testing.assert_close(a, b)


def check_cpu_products(server: str, dtype: torch.dtype) -> None:
    """mm, addmm (alpha, beta, a broadcast bias), bmm and baddbmm compiled
    by Kiln (no fallback) against eager on the CPU: odd sizes, transposed
    operands read in place, k = 1, a batch of 1, a single row and an empty
    one. Tolerances: float32's, and for bfloat16 one rounding of the
    result (both accumulate in float32)."""
    g = torch.Generator().manual_seed(37)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    cases: list = [
        (lambda a, b: a @ b, (r(37, 29), r(29, 53))),
        (lambda a, b: a.t() @ b.t(), (r(29, 37), r(53, 29))),
        (lambda a, b: a @ b, (r(1, 64), r(64, 3))),
        (lambda a, b: a @ b, (r(45, 1), r(1, 20))),
        (lambda a, b: a @ b, (r(0, 16), r(16, 8))),
        (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
         (r(53), r(37, 29), r(29, 53))),
        (lambda a, b: torch.bmm(a, b.transpose(1, 2)),
         (r(3, 17, 9), r(3, 13, 9))),
        (lambda a, b: torch.bmm(a, b), (r(1, 8, 5), r(1, 5, 7))),
        (lambda c, a, b: torch.baddbmm(c, a, b, alpha=0.5),
         (r(2, 6, 11), r(2, 6, 4), r(2, 4, 11))),
    ]
    tol = ({} if dtype == torch.float32 else
           {"rtol": 1.6e-2, "atol": 1e-2})
    for i, (f, args) in enumerate(cases):
        torch._dynamo.reset()
        backend = kiln.backend(server=server, fallback="error")
        got = torch.compile(f, backend=backend)(*args)
        want = f(*(a.float() for a in args)).to(dtype)
        assert got.dtype == dtype and got.shape == want.shape, i
        torch.testing.assert_close(got.float(), want.float(), **tol,
                                   msg=lambda m: f"case {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_products_match_eager(daemon, dtype):
    """The CPU products through the runtime's default BLAS (in a PyTorch
    process, PyTorch's own MKL: runtime/cpu_blas.h)."""
    check_cpu_products(daemon.address, dtype)


@pytest.mark.parametrize("env", [
    {"KILN_ONEDNN_BF16": "1"},  # MKL's bfloat16 GEMM, without AMX too
    {"KILN_TORCH_MKL": "0"},  # oneDNN, as a process without PyTorch
    {"KILN_TORCH_MKL": "0", "KILN_ONEDNN_BF16": "1"},
], ids=["mkl-bf16", "onednn", "onednn-bf16"])
def test_cpu_products_on_each_library(daemon, env):
    """check_cpu_products in a process of its own (the library is chosen
    once per process) for each library the runtime may pick."""
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; import torch; "
            "from test_backend import check_cpu_products as c; "
            "c(sys.argv[3], torch.float32); c(sys.argv[3], torch.bfloat16)")
    subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(__file__),
         str(PYTHON_DIR), daemon.address], env=dict(os.environ, **env),
        check=True, timeout=300)
