"""The ``_foreach_*`` ops of a compiled optimizer step, as Kiln runs them.

``torch.compile(optimizer.step)`` (or a training step that includes it)
reaches a backend as ``_foreach_*`` ops: AdamW with ``foreach=True`` is
about twenty of them (``_foreach_lerp``, ``_foreach_addcdiv``, ...), each
over every parameter. Kiln has no list ops; it has each one's per-tensor
op. ``foreach_decompositions`` gives AOTAutograd a decomposition per
foreach overload: element i of the result is the per-tensor op on element
i of the list arguments (a Tensor[] or a Scalar[]; other arguments are
passed as they are), which is what PyTorch's foreach ops compute. Those
per-tensor ops (addcmul and addcdiv after Core ATen's decompositions) are
Kiln's, so the whole step is one partition and each parameter's update
fuses into one kernel.

A foreach overload is decomposed only when its per-tensor op is Kiln's
(directly or through a Core ATen decomposition); otherwise it stays whole
and runs as PyTorch's (multi-tensor) kernel, eagerly.

The per-tensor results are the parameters' and states' new values; the
backend asks kilnd to store them into the tensors' own memory
(kiln.v1.Graph.input_writes, fx_graph.input_write_candidates), so nothing
is copied back. On by default for CPU graphs (kiln.backend's `foreach`):
on the 2-core CPU AdamW's step takes 0.29x eager's time, Adam's 0.37x,
SGD's 0.91x (with the updates copied back: 0.78x, 2.2x and 4.9x); on an
H100 PyTorch's multi-tensor kernels win (bench/python/optimizer_step.py,
bench/README.md, session 25).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, List

import torch

__all__ = ["FOREACH_OPS", "foreach_decompositions"]

_aten = torch.ops.aten

# foreach overload name -> the per-tensor OpOverload's name.
FOREACH_OPS: Dict[str, str] = {
    **{f"aten._foreach_{op}.{ov}": f"aten.{op}.Tensor"
       for op in ("add", "sub", "mul", "div")
       for ov in ("Scalar", "List", "ScalarList", "Tensor")},
    **{f"aten._foreach_{op}.default": f"aten.{op}.default"
       for op in ("sqrt", "rsqrt", "neg", "reciprocal", "exp", "log", "abs",
                  "sign", "sigmoid", "tanh", "sin", "cos", "expm1", "log1p",
                  "floor", "ceil", "round", "trunc", "frac", "erf")},
    "aten._foreach_pow.ScalarAndTensor": "aten.pow.Scalar",
    "aten._foreach_pow.Scalar": "aten.pow.Tensor_Scalar",
    "aten._foreach_pow.List": "aten.pow.Tensor_Tensor",
    "aten._foreach_lerp.Scalar": "aten.lerp.Scalar",
    "aten._foreach_lerp.List": "aten.lerp.Tensor",
    "aten._foreach_addcmul.Scalar": "aten.addcmul.default",
    "aten._foreach_addcmul.ScalarList": "aten.addcmul.default",
    "aten._foreach_addcdiv.Scalar": "aten.addcdiv.default",
    "aten._foreach_addcdiv.ScalarList": "aten.addcdiv.default",
    "aten._foreach_maximum.List": "aten.maximum.default",
    "aten._foreach_minimum.List": "aten.minimum.default",
    # max(x, s) and min(x, s) with a number s (ASGD's step size).
    "aten._foreach_maximum.Scalar": "aten.clamp_min.default",
    "aten._foreach_maximum.ScalarList": "aten.clamp_min.default",
    "aten._foreach_minimum.Scalar": "aten.clamp_max.default",
    "aten._foreach_minimum.ScalarList": "aten.clamp_max.default",
    "aten._foreach_clamp_min.Scalar": "aten.clamp_min.default",
    "aten._foreach_clamp_max.Scalar": "aten.clamp_max.default",
    "aten._foreach_copy.default": "aten.copy.default",
}


def _overload(name: str) -> Any:
    """The OpOverload for "aten.op.overload", or None."""
    _, op, overload = name.split(".")
    packet = getattr(_aten, op, None)
    return getattr(packet, overload, None) if packet is not None else None


def _is_list(schema_arg: Any) -> bool:
    return isinstance(schema_arg.type, torch._C.ListType)


def _per_element(foreach: Any, elementwise: Any) -> Callable[..., List[Any]]:
    """A decomposition of `foreach`: `elementwise` on element i of each
    list argument (by the schema), the other arguments as they are. The
    foreach schema's arguments map to the per-tensor one's by position
    (their names differ: `scalar` is add's `other`), the ones past its
    positional arguments to its keyword-only ones in order (addcmul's
    `value`), keywords by name (add's `alpha`)."""
    schema = foreach._schema.arguments
    lists = {a.name for a in schema if _is_list(a)}
    names = [a.name for a in schema]
    target = elementwise._schema.arguments
    positional = sum(1 for a in target if not a.kwarg_only)
    keyword_only = [a.name for a in target if a.kwarg_only]
    known = {a.name for a in target}

    def decompose(*args: Any, **kwargs: Any) -> List[Any]:
        items = list(zip(names, args)) + list(kwargs.items())
        n = len(next(v for k, v in items if k in lists))
        out = []
        for i in range(n):
            values = [(k, v[i] if k in lists else v) for k, v in items]
            call_args = [v for _, v in values[:min(len(args), positional)]]
            extra = values[len(call_args):len(args)]
            call_kwargs = dict(zip(keyword_only, (v for _, v in extra)))
            call_kwargs.update((k, v) for k, v in values[len(args):]
                               if k in known)
            out.append(elementwise(*call_args, **call_kwargs))
        return out

    return decompose


def foreach_decompositions(kiln_ops: FrozenSet[str],
                           decomposed: FrozenSet[str]) -> Dict[Any, Callable[..., Any]]:
    """{foreach OpOverload: decomposition} for the foreach overloads this
    torch has whose per-tensor op Kiln runs: in `kiln_ops`, or in
    `decomposed` (ops the backend's Core ATen table decomposes into
    Kiln's, as addcmul into mul and add)."""
    table: Dict[Any, Callable[..., Any]] = {}
    for name, elementwise in FOREACH_OPS.items():
        if elementwise not in kiln_ops and elementwise not in decomposed:
            continue
        foreach, op = _overload(name), _overload(elementwise)
        if foreach is None or op is None:
            continue  # not in this torch
        table[foreach] = _per_element(foreach, op)
    return table
