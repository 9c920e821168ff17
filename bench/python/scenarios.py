"""Training-script scenarios through the Kiln backend, each against eager
(bench/README.md, session 24): activation checkpointing, CPU bfloat16
autocast, fullgraph=True, options= on the named backend's entry point,
changing batch sizes, no_grad / inference_mode, a KV cache written with
index_copy_, a compiled Adam step after clip_grad_norm_, vmap,
torch.func.grad, channels_last convolutions, Python int arguments. Prints
one line per scenario (its error, node counts, fallbacks) or the
exception; exits 1 when one raised.

    PY=$(bash deploy/python-env.sh)
    KILN_LIB=build/client/libkiln_c.so KILN_KILND=build/server/kilnd \
      PYTHONPATH=python $PY bench/python/scenarios.py
"""

import copy
import sys
import traceback
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import bench_util  # noqa: F401 (sys.path, KILN_LIB)
from bench_util import Kilnd
import kiln

warnings.simplefilter("ignore")
d = Kilnd(); srv = d.address
FAILED = []
class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.l1 = nn.Linear(32, 64); s.l2 = nn.Linear(64, 32); s.n = nn.LayerNorm(32)
    def forward(s, x): return x + s.l2(F.gelu(s.l1(s.n(x))))
class Ckpt(nn.Module):
    def __init__(s):
        super().__init__(); s.b = nn.ModuleList([Block() for _ in range(3)])
    def forward(s, x):
        for b in s.b: x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
        return x
def run(name, fn):
    try:
        r = fn(); print(f"{name:30} {r}")
    except Exception as e:
        traceback.print_exc(); FAILED.append(name)
        print(f"{name:30} ERROR {type(e).__name__}: {str(e)[:200]}")
def train_cmp(model, x, amp=None, **kw):
    torch._dynamo.reset()
    be = kiln.backend(server=srv, fallback="eager")
    m1 = copy.deepcopy(model); m2 = copy.deepcopy(model)
    c = torch.compile(m2, backend=be, **kw)
    outs = []
    for m in (m1, c):
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            y = m(x)
        y.float().square().mean().backward()
        outs.append(y.detach())
    err = max((p1.grad - p2.grad).abs().max().item() for p1, p2 in zip(m1.parameters(), m2.parameters()))
    r = be.report
    return f"out err {(outs[0].float()-outs[1].float()).abs().max().item():.2e} grad err {err:.2e} kiln {r.kiln_nodes}/{r.kiln_nodes+r.fallback_nodes} parts {r.compiled_partitions} fallbacks {dict(r.fallbacks) if r.fallback_nodes else ''}"
torch.manual_seed(0)
x = torch.randn(4, 8, 32)
run("checkpoint", lambda: train_cmp(Ckpt(), x))
run("autocast bf16 cpu", lambda: train_cmp(Ckpt().b[0], x, amp=torch.bfloat16))
run("fullgraph", lambda: train_cmp(Block(), x, fullgraph=True))
run("options kwarg", lambda: str(torch.compile(Block(), backend=kiln._dynamo_backend, options={"server": srv, "fast_math": True})(x).shape))
def bs_change():
    torch._dynamo.reset(); be = kiln.backend(server=srv)
    m = Block(); c = torch.compile(m, backend=be)
    for b in (2, 3, 5, 7):
        xx = torch.randn(b, 8, 32); torch.testing.assert_close(c(xx), m(xx))
    return f"ok graphs {be.report.graphs}"
run("batch sizes 2,3,5,7", bs_change)
def inference():
    torch._dynamo.reset(); be = kiln.backend(server=srv)
    m = Ckpt().eval(); c = torch.compile(m, backend=be)
    with torch.no_grad(): torch.testing.assert_close(c(x), m(x))
    with torch.inference_mode(): torch.testing.assert_close(c(x), m(x))
    return "ok"
run("no_grad + inference_mode", inference)
def kvcache():
    torch._dynamo.reset(); be = kiln.backend(server=srv)
    class KV(nn.Module):
        def __init__(s):
            super().__init__(); s.register_buffer("k", torch.zeros(1, 16, 8)); s.q = nn.Linear(8, 8)
        def forward(s, x, pos):
            s.k.index_copy_(1, pos, s.q(x))
            return F.scaled_dot_product_attention(x, s.k, s.k)
    m = KV(); m2 = copy.deepcopy(m); c = torch.compile(m2, backend=be)
    with torch.no_grad():
        for t in range(4):
            xx = torch.randn(1, 1, 8); p = torch.tensor([t])
            torch.testing.assert_close(c(xx, p), m(xx, p))
    torch.testing.assert_close(m.k, m2.k)
    return f"ok {be.report.kiln_nodes}/{be.report.kiln_nodes+be.report.fallback_nodes} {dict(be.report.fallbacks)}"
run("kv cache index_copy_", kvcache)
def optim():
    torch._dynamo.reset(); be = kiln.backend(server=srv)
    m = Block(); m2 = copy.deepcopy(m)
    o1 = torch.optim.Adam(m.parameters(), lr=1e-2); o2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    @torch.compile(backend=be)
    def step(): o2.step()
    for _ in range(3):
        for mm, o, st in ((m, o1, o1.step), (m2, o2, step)):
            o.zero_grad(); mm(x).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(mm.parameters(), 0.5); st()
    return f"param err {max((a-b).abs().max().item() for a,b in zip(m.parameters(), m2.parameters())):.2e}"
run("compiled Adam step", optim)
def func_transform(f):
    """f(w, x) compiled against eager (a torch.func transform inside)."""
    torch._dynamo.reset(); be = kiln.backend(server=srv)
    w = torch.randn(8, 8); xx = torch.randn(5, 8)
    torch.testing.assert_close(torch.compile(f, backend=be)(w, xx), f(w, xx))
    return "ok"
run("vmap", lambda: func_transform(
    lambda w, x: torch.func.vmap(lambda r: (w @ r).relu().sum())(x)))
run("torch.func.grad", lambda: func_transform(
    lambda w, x: torch.func.grad(lambda w: (x @ w).tanh().sum())(w)))
def channels_last():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).to(memory_format=torch.channels_last)
    return train_cmp(m, torch.randn(2, 3, 10, 10).to(memory_format=torch.channels_last))
run("channels_last conv", channels_last)
def int_inputs():
    torch._dynamo.reset(); be = kiln.backend(server=srv)
    f = lambda x, n: (x * n).sum(-1) + x.shape[0]
    for n in (2, 3, 4): torch.testing.assert_close(torch.compile(f, backend=be)(x, n), f(x, n))
    return "ok"
run("python int args", int_inputs)
d.stop()
sys.exit(1 if FAILED else 0)
