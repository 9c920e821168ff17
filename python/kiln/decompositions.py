"""Decompositions the Kiln backend adds to Core ATen's.

AOTAutograd decomposes a training graph with the table the backend gives
it (``KilnBackend._decompositions``): Core ATen's table, minus the ops Kiln
lowers itself, plus the ones here. Each is an op real models reach that
Core ATen's table leaves whole and Kiln does not lower, so without it the
op would split its graph and run eagerly:

- ``aten.new_empty_strided`` (timm's GhostNet: 16 of them split its graph
  into 18 partitions): PyTorch's own decomposition, to ``empty_strided``.
- ``aten.linalg_vector_norm`` (``F.normalize``, ``torch.norm``, weight
  norm in older PyTorch: wav2vec2 on torch 2.11): PyTorch's decomposition
  (abs, powers and a sum, or amax/amin for the infinite orders).
- ``aten._weight_norm_interface_backward`` (``nn.utils.weight_norm``, as
  wav2vec2's positional convolution uses): PyTorch has no decomposition;
  the one here is its autograd formula (``_weight_norm_differentiable_backward``
  in FunctionsManual.cpp) in ATen ops.

- ``aten.elu`` and ``aten.elu_backward`` (``nn.ELU``, ``F.elu``):
  PyTorch's decompositions (``expm1``, ``where``).
- ``aten.max.dim`` and ``aten.min.dim`` (``x.max(dim)``: PointNet's
  global feature, a classifier's predicted class): the values are
  ``amax``/``amin`` and the indices ``argmax``/``argmin``, which pick the
  first extreme of a row (NaN counting as the extreme) as PyTorch's
  kernels do. Their backward (``value_selecting_reduction_backward``)
  decomposes by itself.
- ``aten.atan`` (``torch.atan``: CIoU box losses, angle features):
  ``atan2(x, 1)``, the same function.
- ``aten.max_pool3d_with_indices`` (``nn.MaxPool3d``: video and volume
  nets) and ``aten.adaptive_max_pool2d`` (where its bins are equal; else
  it stays whole): PyTorch's decompositions; the first's backward and the
  adaptive max pools' backwards (``aten.max_pool3d_with_indices_backward``,
  ``aten.adaptive_max_pool{2,3}d_backward``) are the gradient added at the
  flat spatial index each output element recorded: a scatter_add into
  zeros (``_max_pool_backward``), as ATen's kernels accumulate it.

Only ops whose name is not in ``kiln_ops`` are given (Kiln's own lowering
wins).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, Tuple

import torch

__all__ = ["extra_decompositions"]

aten = torch.ops.aten

# Ops whose decomposition PyTorch's full table has (not Core ATen's).
_FROM_TORCH = ("aten.new_empty_strided.default",
               "aten.linalg_vector_norm.default", "aten.elu.default",
               "aten.elu_backward.default",
               "aten.max_pool3d_with_indices.default",
               "aten.adaptive_max_pool2d.default")


def _weight_norm_interface_backward(
        grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
        saved_norms: torch.Tensor, dim: int) -> Tuple[torch.Tensor,
                                                      torch.Tensor]:
    """(grad_v, grad_g) of w = g * v / ||v||, the norm over every dim but
    `dim` (every dim when dim is -1), as PyTorch computes them: grad_g =
    sum(grad_w * v) / norms, grad_v = g / norms * (grad_w - v * grad_g /
    norms), in the dtype of the norms (float32 for half weights)."""
    dims = [d for d in range(saved_v.dim()) if d != dim]
    acc = saved_norms.dtype
    gw, v, g = grad_w.to(acc), saved_v.to(acc), saved_g.to(acc)
    grad_g = ((gw * v).sum(dims, keepdim=True).reshape(saved_norms.shape)
              / saved_norms)
    grad_v = (g / saved_norms) * (gw - v * (grad_g / saved_norms))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)


def _max_dim(x: torch.Tensor, dim: int,
             keepdim: bool = False) -> Any:
    """aten.max.dim: (the row maxima, the index of each row's first).
    Bool rows stay whole (argmax takes no bool)."""
    if x.dtype == torch.bool:
        return NotImplemented
    return aten.amax(x, [dim], keepdim), aten.argmax(x, dim, keepdim)


def _min_dim(x: torch.Tensor, dim: int,
             keepdim: bool = False) -> Any:
    """aten.min.dim: (the row minima, the index of each row's first).
    Bool rows stay whole."""
    if x.dtype == torch.bool:
        return NotImplemented
    return aten.amin(x, [dim], keepdim), aten.argmin(x, dim, keepdim)


def _atan(x: torch.Tensor) -> torch.Tensor:
    """aten.atan as atan2(x, 1)."""
    return aten.atan2(x, aten.scalar_tensor(1.0, dtype=x.dtype,
                                            device=x.device))


def _max_pool_backward(spatial: int) -> Callable[..., torch.Tensor]:
    """The backward of a max pool over `spatial` dims that recorded each
    output's input position as a flat index into the input's spatial dims
    (per batch and channel): grad_input[..., i] = sum of grad_output where
    indices == i."""

    def backward(grad: torch.Tensor, x: torch.Tensor, *args: Any) -> torch.Tensor:
        indices = args[-1]
        lead = x.dim() - spatial
        flat = list(x.shape[:lead]) + [-1]
        out = aten.new_zeros(x, flat[:-1] + [_numel(x.shape[lead:])],
                             dtype=grad.dtype)
        out = aten.scatter_add(out, lead, aten.reshape(indices, flat),
                               aten.reshape(grad, flat))
        return aten.reshape(out, list(x.shape))

    return backward


def _numel(sizes: Any) -> Any:
    n = 1
    for s in sizes:
        n = n * s
    return n


_OURS: Dict[str, Callable[..., Any]] = {
    "aten._weight_norm_interface_backward.default":
        _weight_norm_interface_backward,
    "aten.max.dim": _max_dim,
    "aten.min.dim": _min_dim,
    "aten.atan.default": _atan,
    "aten.max_pool3d_with_indices_backward.default": _max_pool_backward(3),
    "aten.adaptive_max_pool2d_backward.default": _max_pool_backward(2),
    "aten.adaptive_max_pool3d_backward.default": _max_pool_backward(3),
}


def _overload(name: str) -> Any:
    """The op overload "aten.<packet>.<overload>" names, or None when this
    torch lacks it."""
    packet, overload = name.split(".")[1:]
    return getattr(getattr(aten, packet, None), overload, None)


def extra_decompositions(
        kiln_ops: FrozenSet[str]) -> Dict[Any, Callable[..., Any]]:
    """{op overload: decomposition} for the ops above that Kiln does not
    lower itself and this torch has."""
    from torch._decomp import decomposition_table  # noqa: PLC0415

    out: Dict[Any, Callable[..., Any]] = {}
    for name in _FROM_TORCH:
        op = _overload(name)
        if name not in kiln_ops and op in decomposition_table:
            out[op] = decomposition_table[op]
    for name, fn in _OURS.items():
        op = _overload(name)
        if name not in kiln_ops and op is not None:
            out[op] = fn
    return out
