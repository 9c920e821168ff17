"""sort and topk in Kiln (issue 17 item 2): torch.topk and torch.sort,
forward and backward (AOTAutograd's backward scatters the gradient into
zeros: aten.scatter.src), through torch.compile(backend=kiln) against
eager PyTorch with a real kilnd, every node in Kiln; NaNs and ties
(stable order); and the sorts Kiln leaves to eager (a dim longer than
4096, or symbolic), with their reason."""

from __future__ import annotations

import pytest
import torch

import kiln

SORT_OPS = {"aten.topk.default", "aten.sort.default", "aten.sort.stable"}


def _run(fn, backend, x, dynamic=False):
    """fn eagerly and compiled on copies of x: (outputs, x.grad) each."""
    results = []
    for use in (False, True):
        xs = x.detach().clone().requires_grad_(True)
        f = torch.compile(fn, backend=backend, dynamic=dynamic) if use else fn
        out = f(xs)
        loss = out[0] if isinstance(out, tuple) else out
        grad = torch.randn(loss.shape,
                           generator=torch.Generator().manual_seed(7))
        loss.backward(grad.to(loss.dtype))
        results.append((out, xs.grad))
    return results


def _all_in_kiln(report, ops):
    """Each op of `ops` ran in Kiln, and nothing but views fell back."""
    for op in ops:
        assert report.op(op).kiln >= 1, (op, report)
    for op, reasons in report.fallbacks.items():
        assert all("view" in r for r in reasons), (op, reasons)


def _topk(x):
    return x.topk(3).values * 2


def _topk_dim0_smallest(x):
    v, i = torch.topk(x, 2, dim=0, largest=False)
    return v.sin(), i


def _sort_descending(x):
    v, i = x.sort(descending=True)
    return v * torch.arange(x.shape[-1], dtype=x.dtype), i


def _sort_stable_dim0(x):
    return torch.sort(x, stable=True, dim=-2).values.cumsum(0)


def _router(x):
    """An MoE router: top-2 of the softmaxed logits, renormalised, and
    the experts' one-hot dispatch from the indices."""
    probs = x.softmax(-1)
    w, i = probs.topk(2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    dispatch = torch.zeros_like(probs).scatter(-1, i, w)
    return dispatch, i


CASES = {"topk": (_topk, {"aten.topk.default", "aten.scatter.src"}),
         "topk_dim0_smallest": (_topk_dim0_smallest, {"aten.topk.default"}),
         "sort_descending": (_sort_descending, {"aten.sort.default"}),
         "sort_stable_dim0": (_sort_stable_dim0, {"aten.sort.stable"}),
         "router": (_router, {"aten.topk.default", "aten.scatter.src"})}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_backward_match_eager_in_kiln(daemon, case, dtype):
    fn, ops = CASES[case]
    # Distinct values: any correct sort gives eager's indices.
    g = torch.Generator().manual_seed(3)
    x = (torch.randperm(6 * 16, generator=g).reshape(6, 16).float() / 7
         ).to(dtype)
    backend = kiln.backend(server=daemon.address, fallback="error")
    (a, ga), (c, gc) = _run(fn, backend, x)
    a = a if isinstance(a, tuple) else (a,)
    c = c if isinstance(c, tuple) else (c,)
    for want, got in zip(a, c):
        if want.dtype == torch.int64:
            assert torch.equal(want, got)
        else:
            torch.testing.assert_close(got, want)
    torch.testing.assert_close(gc, ga)
    _all_in_kiln(backend.report, ops)
    # The backward's scatter ran in Kiln too (no scatter fell back).
    assert "aten.scatter.src" not in backend.report.fallbacks


def test_nans_ties_and_dtypes_match_eager(daemon):
    """NaN sorts last ascending and first descending; equal values keep
    their order (eager's stable sort on CPU, bit for bit), for float32,
    float16, bfloat16, int32 and int64."""
    g = torch.Generator().manual_seed(5)
    base = torch.randint(-3, 4, (5, 33), generator=g).float()
    base[base == 3] = float("nan")
    base[0, :4] = torch.tensor([0.0, -0.0, float("inf"), -float("inf")])

    def fn(x):
        a = torch.sort(x, stable=True, dim=-1)
        b = torch.sort(x, stable=True, dim=0, descending=True)
        return a.values, a.indices, b.values, b.indices

    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(fn, backend=backend)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64):
        x = base.nan_to_num(7.0).to(dtype) if not dtype.is_floating_point \
            else base.to(dtype)
        for want, got in zip(fn(x), compiled(x)):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0,
                                       atol=0)
    _all_in_kiln(backend.report, {"aten.sort.stable"})


def test_topk_k_zero_and_zero_dim(daemon):
    """k = 0 (an empty topk feeding a sum) and a 0-d input. (Empty
    outputs themselves are refused by the binding's stride check, sort or
    not: "the program writes contiguous outputs".)"""
    backend = kiln.backend(server=daemon.address, fallback="error")

    def fn(x, s):
        return x.topk(0).values.sum(-1) + 1, s.topk(1).values * 2

    x, s = torch.randn(4, 5), torch.tensor(2.5)
    for want, got in zip(fn(x, s), torch.compile(fn, backend=backend)(x, s)):
        assert want.shape == got.shape
        torch.testing.assert_close(got, want)
    assert backend.report.op("aten.topk.default").kiln == 2


def test_long_or_symbolic_sort_dims_run_eagerly_with_the_reason(daemon):
    """A sorted dim above 4096 (static) or symbolic runs eagerly, saying
    why; the rest of the graph compiles, and a symbolic batch with a
    static sorted dim compiles."""
    def fn(x):
        return x.sort(dim=-1).values * 2

    backend = kiln.backend(server=daemon.address, fallback="eager")
    x = torch.randn(2, 5000)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    reasons = backend.report.fallbacks["aten.sort.default"]
    assert any("of size 5000" in r and "4096" in r for r in reasons), reasons
    assert backend.report.op("aten.mul.Tensor").kiln == 1

    for dim, in_kiln in ((0, False), (1, True)):
        torch._dynamo.reset()
        backend = kiln.backend(server=daemon.address, fallback="eager")
        compiled = torch.compile(lambda x: x.topk(3, dim=dim).values * 2,
                                 backend=backend)
        for rows in (5, 9):  # rows symbolic, the 6 columns static
            x = torch.randn(rows, 6)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x),
                                       x.topk(3, dim=dim).values * 2)
        report = backend.report
        if in_kiln:
            assert report.dynamic_partitions >= 1, report
            assert report.op("aten.topk.default").kiln >= 1, report
            assert "aten.topk.default" not in report.fallbacks, report
        else:
            reasons = report.fallbacks["aten.topk.default"]
            assert any("symbolic dim 0" in r for r in reasons), reasons
