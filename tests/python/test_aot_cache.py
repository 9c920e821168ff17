"""The AOTAutograd cache (kiln/aot_cache.py) against a real kilnd.

A graph compiled once is stored; a new backend after torch._dynamo.reset()
(what a new process sees) takes it from the cache instead of tracing, and
its training step gives bit for bit the results of the traced one (the same
graphs, the same kernels), which test_models.py checks against eager. The
model suite in float32 and under bfloat16 autocast, training and
inference; a second process really started; graphs the cache must not
hold (symbolic sizes, an output that aliases an input, a function of the
user's program); entries that are corrupt or name an op this torch lacks
(a miss, then a correct compile that stores it again).
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import textwrap
from typing import Any, List, Tuple

import pytest
import torch

import kiln
from kiln import aot_cache
from models import MODELS, make_optimizer, train_step


@pytest.fixture()
def aot_dir(tmp_path, monkeypatch):
    d = tmp_path / "aot"
    monkeypatch.setenv("KILN_AOT_CACHE_DIR", str(d))
    monkeypatch.delenv("KILN_AOT_CACHE", raising=False)
    return d


def _entries(d) -> List[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def _step(daemon, spec, amp, seed_model: int = 0
          ) -> Tuple[Any, List[torch.Tensor], Any]:
    """One compiled training step of a fresh copy of the model (Dynamo's
    caches reset): outputs, grads and parameters after AdamW, and the
    backend."""
    torch._dynamo.reset()
    torch.manual_seed(seed_model)
    model = spec.make(torch.float32)
    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(model, backend=backend)
    opt = make_optimizer(model, spec)
    args, target = spec.example(dtype=torch.float32, seed=1)
    torch.manual_seed(7)  # dropout draws the same in both runs
    out, loss = train_step(compiled, opt, spec, args, target,
                           torch.bfloat16 if amp else None)
    grads = [p.grad.detach().clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()] + \
        [b.detach().clone() for b in model.buffers()]
    return (out, loss, params), grads, backend


def _flat(x: Any) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in _flat(e)]
    return []


CASES = [pytest.param((name, amp), id=f"{name}-{'amp' if amp else 'float32'}")
         for name, spec in MODELS.items()
         for amp in ((False, True) if spec.bf16 else (False,))]


@pytest.mark.parametrize("case", CASES)
def test_hit_gives_the_traced_step(daemon, aot_dir, case):
    name, amp = case
    spec = MODELS[name]
    first, grads1, b1 = _step(daemon, spec, amp)
    c1 = b1.aot_cache_counters()
    assert c1["misses"] >= 1 and c1["hits"] == 0, c1
    assert c1["stored"] == c1["misses"], (c1, _entries(aot_dir))
    assert len(_entries(aot_dir)) == c1["stored"]

    second, grads2, b2 = _step(daemon, spec, amp)
    c2 = b2.aot_cache_counters()
    print(f"\n{name} amp={amp}: first {c1}, second {c2}")
    assert c2["hits"] == c1["stored"] and c2["misses"] == 0, c2
    # The same graphs compiled the same way: bit for bit.
    for a, b in zip(_flat(first) + grads1, _flat(second) + grads2):
        assert torch.equal(a, b), (a - b).abs().max()
    assert len(grads1) == len(grads2) and grads1
    # And the hit's report counts the same partitions.
    assert b2.report.compiled_partitions == b1.report.compiled_partitions
    assert b2.report.kiln_nodes == b1.report.kiln_nodes


def test_inference_graph_hits(daemon, aot_dir):
    spec = MODELS["convnet"]  # BatchNorm in eval mode, no grad
    results = []
    for _ in range(2):
        torch._dynamo.reset()
        model = spec.make(torch.float32).eval()
        backend = kiln.backend(server=daemon.address, fallback="error")
        compiled = torch.compile(model, backend=backend)
        args, _ = spec.example(dtype=torch.float32, seed=3)
        with torch.no_grad():
            results.append((compiled(*args), backend.aot_cache_counters()))
        expected = model(*args)
        torch.testing.assert_close(results[-1][0], expected, atol=1e-5,
                                   rtol=1e-5)
    assert results[0][1]["stored"] == 1 and results[1][1]["hits"] == 1, \
        results[1][1]
    assert torch.equal(results[0][0], results[1][0])


def test_batchnorm_running_stats_written_on_a_hit(daemon, aot_dir):
    """Training-mode BatchNorm writes its running statistics inside the
    graph (MUTATED_IN_GRAPH): a hit must write them too, and bump their
    version counters as AOTAutograd's runtime does."""
    mods = []
    for _ in range(2):
        torch._dynamo.reset()
        torch.manual_seed(0)
        bn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3),
                                 torch.nn.BatchNorm2d(8))
        backend = kiln.backend(server=daemon.address, fallback="error")
        x = torch.randn(4, 3, 10, 10, generator=torch.Generator().manual_seed(5))
        v0 = bn[1].running_mean._version
        torch.compile(bn, backend=backend)(x).sum().backward()
        assert bn[1].running_mean._version > v0
        mods.append((bn, backend.aot_cache_counters()))
    eager = copy.deepcopy(mods[0][0])
    eager[1].reset_running_stats()
    eager(x)
    assert mods[1][1]["hits"] == 1, mods[1][1]
    for bn, _ in mods:
        torch.testing.assert_close(bn[1].running_mean, eager[1].running_mean)
        torch.testing.assert_close(bn[1].running_var, eager[1].running_var)
        assert int(bn[1].num_batches_tracked) == 1


CHILD = textwrap.dedent("""
    import json, sys, torch, kiln
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0,
                                             batch_first=True)
    backend = kiln.backend(server=sys.argv[1], fallback="error")
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    y = torch.compile(layer, backend=backend)(x)
    y.sum().backward()
    grad = layer.linear1.weight.grad
    ref = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0,
                                           batch_first=True)
    ref.load_state_dict(layer.state_dict())
    ref(x).sum().backward()
    torch.testing.assert_close(grad, ref.linear1.weight.grad, atol=1e-4,
                               rtol=1e-4)
    print(json.dumps(backend.aot_cache_counters()))
""")


def test_a_second_process_skips_tracing(daemon, aot_dir):
    import json  # noqa: PLC0415

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    counts = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", CHILD, daemon.address],
                             env=env, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr
        counts.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert counts[0]["stored"] == 1 and counts[0]["hits"] == 0, counts
    assert counts[1]["hits"] == 1 and counts[1]["misses"] == 0, counts


def _compile_twice(daemon, fn, make_args, **compile_kwargs):
    results = []
    for _ in range(2):
        torch._dynamo.reset()
        backend = kiln.backend(server=daemon.address, fallback="error")
        args = make_args()
        out = torch.compile(fn, backend=backend, **compile_kwargs)(*args)
        results.append((out, args, backend.aot_cache_counters()))
    return results


def test_symbolic_sizes_are_not_cached(daemon, aot_dir):
    def f(x, w):
        return torch.relu(x @ w).sum(dim=1)

    def make():
        g = torch.Generator().manual_seed(2)
        return (torch.randn(5, 8, generator=g),
                torch.randn(8, 3, generator=g, requires_grad=True))

    for out, (x, w), counts in _compile_twice(daemon, f, make, dynamic=True):
        torch.testing.assert_close(out, f(x, w))
        assert counts["uncacheable"] >= 1 and counts["hits"] == 0, counts
    assert _entries(aot_dir) == []


def test_output_aliasing_an_input_is_not_cached(daemon, aot_dir):
    def f(x, w):
        return (x * w).sum(), x.view(-1)

    def make():
        g = torch.Generator().manual_seed(3)
        return (torch.randn(4, 4, generator=g, requires_grad=True),
                torch.randn(4, 4, generator=g, requires_grad=True))

    for (s, v), (x, w), counts in _compile_twice(daemon, f, make):
        torch.testing.assert_close(s, (x * w).sum())
        assert v._base is x or v.data_ptr() == x.data_ptr()
        assert counts["misses"] == 1 and counts["stored"] == 0, counts
    assert _entries(aot_dir) == []


def _users_scale(x):
    return x * 3.0


def test_user_functions_in_the_graph_are_not_cached(daemon, aot_dir):
    torch._dynamo.allow_in_graph(_users_scale)

    def f(x):
        return _users_scale(x).sum()

    for out, (x,), counts in _compile_twice(
            daemon, f, lambda: (torch.arange(6.0),)):
        assert float(out) == 45.0
        assert counts["uncacheable"] == 1, counts
    assert _entries(aot_dir) == []


def _mlp_twice(daemon, corrupt) -> List[Any]:
    def f(x, w):
        return torch.nn.functional.gelu(x @ w).sum()

    def make():
        g = torch.Generator().manual_seed(4)
        return (torch.randn(6, 5, generator=g),
                torch.randn(5, 7, generator=g, requires_grad=True))

    torch._dynamo.reset()
    backend = kiln.backend(server=daemon.address, fallback="error")
    x, w = make()
    torch.compile(f, backend=backend)(x, w).backward()
    assert backend.aot_cache_counters()["stored"] == 1
    corrupt()
    torch._dynamo.reset()
    backend = kiln.backend(server=daemon.address, fallback="error")
    x, w = make()
    torch.compile(f, backend=backend)(x, w).backward()
    x2, w2 = make()
    f(x2, w2).backward()
    torch.testing.assert_close(w.grad, w2.grad, atol=1e-5, rtol=1e-5)
    return backend.aot_cache_counters()


def test_corrupt_entry_is_a_miss(daemon, aot_dir):
    def corrupt():
        (path,) = aot_dir.iterdir()
        path.write_bytes(b"\x80\x04not a pickle")

    counts = _mlp_twice(daemon, corrupt)
    assert counts["misses"] == 1 and counts["stored"] == 1, counts


def test_entry_naming_a_missing_op_is_dropped(daemon, aot_dir):
    def corrupt():
        (path,) = aot_dir.iterdir()
        entry = aot_cache.Entry.loads(path.read_bytes())
        nodes = []
        for n in entry.fw["nodes"]:
            if n[1] == "call_function" and n[2][0] == "op":
                n = (n[0], n[1], ("op", "aten", "no_such_op", "default"),
                     *n[3:])
            nodes.append(n)
        entry.fw["nodes"] = nodes
        path.write_bytes(entry.dumps())

    counts = _mlp_twice(daemon, corrupt)
    assert counts["misses"] == 1 and counts["stored"] == 1, counts


def test_entries_name_no_class():
    """An entry is read with an unpickler that refuses every global."""
    with pytest.raises(pickle.UnpicklingError):
        aot_cache.Entry.loads(pickle.dumps({"format": aot_cache.FORMAT,
                                            "fw": os.getcwd, "bw": None,
                                            "meta": {}}))


def test_store_stays_under_its_bound(tmp_path):
    store = aot_cache.Store(str(tmp_path), max_bytes=3000)
    entry = aot_cache.Entry({"nodes": [], "consts": {}, "pad": "x" * 1000},
                            None, {})
    for i in range(6):
        assert store.put(f"k{i}", entry)
    sizes = [p.stat().st_size for p in tmp_path.iterdir()]
    assert sum(sizes) <= 3000 and len(sizes) >= 2
    assert store.get("k5") is not None and store.get("k0") is None


def _scaled_by(values):
    def f(x, w):
        return ((x @ w) * torch.tensor(values)).sum()
    return f


def test_tensor_constants_are_keyed_by_value(daemon, aot_dir):
    """A tensor literal is a constant of Dynamo's graph (get_attr), read
    under the fake mode the backend is called in: two graphs that differ in
    its values alone get two entries, each right."""
    g = torch.Generator().manual_seed(6)
    x, w0 = torch.randn(4, 3, generator=g), torch.randn(3, 3, generator=g)
    seen = []
    for values in ([1.0, 2.0, 3.0], [1.0, 2.0, 4.0], [1.0, 2.0, 3.0]):
        torch._dynamo.reset()
        f = _scaled_by(values)
        backend = kiln.backend(server=daemon.address, fallback="error")
        w = w0.clone().requires_grad_()
        torch.compile(f, backend=backend)(x, w).backward()
        w_ref = w0.clone().requires_grad_()
        f(x, w_ref).backward()
        torch.testing.assert_close(w.grad, w_ref.grad)
        seen.append(backend.aot_cache_counters())
        assert backend.report.kiln_nodes > 0
    assert [c["stored"] for c in seen] == [1, 1, 0], seen
    assert [c["hits"] for c in seen] == [0, 0, 1], seen
    assert len(_entries(aot_dir)) == 2


def test_torch_logs_of_aot_graphs_trace_anyway(daemon, aot_dir):
    """TORCH_LOGS=aot_graphs asks for AOTAutograd's graphs: the backend
    traces, neither hit nor store."""
    def f(x):
        return torch.sin(x).sum()

    torch._logging.set_logs(aot_graphs=True)
    try:
        for out, _, counts in _compile_twice(
                daemon, f, lambda: (torch.ones(3, requires_grad=True),)):
            assert counts["uncacheable"] == 1 and counts["hits"] == 0, counts
    finally:
        torch._logging.set_logs()
    assert _entries(aot_dir) == []


def test_double_backward_fails_on_a_hit(daemon, aot_dir):
    """A hit's backward is once differentiable: create_graph=True and a
    second derivative must raise, as through AOTAutograd, never give a
    silently wrong (missing) second derivative."""
    def f(x):
        return (torch.sin(x) * x).sum()

    for _ in range(2):
        torch._dynamo.reset()
        backend = kiln.backend(server=daemon.address, fallback="error")
        x = torch.linspace(0.0, 1.0, 5, requires_grad=True)
        (g,) = torch.autograd.grad(torch.compile(f, backend=backend)(x), x,
                                   create_graph=True)
        with pytest.raises(RuntimeError):
            g.sum().backward()
    assert backend.aot_cache_counters()["hits"] == 1


def test_a_miss_switches_to_kilns_runtime_once_captured(daemon, aot_dir):
    """On a miss, a training graph runs through AOTAutograd's runtime until
    its backward is compiled (the capture is complete), then through the
    entry's runtime as a hit would (KilnCachedFunction: less host time per
    step); the steps on either side of the switch match eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(),
                                torch.nn.Linear(20, 5))
    ref = copy.deepcopy(model)
    backend = kiln.backend(server=daemon.address, fallback="error")
    compiled = torch.compile(model, backend=backend)
    nodes = []
    for step in range(3):
        x = torch.randn(7, 12, generator=torch.Generator().manual_seed(step))
        out = compiled(x)
        nodes.append(out.grad_fn.name())
        out.square().sum().backward()
        ref(x).square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    assert nodes[0] == "CompiledFunctionBackward", nodes
    assert nodes[1:] == ["KilnCachedFunctionBackward"] * 2, nodes
    assert backend.aot_cache_counters()["stored"] == 1


def test_attention_dropout_hits_the_traced_step(daemon, aot_dir):
    """Kiln's fused attention with dropout (kiln::attention_dropout: the
    forward saves its int64 (seed, offset) pair for the backward) from the
    cache: a restarted backend's step, drawing the same seed, gives bit for
    bit the traced step's output and gradients."""
    import torch.nn.functional as F  # noqa: PLC0415
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 7, 8, generator=g) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)

    def step():
        torch._dynamo.reset()
        backend = kiln.backend(server=daemon.address, fallback="error",
                               attention="fused")
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        torch.manual_seed(5)
        out = torch.compile(fn, backend=backend)(*xs)
        out.backward(torch.ones_like(out))
        assert backend.report.op("kiln.attention_dropout.default").kiln == 1
        return [out.detach()] + [x.grad for x in xs], backend

    first, b1 = step()
    c1 = b1.aot_cache_counters()
    assert c1["stored"] >= 1 and c1["hits"] == 0, c1
    second, b2 = step()
    c2 = b2.aot_cache_counters()
    assert c2["hits"] == c1["stored"] and c2["misses"] == 0, c2
    assert not torch.allclose(first[0], F.scaled_dot_product_attention(
        q, k, v), atol=1e-3), "dropout dropped nothing"
    for a, b in zip(first, second):
        assert torch.equal(a, b), (a - b).abs().max()
