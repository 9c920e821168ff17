"""The model suite (tests/models/) through torch.compile(backend=kiln) on a
CUDA device: each model's forward and backward compiled with Kiln
(fallback="error": a partition that fails to compile or run fails the
case; ops Kiln lacks run eagerly and are reported) against the same model
in eager PyTorch on the same device. Cases: float32 static, float32
dynamic=True (two batch sizes) and bfloat16 static; and with
cudagraphs=True, five SGD steps of four of the models.

Compared with torch.testing.assert_close: the outputs and every
parameter's grad, for two batches. Tolerances: float32 atol 1e-4, rtol
1e-3 (cuBLASLt's and PyTorch's GEMM algorithms sum in different orders; no
TF32 on either side); bfloat16 atol = rtol = 3e-2 (a few bfloat16 ulps).

Run from a checkout with the bundle's library and kilnd (deploy/run-on-gpu.sh
backend does this):

    KILN_LIB=.../libkiln_c.so KILN_KILND=.../kilnd \\
        python3 tests/gpu/backend_gpu_test.py [--models mlp,nanogpt]

Prints per case the share of ATen nodes in Kiln, partitions, largest errors
and fallbacks; exits 1 when a case fails, 77 (skip) without a CUDA device.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys
import traceback
import warnings
from typing import Any, List, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests"), str(ROOT / "bench" / "python")]

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln.dynamo import KilnBackend  # noqa: E402
from models import MODELS  # noqa: E402

TOLERANCES = {torch.float32: (1e-4, 1e-3), torch.bfloat16: (3e-2, 3e-2)}


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _outputs(out: Any) -> List[torch.Tensor]:
    flat = out if isinstance(out, (list, tuple)) else [out]
    return [o for o in flat if isinstance(o, torch.Tensor)]


def run_case(name: str, dtype: torch.dtype, dynamic: bool, server: str,
             device: torch.device) -> Tuple[bool, str]:
    spec = MODELS[name]
    torch._dynamo.reset()
    eager = spec.make(dtype).to(device)
    model = copy.deepcopy(eager)
    backend = KilnBackend(server=server, fallback="error")
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    atol, rtol = TOLERANCES[dtype]
    worst = 0.0
    batches = [spec.batch, spec.batch + 1] if dynamic else [spec.batch] * 2
    for step, batch in enumerate(batches):
        args, target = spec.example(batch=batch, dtype=dtype, seed=step + 1)
        args, target = _to(args, device), _to(target, device)
        for m in (eager, model):
            m.zero_grad(set_to_none=True)
        want = eager(*args)
        got = compiled(*args)
        spec.loss(want, target).float().backward()
        spec.loss(got, target).float().backward()
        pairs = list(zip(_outputs(got), _outputs(want)))
        pairs += [(p.grad, q.grad) for p, q in
                  zip(model.parameters(), eager.parameters())
                  if q.grad is not None]
        for g, w in pairs:
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol)
            worst = max(worst, (g.float() - w.float()).abs().max().item())
    r = backend.report
    total = r.kiln_nodes + r.fallback_nodes
    lines = [f"{r.kiln_nodes}/{total} nodes in Kiln, "
             f"{r.compiled_partitions}/{r.partitions} partitions, "
             f"max |err| {worst:.2e}"]
    for op, reasons in r.fallbacks.items():
        for why, n in reasons.items():
            lines.append(f"    fallback {op} x{n}: {why[:150]}")
    return r.compiled_partitions > 0, "\n".join(lines)


def empty_outputs_case(server: str, device: torch.device) -> Tuple[bool, str]:
    """Outputs with no element, forward and backward (as
    tests/python/test_backend.py's test_empty_outputs_forward_backward on
    the CPU)."""
    torch._dynamo.reset()
    backend = KilnBackend(server=server, fallback="error")

    def f(x, y):
        return (x[:, 0:0] * 2, torch.cat([x, y], 1).relu() + 1, y.sum(1),
                x.t() @ y, y.t().exp())

    x, y = torch.randn(4, 3, device=device), torch.randn(4, 0, device=device)
    kx, ky = (t.clone().requires_grad_() for t in (x, y))
    ex, ey = (t.clone().requires_grad_() for t in (x, y))
    got, want = torch.compile(f, backend=backend)(kx, ky), f(ex, ey)
    torch.testing.assert_close(got, want)
    assert [g.shape for g in got] == [w.shape for w in want]
    kgrads = torch.autograd.grad(sum(o.sum() for o in got), (kx, ky))
    egrads = torch.autograd.grad(sum(o.sum() for o in want), (ex, ey))
    torch.testing.assert_close(kgrads, egrads)
    r = backend.report
    return r.compiled_partitions == r.partitions == 2, (
        f"{r.compiled_partitions}/{r.partitions} partitions")


def blocked_cumsum_case(server: str, device: torch.device) -> Tuple[bool, str]:
    """cumsum along static rows longer than 64 (BlockedCumsum on CUDA: 1000,
    4000 and 65 end in a partial block; float32, bfloat16, int64), forward
    and backward, against eager on the same device."""
    torch._dynamo.reset()
    backend = KilnBackend(server=server, fallback="error")

    def f(x, y, m):
        return x.cumsum(1), y.cumsum(0), m.cumsum(-1)

    g = torch.Generator(device=device).manual_seed(7)
    x = torch.randn(3, 1000, 2, device=device, generator=g)
    y = torch.randn(4000, device=device, generator=g).bfloat16()
    m = torch.randint(-10**6, 10**6, (5, 65), device=device, generator=g)
    kx, ex = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = torch.compile(f, backend=backend)(kx, y, m), f(ex, y, m)
    kg, = torch.autograd.grad(got[0].sum(), kx)
    eg, = torch.autograd.grad(want[0].sum(), ex)
    # bfloat16 against float64: eager's own error is the yardstick.
    y64 = y.double().cumsum(0)
    errs = {"float32": (got[0] - want[0]).abs().max().item(),
            "bfloat16 vs float64": (got[1].double() - y64).abs().max().item(),
            "eager bfloat16 vs float64":
                (want[1].double() - y64).abs().max().item(),
            "int64": (got[2] - want[2]).abs().max().item(),
            "grad": (kg - eg).abs().max().item()}
    ok = (errs["float32"] < 1e-3 and errs["grad"] < 1e-2 and
          errs["int64"] == 0 and
          errs["bfloat16 vs float64"] <= 2 * errs["eager bfloat16 vs float64"] + 1)
    r = backend.report
    ok = ok and r.compiled_partitions == r.partitions >= 1
    return ok, (f"{r.kiln_nodes} nodes in Kiln, {r.compiled_partitions}/"
                f"{r.partitions} partitions, max |err| " +
                ", ".join(f"{k} {v:.3g}" for k, v in errs.items()))


def fused_attention_case(server: str, device: torch.device) -> Tuple[bool, str]:
    """Causal and full self-attention with projections around it, bfloat16
    and float16, at 2^22 score elements, under attention="fused" (Kiln's
    fused op: one cuDNN call per direction), forward and backward, against
    eager on the same device; and the calls in Kiln."""
    import torch.nn.functional as F  # noqa: PLC0415
    texts, ok = [], True
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (True, False):
            torch._dynamo.reset()
            backend = KilnBackend(server=server, fallback="error",
                                  attention="fused")
            b, t, h, e = 4, 512, 4, 64
            g = torch.Generator(device=device).manual_seed(5)
            x = torch.randn(b, t, h * e, device=device, generator=g).to(dtype)
            w = (torch.randn(4, h * e, h * e, device=device, generator=g)
                 / 16).to(dtype)

            def f(x, w):
                q, k, v = ((x @ w[i]).view(b, t, h, e).transpose(1, 2)
                           for i in range(3))
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return o.transpose(1, 2).reshape(b, t, h * e) @ w[3]

            kx, kw = (u.clone().requires_grad_() for u in (x, w))
            ex, ew = (u.clone().requires_grad_() for u in (x, w))
            got, want = torch.compile(f, backend=backend)(kx, kw), f(ex, ew)
            gy = torch.randn(got.shape, device=device, generator=g).to(dtype)
            kg = torch.autograd.grad(got, (kx, kw), gy)
            eg = torch.autograd.grad(want, (ex, ew), gy)
            errs = [(got - want).abs().max().item() /
                    want.abs().max().item()]
            errs += [(a - c).abs().max().item() / c.abs().max().item()
                     for a, c in zip(kg, eg)]
            r = backend.report
            calls = (r.op("kiln.attention.default").kiln,
                     r.op("kiln.attention_backward.default").kiln)
            this_ok = max(errs) < 3e-2 and calls == (1, 1) and \
                r.compiled_partitions == r.partitions == 2
            ok &= this_ok
            texts.append(f"{str(dtype)[6:]}{' causal' if causal else ''}: "
                         f"max err/max {max(errs):.2e}, kiln calls {calls}, "
                         f"{r.compiled_partitions}/{r.partitions} partitions"
                         f"{'' if this_ok else ' FAILED'}")
    return ok, "; ".join(texts)


def bias_grad_attention_case(server: str,
                             device: torch.device) -> Tuple[bool, str]:
    """A learned additive bias (timm's BEiT and Swin pass theirs to
    scaled_dot_product_attention) on CUDA, bfloat16, 2^22 scores: one
    cuDNN call per direction, the backward kiln::attention_backward_dbias
    whose cuDNN call gives the bias's gradient (dBias). Under
    attention="fused" with a [1, H, L, S] bias, under "auto" with [B, 1, L,
    S] and with [1, 1, 1, S] (summed over the queries by a Kiln kernel);
    every gradient and the bias's against eager on the same device."""
    import torch.nn.functional as F  # noqa: PLC0415
    b, t, h, e, dtype = 4, 512, 4, 64, torch.bfloat16
    ok, texts = True, []
    for policy, shape in (("fused", (1, h, t, t)), ("auto", (b, 1, t, t)),
                          ("auto", (1, 1, 1, t))):
        torch._dynamo.reset()
        backend = KilnBackend(server=server, fallback="error",
                              attention=policy)
        g = torch.Generator(device=device).manual_seed(6)
        q, k, v = (torch.randn(b, h, t, e, device=device,
                               generator=g).to(dtype) for _ in range(3))
        bias = torch.randn(*shape, device=device, generator=g).to(dtype)

        def f(q, k, v, bias):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

        kin = [u.clone().requires_grad_() for u in (q, k, v, bias)]
        ein = [u.clone().requires_grad_() for u in (q, k, v, bias)]
        got, want = torch.compile(f, backend=backend)(*kin), f(*ein)
        gy = torch.randn(got.shape, device=device, generator=g).to(dtype)
        kg = torch.autograd.grad(got, kin, gy)
        eg = torch.autograd.grad(want, ein, gy)
        errs = [(got - want).abs().max().item() / want.abs().max().item()]
        errs += [(a - c).abs().max().item() / c.abs().max().item()
                 for a, c in zip(kg, eg)]
        r = backend.report
        calls = (r.op("kiln.attention.default").kiln,
                 r.op("kiln.attention_backward_dbias.default").kiln)
        this_ok = max(errs) < 3e-2 and calls == (1, 1) and \
            r.compiled_partitions == r.partitions
        ok &= this_ok
        texts.append(
            f"{policy} bias {list(shape)}: errs/max "
            f"{', '.join(f'{x:.1e}' for x in errs)} (out, q, k, v, bias), "
            f"kiln calls {calls}, {r.compiled_partitions}/{r.partitions} "
            f"partitions{'' if this_ok else ' FAILED'}")
    return ok, "; ".join(texts)


def mha_attention_case(server: str, device: torch.device) -> Tuple[bool, str]:
    """nn.MultiheadAttention (batch_first, need_weights=False, as
    torchvision's ViT and nn.TransformerEncoderLayer call it) in bfloat16 at
    2^22 score elements, with and without a key-padding mask, under the
    default policy: Kiln's fused op (mha_fused, one cuDNN call per
    direction), forward and the gradients of the input and every
    parameter against eager on the same device."""
    import torch.nn as nn  # noqa: PLC0415
    texts, ok = [], True
    for padded in (False, True):
        torch._dynamo.reset()
        backend = KilnBackend(server=server, fallback="error")
        torch.manual_seed(3)
        mha = nn.MultiheadAttention(256, 4, batch_first=True).to(
            device=device, dtype=torch.bfloat16)
        b, t = 4, 512
        g = torch.Generator(device=device).manual_seed(5)
        x = torch.randn(b, t, 256, device=device, generator=g).to(
            torch.bfloat16)
        kpm = None
        if padded:
            kpm = torch.zeros(b, t, dtype=torch.bool, device=device)
            kpm[1, 400:] = True

        def f(x):
            return mha(x, x, x, key_padding_mask=kpm, need_weights=False)[0]

        results = []
        for fn in (torch.compile(f, backend=backend), f):
            mha.zero_grad()
            xx = x.clone().requires_grad_()
            out = fn(xx)
            gy = torch.randn(out.shape, device=device,
                             generator=torch.Generator(device=device)
                             .manual_seed(7)).to(out.dtype)
            out.backward(gy)
            results.append([out.detach(), xx.grad] +
                           [p.grad.clone() for p in mha.parameters()])
        errs = [(a - c).abs().max().item() / c.abs().max().item()
                for a, c in zip(*results)]
        r = backend.report
        calls = (r.op("kiln.attention.default").kiln,
                 r.op("kiln.attention_backward.default").kiln)
        this_ok = max(errs) < 3e-2 and calls == (1, 1)
        ok &= this_ok
        texts.append(f"{'padded' if padded else 'plain'}: max err/max "
                     f"{max(errs):.2e}, kiln calls {calls}, "
                     f"{r.compiled_partitions}/{r.partitions} partitions"
                     f"{'' if this_ok else ' FAILED'}")
    return ok, "; ".join(texts)


def dropout_attention_case(server: str,
                           device: torch.device) -> Tuple[bool, str]:
    """scaled_dot_product_attention with dropout_p=0.1 at 2^22 score
    elements under the default policy: Kiln's kiln::attention_dropout (one
    cuDNN call per direction, cuDNN's generator), bfloat16 and float16,
    causal or not. The same seed draws the same mask, so a call with v the
    identity exposes it; a second call's output and gradients must equal
    attention with that mask applied, computed eagerly in float32."""
    import torch.nn.functional as F  # noqa: PLC0415
    texts, ok = [], True
    b, h, t, p = 64, 16, 64, 0.1
    for dtype in (torch.bfloat16, torch.float16):
        for causal in (False, True):
            torch._dynamo.reset()
            backend = KilnBackend(server=server, fallback="error")
            g = torch.Generator(device=device).manual_seed(9)
            q, k, v = (torch.randn(b, h, t, t, device=device, generator=g)
                       .to(dtype) for _ in range(3))
            eye = torch.eye(t, device=device, dtype=dtype).expand(
                b, h, t, t).contiguous().requires_grad_()

            def f(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                                      is_causal=causal)

            compiled = torch.compile(f, backend=backend)
            leaves = [u.clone().requires_grad_() for u in (q, k, v)]
            torch.manual_seed(3)
            keep = (compiled(leaves[0], leaves[1], eye).detach() != 0).float()
            torch.manual_seed(3)
            got = compiled(*leaves)
            gy = torch.randn(got.shape, device=device, generator=g).to(dtype)
            kg = torch.autograd.grad(got, leaves, gy)
            ref = [u.float().clone().requires_grad_() for u in (q, k, v)]
            s = ref[0] @ ref[1].transpose(-2, -1) / t ** 0.5
            if causal:
                s = s.masked_fill(torch.ones(t, t, device=device).triu(1)
                                  .bool(), float("-inf"))
            want = (torch.softmax(s, -1) * keep / (1 - p)) @ ref[2]
            eg = torch.autograd.grad(want, ref, gy.float())
            errs = [(got.float() - want).abs().max().item() /
                    want.abs().max().item()]
            errs += [(a.float() - c).abs().max().item() / c.abs().max().item()
                     for a, c in zip(kg, eg)]
            live = torch.ones(t, t, device=device)
            live = live.tril() if causal else live
            kept = ((keep * live).sum() / (live.sum() * b * h)).item()
            r = backend.report
            calls = (r.op("kiln.attention_dropout.default").kiln,
                     r.op("kiln.attention_dropout_backward.default").kiln)
            this_ok = max(errs) < 3e-2 and calls == (1, 1) and \
                abs(kept - (1 - p)) < 0.01
            ok &= this_ok
            texts.append(f"{str(dtype)[6:]}{' causal' if causal else ''}: "
                         f"max err/max {max(errs):.2e}, kept {kept:.4f}, "
                         f"kiln calls {calls}{'' if this_ok else ' FAILED'}")
    return ok, "; ".join(texts)


def cudagraphs_case(name: str, server: str, device: torch.device,
                    dynamic: bool = False) -> Tuple[bool, str]:
    """kiln.backend(cudagraphs=True) (kiln/cudagraphs.py): five training
    steps (forward, loss, backward, SGD) of a suite model, every step's
    loss, gradients and buffers (running statistics written in place)
    against eager on the same device; the forward and
    backward captured as CUDA graphs (PyTorch's cudagraph trees record
    them: no skip counted) and replayed from the third step on. dynamic:
    compiled with dynamic=True, batches alternating between two sizes:
    symbolic graphs run without CUDA graphs (a skip), still equal."""
    from torch._dynamo.utils import counters  # noqa: PLC0415

    spec = MODELS[name]
    torch._dynamo.reset()
    counters.clear()
    eager = spec.make(torch.float32).to(device)
    model = copy.deepcopy(eager)
    backend = KilnBackend(server=server, fallback="error", cudagraphs=True)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    # Plain SGD: parameters then differ between the two runs only as much
    # as their gradients do (AdamW's normalized steps turn a gradient of
    # rounding noise into a full-size step either way, and running
    # statistics computed after it differ by 1e-2).
    opt_e, opt_k = (torch.optim.SGD(m.parameters(), lr=0.05)
                    for m in (eager, model))
    atol, rtol = TOLERANCES[torch.float32]
    worst = 0.0
    for step in range(5):
        batch = spec.batch + (step % 2 if dynamic else 0)
        args, target = spec.example(batch=batch, dtype=torch.float32,
                                    seed=1)
        args, target = _to(args, device), _to(target, device)
        losses = []
        for m, opt in ((eager, opt_e), (compiled, opt_k)):
            opt.zero_grad(set_to_none=True)
            loss = spec.loss(m(*args), target)
            loss.backward()
            losses.append(loss.detach().clone())
            opt.step()
        pairs = [(losses[1], losses[0])]
        pairs += [(p.grad, q.grad) for p, q in
                  zip(model.parameters(), eager.parameters())
                  if q.grad is not None]
        # Buffers written in place (batch norm's running statistics).
        for (bname, p), q in zip(model.named_buffers(), eager.buffers()):
            torch.testing.assert_close(
                p.float(), q.float(), atol=atol, rtol=rtol,
                msg=lambda m, n=bname, k=step: f"step {k}, buffer {n}: {m}")
        for g, w in pairs:
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol)
            worst = max(worst, (g - w).abs().max().item())
    skips = counters["inductor"].get("cudagraph_skips", 0)
    from torch._inductor import cudagraph_trees  # noqa: PLC0415
    manager = cudagraph_trees.get_manager(device.index or 0,
                                          create_if_none_exists=False)
    recorded = len(list(manager.roots.values())) if manager else 0
    r = backend.report
    # Symbolic sizes run without CUDA graphs (kiln/cudagraphs.py): counted
    # as a skip, nothing recorded, the steps still equal to eager's.
    graphs = (skips == 0 and recorded > 0) if not dynamic else \
        (skips > 0 and recorded == 0)
    return (graphs and r.compiled_partitions > 0,
            f"{r.kiln_nodes} nodes in Kiln, {r.compiled_partitions}/"
            f"{r.partitions} partitions, cudagraph skips {skips}, "
            f"recorded roots {recorded}, max |err| {worst:.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated (default: all)")
    ap.add_argument("--server", help="kilnd's address (default: a private one)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    from bench_util import Kilnd  # noqa: PLC0415

    warnings.simplefilter("ignore")
    device = torch.device("cuda", 0)
    names = ([n for n in args.models.split(",") if n in MODELS]
             if args.models else list(MODELS))
    daemon = None if args.server else Kilnd()
    server = args.server or daemon.address
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"extension: {kiln._binding.extension() is not None}")
    failures = 0

    def report(case: str, run: Any, fail: str) -> None:
        """Runs one case (run() -> (ok, text)) and prints its line."""
        nonlocal failures
        try:
            ok, text = run()
            status = "ok" if ok else fail
        except Exception:  # noqa: BLE001
            ok, status = False, "FAIL"
            text = traceback.format_exc()[-3000:]
        failures += not ok
        print(f"{case:<34} {status}: {text}", flush=True)

    try:
        for name in names:
            for dtype, dynamic in ((torch.float32, False), (torch.float32, True),
                                   (torch.bfloat16, False)):
                if dtype == torch.bfloat16 and not MODELS[name].bf16:
                    continue
                case = f"{name}-{str(dtype)[6:]}-{'dynamic' if dynamic else 'static'}"
                report(case, lambda: run_case(name, dtype, dynamic, server, device),
                       "FAIL (nothing ran in Kiln)")
        for name in names:
            if name in ("mlp", "nanogpt", "convnet", "attention"):
                report(f"{name}-cudagraphs",
                       lambda: cudagraphs_case(name, server, device), "FAIL")
            if name in ("mlp", "nanogpt"):
                report(f"{name}-cudagraphs-dynamic",
                       lambda: cudagraphs_case(name, server, device, True),
                       "FAIL")
        for name, extra in (("empty-outputs", empty_outputs_case),
                            ("blocked-cumsum", blocked_cumsum_case),
                            ("fused-attention", fused_attention_case),
                            ("mha-attention", mha_attention_case),
                            ("bias-grad-attention", bias_grad_attention_case),
                            ("dropout-attention", dropout_attention_case)):
            if not args.models or name in args.models.split(","):
                report(name, lambda: extra(server, device), "FAIL")
    finally:
        if daemon:
            daemon.stop()
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
