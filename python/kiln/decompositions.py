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
  nets) and ``aten.adaptive_max_pool{2,3}d`` (global, or where its bins
  are equal; else they stay whole): PyTorch's decompositions where this
  torch has them (2.15 does, 2.11 and older do not: S3D's 13 max pools
  ran eagerly on 2.11), else the same algorithm here
  (``_max_pool3d_with_indices``: every window gathered, its max and the
  first position of it); the first's backward and the
  adaptive max pools' backwards (``aten.max_pool3d_with_indices_backward``,
  ``aten.adaptive_max_pool{2,3}d_backward``) are the gradient added at the
  flat spatial index each output element recorded: a scatter_add into
  zeros (``_max_pool_backward``), as ATen's kernels accumulate it.
- ``aten.histc`` (the load-balancing statistics of transformers' MoE
  routers: DBRX, Ernie 4.5, FlexOlmo, DeepSeek V4, ...): the bin of each
  element as ATen's kernels compute it, counted by an accumulating
  ``index_put`` (``_histc``).
- ``aten.avg_pool3d`` and its backward (S3D's and I3D's heads,
  ``nn.LocalResponseNorm``): a depthwise convolution with a kernel of ones
  divided by the window's size, and the transposed convolution back;
  only where every window divides by the same number (no ceil_mode;
  padding counted, or none) — else they stay whole.

Only ops whose name is not in ``kiln_ops`` are given (Kiln's own lowering
wins).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, FrozenSet, List, Tuple

import torch

__all__ = ["extra_decompositions"]

aten = torch.ops.aten

# Ops whose decomposition PyTorch's full table has (not Core ATen's).
_FROM_TORCH = ("aten.new_empty_strided.default",
               "aten.linalg_vector_norm.default", "aten.elu.default",
               "aten.elu_backward.default",
               "aten.max_pool3d_with_indices.default",
               "aten.adaptive_max_pool2d.default",
               "aten.adaptive_max_pool3d.default")


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
        out = aten.new_zeros(x, flat[:-1] + [math.prod(x.shape[lead:])],
                             dtype=grad.dtype)
        out = aten.scatter_add(out, lead, aten.reshape(indices, flat),
                               aten.reshape(grad, flat))
        return aten.reshape(out, list(x.shape))

    return backward


def _pooled_size(size: Any, k: int, s: int, p: int, d: int,
                 ceil_mode: bool) -> Any:
    """A max pool's output length along one dim (ATen's
    pooling_output_shape): with ceil_mode the last window may start past
    the end's padding by less than a stride, never past the padded end."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out = out - 1
    return out


def _max_pool3d_with_indices(x: torch.Tensor, kernel: Any,
                             stride: Any = (), padding: Any = 0,
                             dilation: Any = 1,
                             ceil_mode: bool = False) -> Any:
    """aten.max_pool3d_with_indices for a torch without its decomposition,
    as PyTorch 2.15's (``_max_pool_nd_with_indices``): the input padded
    with -inf, every window gathered by index tensors, the max over each
    window and the first position holding it (max.dim), as a flat index
    into the unpadded D*H*W volume. Floating inputs only."""
    if not x.is_floating_point() or x.dim() not in (4, 5):
        return NotImplemented
    k = _triple(kernel)
    s = _triple(stride) if stride else k
    p, d = _triple(padding), _triple(dilation)
    xb = _batched(x)
    sizes = list(xb.shape[2:])
    outs = [_pooled_size(sizes[i], k[i], s[i], p[i], d[i], ceil_mode)
            for i in range(3)]
    pad: List[Any] = []
    for i in reversed(range(3)):  # constant_pad_nd takes the last dim first
        need = (outs[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1
        pad += [p[i], max(0, need - (sizes[i] + 2 * p[i])) + p[i]]
    xp = aten.constant_pad_nd(xb, pad, float("-inf"))
    index: List[Any] = [None, None]
    for i in range(3):  # [out_i, k_i] broadcast over the other dims
        at = (aten.unsqueeze(aten.arange(outs[i], device=x.device), 1) * s[i]
              + aten.unsqueeze(aten.arange(k[i], device=x.device), 0) * d[i])
        shape = [1] * 6
        shape[2 * i], shape[2 * i + 1] = outs[i], k[i]
        index.append(aten.reshape(at, shape))
    windows = aten.index(xp, index)  # N, C, o0, k0, o1, k1, o2, k2
    windows = aten.permute(windows, [0, 1, 2, 4, 6, 3, 5, 7])
    windows = aten.reshape(windows, list(windows.shape[:5]) + [-1])
    values, local = aten.max(windows, -1)
    flat = None
    for i in range(3):
        tail = math.prod(k[i + 1:])
        pos = aten.remainder(aten.div(local, tail, rounding_mode="floor"),
                             k[i]) if i else aten.div(
                                 local, tail, rounding_mode="floor")
        shape = [1] * 5
        shape[2 + i] = outs[i]
        start = aten.reshape(aten.arange(outs[i], device=x.device), shape)
        coord = start * s[i] + pos * d[i] - p[i]
        flat = coord if flat is None else flat * sizes[i] + coord
    if x.dim() == 4:
        return aten.squeeze(values, [0]), aten.squeeze(flat, [0])
    return values, flat


def _adaptive_max_pool(spatial: int) -> Callable[..., Any]:
    """aten.adaptive_max_pool{2,3}d for a torch without its decomposition,
    as PyTorch 2.15's: a global pool is amax and the first argmax of the
    flattened volume; equal bins are the max pool of the bin's size; other
    bins stay whole."""

    def pool(x: torch.Tensor, output_size: Any) -> Any:
        outs = list(output_size)
        ins = list(x.shape[-spatial:])
        if not x.is_floating_point() or 0 in outs:
            return NotImplemented
        if all(o == 1 for o in outs):
            dims = list(range(-spatial, 0))
            values = aten.amax(x, dims, True)
            flat = aten.reshape(x, list(x.shape[:-spatial]) + [-1])
            indices = aten.reshape(aten.argmax(flat, -1),
                                   list(x.shape[:-spatial]) + [1] * spatial)
            return values, indices
        if any(i % o for i, o in zip(ins, outs)):
            return NotImplemented
        kernel = [i // o for i, o in zip(ins, outs)]
        if spatial == 2:
            return aten.max_pool2d_with_indices(x, kernel)
        return aten.max_pool3d_with_indices(x, kernel)

    return pool


def _triple(v: Any) -> List[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 3 if len(v) == 1 else v


def _avg_pool3d_plan(x: torch.Tensor, kernel: Any, stride: Any,
                     padding: Any, ceil_mode: bool, count_include_pad: bool,
                     divisor_override: Any) -> Any:
    """(kernel, stride, padding, divisor) when every window of this
    avg_pool3d divides by one number, else None."""
    k = _triple(kernel)
    s = _triple(stride) if stride else k
    p = _triple(padding)
    if ceil_mode or (any(p) and not count_include_pad and
                     divisor_override is None):
        return None
    return k, s, p, divisor_override or math.prod(k)


def _batched(x: torch.Tensor) -> torch.Tensor:
    return aten.unsqueeze(x, 0) if x.dim() == 4 else x


def _avg_pool3d(x: torch.Tensor, kernel: Any, stride: Any = (),
                padding: Any = 0, ceil_mode: bool = False,
                count_include_pad: bool = True,
                divisor_override: Any = None) -> Any:
    """aten.avg_pool3d as a depthwise convolution with ones, divided."""
    plan = _avg_pool3d_plan(x, kernel, stride, padding, ceil_mode,
                            count_include_pad, divisor_override)
    if plan is None:
        return NotImplemented
    k, s, p, div = plan
    xb = _batched(x)
    c = xb.shape[1]
    ones = aten.new_ones(xb, [c, 1] + k)
    y = aten.convolution(xb, ones, None, s, p, [1, 1, 1], False, [0, 0, 0], c)
    y = aten.div(y, div)
    return aten.squeeze(y, [0]) if x.dim() == 4 else y


def _avg_pool3d_backward(grad: torch.Tensor, x: torch.Tensor, kernel: Any,
                         stride: Any, padding: Any, ceil_mode: bool,
                         count_include_pad: bool,
                         divisor_override: Any) -> Any:
    """Its backward: each window's gradient over its size, spread back
    over the window (a transposed depthwise convolution with ones)."""
    plan = _avg_pool3d_plan(x, kernel, stride, padding, ceil_mode,
                            count_include_pad, divisor_override)
    if plan is None:
        return NotImplemented
    k, s, p, div = plan
    xb, gb = _batched(x), _batched(grad)
    c = xb.shape[1]
    ones = aten.new_ones(gb, [c, 1] + k)
    # The input positions past the last window's reach.
    extra = [xb.shape[2 + d] - ((gb.shape[2 + d] - 1) * s[d] - 2 * p[d] + k[d])
             for d in range(3)]
    g = aten.convolution(aten.div(gb, div), ones, None, s, p, [1, 1, 1], True,
                         extra, c)
    return aten.squeeze(g, [0]) if x.dim() == 4 else g


def _histc(x: torch.Tensor, bins: int = 100, min: Any = 0,  # noqa: A002
           max: Any = 0) -> Any:  # noqa: A002
    """torch.histc as ATen computes it: an element v in [lo, hi] counts in
    bin int((v - lo) * bins / (hi - lo)) (the last bin also takes hi),
    in the input's dtype (integers divide as integers, half types in
    float32, as on CUDA); elements outside, and NaN, are not counted.
    lo == hi (the default 0, 0) means the data's own range, widened by
    1 each way where it is one value; that needs a static, non-empty
    input (else NotImplemented: the op stays whole). The counts are an
    accumulating index_put into zeros, in the input's dtype."""
    lo, hi = min, max
    if not isinstance(bins, int) or bins < 1 or not all(
            isinstance(v, (int, float)) for v in (lo, hi)):
        return NotImplemented
    flat = aten.reshape(x, [-1])
    if x.is_floating_point():
        acc = x.dtype if x.dtype in (torch.float32, torch.float64) \
            else torch.float32
        v = flat.to(acc)
    else:
        acc, v = None, flat
    if lo == hi:
        n = flat.shape[0]
        if not isinstance(n, int) or n == 0 or acc is None:
            return NotImplemented
        lo, hi = aten.amin(v, [0]), aten.amax(v, [0])
        same = aten.eq(lo, hi)
        lo = aten.where(same, lo - 1, lo)
        hi = aten.where(same, hi + 1, hi)
    elif lo > hi:
        return NotImplemented  # ATen raises; so does the op left whole
    in_range = aten.logical_and(aten.ge(v, lo), aten.le(v, hi))
    if acc is None:
        pos = aten.floor_divide(aten.mul(aten.sub(v, int(lo)), bins),
                                int(hi) - int(lo))
    else:
        pos = aten.div(aten.mul(aten.sub(v, lo), bins), aten.sub(hi, lo)
                       if isinstance(hi, torch.Tensor) else hi - lo)
    pos = aten.clamp_max(pos.to(torch.int64), bins - 1)
    pos = aten.where(in_range, pos, 0)
    counts = aten.zeros([bins], dtype=x.dtype, device=x.device)
    return aten.index_put(counts, [pos], in_range.to(x.dtype), True)


_OURS: Dict[str, Callable[..., Any]] = {
    "aten.histc.default": _histc,
    "aten._weight_norm_interface_backward.default":
        _weight_norm_interface_backward,
    "aten.max.dim": _max_dim,
    "aten.min.dim": _min_dim,
    "aten.atan.default": _atan,
    "aten.max_pool3d_with_indices_backward.default": _max_pool_backward(3),
    "aten.adaptive_max_pool2d_backward.default": _max_pool_backward(2),
    "aten.adaptive_max_pool3d_backward.default": _max_pool_backward(3),
    "aten.avg_pool3d.default": _avg_pool3d,
    "aten.avg_pool3d_backward.default": _avg_pool3d_backward,
}

# Ours for the ops of _FROM_TORCH that an older torch's table lacks.
_WHEN_TORCH_LACKS: Dict[str, Callable[..., Any]] = {
    "aten.max_pool3d_with_indices.default": _max_pool3d_with_indices,
    "aten.adaptive_max_pool2d.default": _adaptive_max_pool(2),
    "aten.adaptive_max_pool3d.default": _adaptive_max_pool(3),
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
        if name in kiln_ops or op is None:
            continue
        if op in decomposition_table:
            out[op] = decomposition_table[op]
        elif name in _WHEN_TORCH_LACKS:
            out[op] = _WHEN_TORCH_LACKS[name]
    for name, fn in _OURS.items():
        op = _overload(name)
        if name not in kiln_ops and op is not None:
            out[op] = fn
    return out
