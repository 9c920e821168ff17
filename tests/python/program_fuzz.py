"""Random PyTorch programs, trained one step through backend=kiln and
checked against eager and float64: the front end's fuzzer.

The C++ random-graph suites (tests/unit/random_graph_test.cc) check Kiln's
compiler on Kiln's own graphs. This checks what a user's code goes through
before that: Dynamo, AOTAutograd and its decompositions, Kiln's graph
passes and partitioning, views and strides at partition edges, the
backward. A program is a forward() written as Python source (so a failure
prints a reproducer) over 1-3 float inputs and parameters: a chain of ops
drawn from OPS (pointwise, reductions and norms, views, matrix products,
convolution, casts, gathers, concatenation), each operand a value made
earlier. The step is sum(output_i * w_i) backward.

Checked like bench/python/real_models.py: every output and gradient of
Kiln and of eager float32 against eager float64; a result is wrong when
Kiln's error is over 1e-4 of the result's scale and over 20x eager's, and
eager with every input and parameter nudged by a few ulps does not move as
far (then the program is SENSITIVE there: a ReLU or a max within rounding
of a tie, and it is not counted).

    PY=$(bash deploy/python-env.sh)
    KILN_LIB=build/client/libkiln_c.so KILN_KILND=build/server/kilnd \\
      $PY tests/python/program_fuzz.py --seeds 0 200 [--dynamic] [--amp bfloat16]

prints one line per program (OK, SENSITIVE, WRONG with the results, ERROR
with the exception) and the source of each program that is not OK.
tests/python/test_program_fuzz.py runs a bounded number in make test.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import random
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

# An op: (name, rank condition, source builder). The builder gets the
# program being built and its operands' names and returns the expression,
# or None when the operands do not suit it.


@dataclass
class Value:
    name: str
    shape: Tuple[int, ...]


@dataclass
class Program:
    """forward()'s source and the parameters it reads (self.p<i>)."""

    rng: random.Random
    batch_dims: int = 1  # leading dims sized by the batch (dynamic=True)
    lines: List[str] = field(default_factory=list)
    params: List[Tuple[int, ...]] = field(default_factory=list)
    values: List[Value] = field(default_factory=list)

    def param(self, *shape: int) -> str:
        self.params.append(tuple(shape))
        return f"self.p{len(self.params) - 1}"

    def pick(self, cond: Callable[[Value], bool] = lambda v: True
             ) -> Optional[Value]:
        ok = [v for v in self.values if cond(v)]
        if not ok:
            return None
        # Recent values more often: chains, not a fan of shallow ops.
        weights = [1 + i for i in range(len(ok))]
        return self.rng.choices(ok, weights)[0]

    def dim(self, v: Value, skip_batch: bool = True) -> int:
        lo = 1 if skip_batch and len(v.shape) > 1 else 0
        return self.rng.randrange(lo, len(v.shape))


def _unary(p: Program, v: Value) -> Optional[str]:
    a = v.name
    return p.rng.choice([
        f"torch.relu({a})", f"torch.sigmoid({a})", f"torch.tanh({a})",
        f"F.gelu({a})", f"F.gelu({a}, approximate='tanh')", f"F.silu({a})",
        f"-{a}", f"torch.sin({a})", f"torch.cos({a})", f"torch.erf({a})",
        f"torch.exp({a}.clamp(-4, 4))", f"torch.log({a}.abs() + 1)",
        f"torch.sqrt({a}.abs() + 0.5)", f"torch.rsqrt({a}.abs() + 0.5)",
        f"F.softplus({a})", f"F.leaky_relu({a}, 0.1)", f"F.elu({a})",
        f"F.hardtanh({a}, -1.0, 1.0)", f"{a}.abs()", f"{a} * {a}",
        f"1.0 / ({a}.abs() + 1)", f"{a}.clamp(-1.5, 0.5)", f"F.mish({a})",
        f"torch.atan({a})", f"F.hardswish({a})", f"{a} * 0.5 + 0.25",
        f"torch.where({a} > 0, {a}, {a} * 0.2)", f"F.relu6({a} * 3)",
        f"torch.floor({a} * 2) + {a}", f"{a}.pow(3)",
    ])


def _binary(p: Program, v: Value) -> Optional[str]:
    # A partner of the same shape, or one that broadcasts against it.
    w = p.pick(lambda u: u.shape == v.shape and u is not v)
    if w is None:
        w = p.pick(lambda u: len(u.shape) == len(v.shape) and all(
            a == b or a == 1 for a, b in zip(u.shape, v.shape)))
    if w is None or w is v and p.rng.random() < 0.5:
        return None
    a, b = v.name, w.name
    return p.rng.choice([
        f"{a} + {b}", f"{a} - {b}", f"{a} * {b}", f"{a} / ({b}.abs() + 1)",
        f"torch.maximum({a}, {b})", f"torch.minimum({a}, {b})",
        f"torch.where({b} > 0, {a}, {b})", f"torch.atan2({a}, {b}.abs() + 1)",
        f"torch.lerp({a}, {b}, 0.3)", f"{a} * torch.sigmoid({b})",
        f"torch.addcmul({a}, {b}, {b}, value=0.5)",
    ])


def _reduce(p: Program, v: Value) -> Optional[str]:
    if len(v.shape) < 2:
        return None
    a, d = v.name, p.dim(v)
    keep = p.rng.choice([True, False])
    return p.rng.choice([
        f"{a}.sum({d}, keepdim={keep})", f"{a}.mean({d}, keepdim={keep})",
        f"{a}.amax({d}, keepdim={keep})", f"{a}.var({d}, keepdim=True)",
        f"torch.softmax({a}, {d})", f"torch.log_softmax({a}, {d})",
        f"{a}.cumsum({d})", f"torch.logsumexp({a}, {d}, keepdim=True)",
        f"{a} - {a}.mean({d}, keepdim=True)", f"{a}.norm(dim={d}, keepdim=True)",
        f"{a}.max({d}).values", f"{a}.std({d}, keepdim=True)",
    ])


def _norm(p: Program, v: Value) -> Optional[str]:
    # Not over one element: x - mean is then rounding noise times rsqrt(eps)
    # (on both sides), and its gradients are that noise.
    if len(v.shape) < 2 or v.shape[-1] < 2:
        return None
    a, c = v.name, v.shape[-1]
    kind = p.rng.randrange(4)
    if kind == 0:
        return f"F.layer_norm({a}, ({c},), {p.param(c)}, {p.param(c)})"
    if kind == 1:  # Llama's RMSNorm
        return (f"{a} * torch.rsqrt({a}.pow(2).mean(-1, keepdim=True) + 1e-6)"
                f" * {p.param(c)}")
    if kind == 2 and len(v.shape) == 3:
        ch = v.shape[1]
        return (f"F.batch_norm({a}, None, None, {p.param(ch)}, {p.param(ch)},"
                " training=True)")
    if kind == 3 and len(v.shape) == 3 and v.shape[1] % 2 == 0:
        ch = v.shape[1]
        return f"F.group_norm({a}, 2, {p.param(ch)}, {p.param(ch)})"
    return None


def _view(p: Program, v: Value) -> Optional[str]:
    a, r = v.name, len(v.shape)
    choices = []
    if r >= 3:
        choices += [f"{a}.transpose(1, 2)", f"{a}.transpose(-1, -2).contiguous()",
                    f"{a}.flatten(1)", f"{a}[:, ::2]", f"{a}[:, 1:]",
                    f"{a}.permute(0, 2, 1)" if r == 3 else f"{a}.permute(0, 3, 1, 2)"]
        if v.shape[-1] % 2 == 0:
            choices.append(f"{a}.chunk(2, -1)[1]")
            choices.append(f"{a}.reshape({a}.shape[0], {a}.shape[1], 2, -1)"
                           ".transpose(1, 2).flatten(2)")
    if r == 2:
        choices += [f"{a}.unsqueeze(1)", f"{a}[:, 1:]", f"{a}.flip(-1)",
                    f"{a}.unsqueeze(1).expand(-1, 3, -1)"]
        if v.shape[-1] % 2 == 0:
            choices.append(f"{a}.view({a}.shape[0], 2, -1)")
    if r == 4:
        choices.append(f"{a}.flatten(2)")
    if r >= 2:
        choices += [f"{a}.roll(1, -1)", f"torch.cat([{a}, {a} * 2], -1)",
                    f"F.pad({a}, (1, 0))", f"{a}.narrow(-1, 1, {v.shape[-1] - 1})"
                    if v.shape[-1] > 1 else f"{a}.clone()"]
    return p.rng.choice(choices) if choices else None


def _matmul(p: Program, v: Value) -> Optional[str]:
    a, r = v.name, len(v.shape)
    if r < 2:
        return None
    kind = p.rng.randrange(3)
    k = v.shape[-1]
    if kind == 0:  # nn.Linear
        n = p.rng.choice([4, 8, 12, 16])
        bias = p.param(n) if p.rng.random() < 0.7 else "None"
        return f"F.linear({a}, {p.param(n, k)}, {bias})"
    w = p.pick(lambda u: len(u.shape) == r and u.shape[:-2] == v.shape[:-2]
               and u.shape[-1] == k)
    if kind == 1 and w is not None and r >= 3:
        # attention scores: a @ w^T, scaled
        return f"({a} @ {w.name}.transpose(-1, -2)) * {k ** -0.5:.4f}"
    if kind == 2 and r == 3:
        return f"torch.bmm({a}, {p.param(k, 6)}.expand({a}.shape[0], -1, -1))"
    return f"{a} @ {p.param(k, 8)}"


def _conv(p: Program, v: Value) -> Optional[str]:
    a = v.name
    if len(v.shape) == 3:
        cin, cout = v.shape[1], p.rng.choice([4, 6, 8])
        groups = 2 if cin % 2 == 0 and cout % 2 == 0 and p.rng.random() < 0.3 else 1
        k = p.rng.choice([1, 3])
        return (f"F.conv1d({a}, {p.param(cout, cin // groups, k)}, {p.param(cout)},"
                f" padding={k // 2}, groups={groups})")
    if len(v.shape) == 4:
        cin, cout = v.shape[1], p.rng.choice([4, 8])
        stride = p.rng.choice([1, 2])
        return (f"F.conv2d({a}, {p.param(cout, cin, 3, 3)}, None, stride={stride},"
                " padding=1)")
    return None


def _misc(p: Program, v: Value) -> Optional[str]:
    a, r = v.name, len(v.shape)
    choices = [f"{a}.to(torch.bfloat16).to({a}.dtype)",
               f"({a} > 0).to({a}.dtype) * {a}",
               f"{a}.sort(-1).values", f"{a}.gather(-1, {a}.argsort(-1))",
               f"{a}.index_select(-1, torch.tensor([0, {v.shape[-1] - 1}, 0],"
               f" device={a}.device))",
               f"F.dropout({a}, 0.0, training=True)", f"{a}.topk(1, -1).values",
               f"torch.clamp_min({a}, 0.1)", f"{a}.masked_fill({a} < -1, 0.0)"]
    if r == 3:
        choices.append(f"F.avg_pool1d({a}, 2, ceil_mode=True)")
        choices.append(f"F.max_pool1d({a}, 2, ceil_mode=True)")
    if r == 4:
        choices.append(f"F.max_pool2d({a}, 2)")
        choices.append(f"F.adaptive_avg_pool2d({a}, 1)")
    return p.rng.choice(choices)


def _mutate(p: Program, v: Value) -> Optional[str]:
    """In-place ops on a fresh copy (functionalized by AOTAutograd)."""
    a, r, n = v.name, len(v.shape), v.shape[-1]
    choices = [f"{a}.clone().mul_(2).add_(1)", f"{a}.clone().clamp_(-1, 1)",
               f"{a}.clone().masked_fill_({a} > 1, 1.0)",
               f"{a}.clone().index_fill_(-1, torch.tensor([0], device={a}.device),"
               " 0.5)",
               # The sorted values go where they came from: whatever order
               # a sort gives equal elements (PyTorch's is unspecified,
               # Kiln's stable), the sum is the same.
               f"{a}.clone().scatter_add_(-1, {a}.argsort(-1),"
               f" {a}.sort(-1).values * 0.5)",
               f"{a}.clone().index_add_(-1, torch.tensor([{n - 1}, 0],"
               f" device={a}.device),"
               f" {a}.narrow(-1, 0, 2) if {n} >= 2 else {a})",
               f"torch.zeros_like({a}).scatter_(-1, {a}.argmax(-1, keepdim=True),"
               f" 1.0) * {a}"]
    if r >= 2 and n >= 2:
        # In place through a view of the copy.
        choices.append(f"{a}.clone().narrow(-1, 0, 1).mul_(3).add_({a}[..., :1])")
    return p.rng.choice(choices)


def _attention(p: Program, v: Value) -> Optional[str]:
    a, r = v.name, len(v.shape)
    if r not in (3, 4) or v.shape[-2] < 2:
        return None
    k = p.pick(lambda u: u.shape == v.shape)
    causal = p.rng.choice([True, False])
    q = a
    if r == 3:  # (batch, tokens, features): one head
        return (f"F.scaled_dot_product_attention({q}, {k.name}, {k.name} * 0.5,"
                f" is_causal={causal})")
    return (f"F.scaled_dot_product_attention({q}, {k.name}, {a},"
            f" is_causal={causal})")


def _shape_ops(p: Program, v: Value) -> Optional[str]:
    a, r, n = v.name, len(v.shape), v.shape[-1]
    choices = [f"{a}.repeat(*([1] * {r - 1}), 2)", f"{a}[..., torch.tensor([{n - 1}, 0], device={a}.device)]"]
    if n >= 2:
        choices.append(f"{a}.unfold(-1, 2, 1).sum(-1)")
    if r >= 2 and v.shape[-2] == n:
        choices.append(f"{a}.tril()")
        choices.append(f"{a}.masked_fill(torch.ones({n}, {n}, dtype=torch.bool,"
                       f" device={a}.device)"
                       f".triu(1), -30.0).softmax(-1)")
    if r == 3:
        choices.append(f"F.interpolate({a}, scale_factor=2, mode='nearest')")
        choices.append(f"F.interpolate({a}, scale_factor=2, mode='linear',"
                       " align_corners=False)")
        choices.append(f"torch.einsum('bij,bkj->bik', {a}, {a})")
    if r == 4:
        choices.append(f"F.interpolate({a}, scale_factor=2, mode='bilinear',"
                       " align_corners=False)")
        choices.append(f"F.pixel_shuffle({a}, 2)" if v.shape[1] % 4 == 0
                       else f"{a}.mean((2, 3), keepdim=True) * {a}")
    return p.rng.choice(choices)


def _loss(p: Program, v: Value) -> Optional[str]:
    """Per-element losses (reduction='none'): a scalar would end a chain."""
    a, r = v.name, len(v.shape)
    if r != 2 or v.shape[-1] < 2:
        return None
    w = p.pick(lambda u: u.shape == v.shape)
    return p.rng.choice([
        f"F.cross_entropy({a}, {w.name}.argmax(-1), reduction='none').unsqueeze(-1) * {a}",
        f"F.mse_loss({a}, {w.name}.detach(), reduction='none')",
        f"F.smooth_l1_loss({a}, {w.name}, reduction='none')",
        f"F.binary_cross_entropy_with_logits({a}, torch.sigmoid({w.name}),"
        " reduction='none')",
        f"F.nll_loss(torch.log_softmax({a}, -1), {w.name}.argmin(-1),"
        " reduction='none').unsqueeze(-1) + {a}",
    ])


def _embed(p: Program, v: Value) -> Optional[str]:
    # An index made from a value: which of 5 buckets each element falls in.
    a = v.name
    dim = p.rng.choice([4, 8])
    return (f"F.embedding(({a}.detach().clamp(-2, 2) + 2).long(),"
            f" {p.param(5, dim)}).flatten(-2)")


OPS: Dict[str, Tuple[float, Callable[[Program, Value], Optional[str]]]] = {
    "unary": (5, _unary), "binary": (4, _binary), "reduce": (2, _reduce),
    "norm": (1.5, _norm), "view": (3, _view), "matmul": (2, _matmul),
    "conv": (1, _conv), "misc": (2, _misc), "embed": (0.3, _embed),
    "mutate": (1, _mutate), "attention": (0.7, _attention),
    "shape": (1.5, _shape_ops), "loss": (0.7, _loss),
}

HEADER = "import torch\nimport torch.nn.functional as F\n"


def _run_source(src: str) -> Callable[..., Any]:
    scope: Dict[str, Any] = {}
    exec(compile(HEADER + src, "<fuzz program>", "exec"), scope)  # noqa: S102
    return scope["forward"]


def _add_params(module: nn.Module, params: Sequence[Tuple[int, ...]],
                gen: torch.Generator) -> nn.Module:
    """Registers self.p<i> of each shape: weights ~ N(0, 1/fan_in), vectors
    (norm scales, biases) near 1."""
    for i, shape in enumerate(params):
        scale = 1.0 / max(1, shape[-1] if len(shape) > 1 else 1) ** 0.5
        value = torch.randn(*shape, generator=gen) * scale
        if len(shape) == 1:
            value = 1.0 + 0.1 * value
        module.register_parameter(f"p{i}", nn.Parameter(value))
    return module


class FuzzModule(nn.Module):
    def __init__(self, src: str, params: Sequence[Tuple[int, ...]],
                 gen: torch.Generator) -> None:
        super().__init__()
        _add_params(self, params, gen)
        self.src = src
        self._forward = _run_source(src)

    def forward(self, *xs: torch.Tensor) -> Any:
        return self._forward(self, *xs)


def make_program(seed: int, ops: int = 12) -> Tuple[str, List[Tuple[int, ...]],
                                                   List[Tuple[int, ...]]]:
    """(forward's source, parameter shapes, input shapes) of seed's
    program. Shapes are checked by running each op eagerly as it is
    drawn; ops that raise are drawn again."""
    rng = random.Random(seed)
    batch = rng.choice([2, 3])
    rank = rng.choice([2, 3, 3, 4])
    base = {2: (batch, rng.choice([8, 12])),
            3: (batch, rng.choice([4, 6]), rng.choice([8, 16])),
            4: (batch, 4, rng.choice([6, 8]), rng.choice([6, 8]))}[rank]
    n_inputs = rng.choice([1, 2, 2, 3])
    shapes = [base] + [rng.choice([base, base[:-1] + (1,)])
                       for _ in range(n_inputs - 1)]
    prog = Program(rng)
    prog.values = [Value(f"x{i}", s) for i, s in enumerate(shapes)]
    gen = torch.Generator().manual_seed(seed)
    env: Dict[str, Any] = {f"x{i}": torch.randn(*s, generator=gen)
                           for i, s in enumerate(shapes)}
    names, weights = zip(*[(k, w) for k, (w, _) in OPS.items()])
    made = 0
    for _ in range(ops * 8):
        if made == ops:
            break
        kind = rng.choices(names, weights)[0]
        v = prog.pick()
        n_params = len(prog.params)
        expr = OPS[kind][1](prog, v)
        if expr is None:
            del prog.params[n_params:]
            continue
        holder = _add_params(nn.Module(), prog.params,
                             torch.Generator().manual_seed(0))
        try:
            with torch.no_grad():
                out = eval(expr, {"torch": torch, "F": F, "self": holder},  # noqa: S307
                           env)
        except Exception:  # noqa: BLE001 - a shape that does not suit the op
            del prog.params[n_params:]
            continue
        if (not isinstance(out, torch.Tensor) or not out.is_floating_point()
                or out.numel() == 0 or out.dim() == 0 or out.numel() > 4096
                or not torch.isfinite(out).all()):
            del prog.params[n_params:]
            continue
        name = f"v{made}"
        env[name] = out
        prog.lines.append(f"    {name} = {expr}")
        prog.values.append(Value(name, tuple(out.shape)))
        made += 1
    # Every value nothing reads is an output (the latest 4): no dead code.
    made_values = [v.name for v in prog.values[len(shapes):]]
    body = "\n".join(prog.lines)
    unread = [n for n in made_values
              if not re.search(rf"\b{n}\b", body.split(f"{n} = ", 1)[1])]
    outs = unread[-4:] or made_values[-1:]
    src = ("def forward(self, " + ", ".join(f"x{i}" for i in range(len(shapes)))
           + "):\n" + "\n".join(prog.lines) + "\n    return "
           + ", ".join(outs) + ("," if len(outs) == 1 else "") + "\n")
    return src, prog.params, shapes


# -- one training step, three ways ------------------------------------------

def _step(module: nn.Module, call: Callable[..., Any], inputs: List[torch.Tensor],
          weights: List[torch.Tensor]) -> Dict[str, torch.Tensor]:
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    module.zero_grad(set_to_none=True)
    outs = call(*xs)
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights))
    loss.backward()
    res = {f"out{i}": o.detach() for i, o in enumerate(outs)}
    res.update({f"x{i}.grad": x.grad for i, x in enumerate(xs)
                if x.grad is not None})
    res.update({f"{n}.grad": p.grad for n, p in module.named_parameters()
                if p.grad is not None})
    return res


def _err(x: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    x = x.double()
    if x.shape != ref.shape:
        return float("inf")
    if (x.isnan() != ref.isnan()).any():
        return float("inf")
    scale = max(ref.nan_to_num().abs().max().item(), 1e-3)
    return ((x - ref).nan_to_num().abs().max() / scale).item()


@dataclass
class Result:
    status: str  # OK, SENSITIVE, WRONG, ERROR, SKIPPED, MISSED (--warm)
    detail: str = ""
    kiln_nodes: int = 0
    fallback_nodes: int = 0


def check_program(seed: int, backend: Callable[..., Any], dynamic: bool = False,
                  ops: int = 12, device: str = "cpu",
                  amp: Optional[torch.dtype] = None) -> Tuple[Result, str]:
    """Runs seed's program through `backend` (kiln.backend(...)) on
    `device`: one step, and with dynamic=True a second at another batch
    size; with `amp` (torch.bfloat16, torch.float16) Kiln's and eager's
    float32 steps run under torch.autocast (the float64 reference does
    not). Returns the result and the program's source."""
    src, params, shapes = make_program(seed, ops)
    gen = torch.Generator().manual_seed(seed + 1)
    eager = FuzzModule(src, params, gen).to(device)
    mine = copy.deepcopy(eager)
    wide = copy.deepcopy(eager).double()
    torch._dynamo.reset()
    report = getattr(backend, "report", None)
    before = (report.kiln_nodes, report.fallback_nodes) if report else (0, 0)
    compiled = torch.compile(mine, backend=backend, dynamic=dynamic or None)
    batches = [shapes[0][0]] + ([shapes[0][0] + 2] if dynamic else [])
    worst = ""
    ran = False
    for batch in batches:
        sized = [(batch,) + s[1:] for s in shapes]
        inputs = [torch.randn(*s, generator=gen).to(device) for s in sized]
        autocast = (torch.autocast(device, dtype=amp) if amp is not None
                    else contextlib.nullcontext())
        try:
            with torch.no_grad(), autocast:
                probe = eager(*inputs)
        except Exception:  # noqa: BLE001 - this batch size (or autocast's
            continue       # dtypes: lerp of float32 and bfloat16) does not suit it
        ran = True
        weights = [torch.randn(o.shape, generator=gen).to(device)
                   for o in probe]
        try:
            with autocast:
                got = _step(mine, compiled, inputs, weights)
        except Exception:  # noqa: BLE001
            return Result("ERROR", traceback.format_exc(limit=-3)), src
        with autocast:
            want = _step(eager, eager, inputs, weights)
        try:
            ref = _step(wide, wide, [x.double() for x in inputs],
                        [w.double() for w in weights])
        except Exception:  # noqa: BLE001 - not a program float64 can run
            return Result("SKIPPED", traceback.format_exc(limit=-1)), src
        flagged = []
        for key, r in ref.items():
            if key not in got or key not in want:
                return Result("WRONG", f"{key}: missing"), src
            e_kiln, e_eager = _err(got[key], r), _err(want[key], r)
            # A half-precision result (autocast) is wrong only beyond two
            # of its roundings, whatever eager's luck.
            tol = max(1e-4, 2 * torch.finfo(got[key].dtype).eps) \
                if got[key].is_floating_point() else 1e-4
            if e_kiln > tol and e_kiln > 20 * e_eager:
                flagged.append((key, e_kiln, e_eager))
        if not flagged:
            continue
        # Eager with every input and parameter nudged by a few ulps of the
        # dtype it computes in (under autocast a float32 ulp would vanish
        # in the first rounding to half precision).
        ulps = 2 ** -20 if amp is None else 2 * torch.finfo(amp).eps
        nudged = copy.deepcopy(eager)
        with torch.no_grad():
            for p in nudged.parameters():
                p.mul_(1 + ulps * torch.randn(p.shape, generator=gen)
                       .to(device))
        with autocast:
            moved = _step(nudged, nudged,
                          [x * (1 + ulps * torch.randn(x.shape, generator=gen)
                                .to(device)) for x in inputs], weights)
        wrong = [(k, ek, ee) for k, ek, ee in flagged
                 if ek > 2 * _err(moved[k], ref[k])]
        detail = ", ".join(f"{k} kiln {ek:.1e} eager {ee:.1e}"
                           for k, ek, ee in (wrong or flagged)[:4])
        if wrong:
            return Result("WRONG", f"batch {batch}: {detail}"), src
        worst = f"batch {batch}: {detail}"
    if not ran:
        return Result("SKIPPED", "eager raises at every size"), src
    kiln_nodes = report.kiln_nodes - before[0] if report else 0
    fallback_nodes = report.fallback_nodes - before[1] if report else 0
    if worst:
        return Result("SENSITIVE", worst, kiln_nodes, fallback_nodes), src
    return Result("OK", "", kiln_nodes, fallback_nodes), src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs=2, default=[0, 50],
                    metavar=("FIRST", "END"))
    ap.add_argument("--ops", type=int, default=12)
    ap.add_argument("--dynamic", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--amp", choices=["bfloat16", "float16"],
                    help="Kiln's and eager's steps under torch.autocast")
    ap.add_argument("--verbose", action="store_true", help="print every program")
    ap.add_argument("--server", help="kilnd's address (default: a private one)")
    ap.add_argument("--warm", action="store_true",
                    help="run each program twice, each time with a new "
                    "backend after torch._dynamo.reset(): the second takes "
                    "AOTAutograd's graphs from the AOT cache (kiln/"
                    "aot_cache.py) and must be as right as the first; a "
                    "program the first stored that the second does not hit "
                    "is MISSED")
    a = ap.parse_args()
    import conftest  # noqa: PLC0415 (kiln on sys.path; tests/python's Daemon)
    import kiln  # noqa: PLC0415

    daemon = None
    server = a.server
    if server is None:
        daemon = conftest.Daemon()
        server = daemon.address
    backend = kiln.backend(server=server, fallback="eager")
    bad = 0
    try:
        for seed in range(*a.seeds):
            amp = getattr(torch, a.amp) if a.amp else None
            if a.warm:
                first = kiln.backend(server=server, fallback="eager")
                check_program(seed, first, a.dynamic, a.ops, a.device, amp)
                backend = kiln.backend(server=server, fallback="eager")
            result, src = check_program(seed, backend, a.dynamic, a.ops,
                                        a.device, amp)
            if a.warm:
                stored = first.aot_cache_counters()["stored"]
                hits = backend.aot_cache_counters()["hits"]
                result.detail = (f"(AOT cache: {stored} stored, {hits} hit) "
                                 + result.detail)
                if hits < stored and result.status not in ("WRONG", "ERROR"):
                    result.status = "MISSED"
            nodes = result.kiln_nodes + result.fallback_nodes
            print(f"seed {seed}: {result.status} {result.kiln_nodes}/{nodes}"
                  f" nodes in Kiln {result.detail}".rstrip(), flush=True)
            if a.verbose:
                print(src, flush=True)
            if result.status in ("WRONG", "ERROR", "MISSED"):
                bad += 1
                print(src, flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
    print(f"{a.seeds[1] - a.seeds[0]} programs, {bad} WRONG, ERROR or MISSED")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
