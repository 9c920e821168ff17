"""The model suite (issue 15): small real modules written with torch.nn as
people write them, and one registry that the tests (tests/python/
test_models.py) and the benchmarks (bench/python/coverage.py,
step_time.py) share.

    from models import MODELS, train_step
    spec = MODELS["nanogpt"]
    model = spec.make()                  # an nn.Module, seeded
    args, target = spec.example()        # example inputs (CPU, float32)
    loss = spec.loss(model(*args), target)

Each ModelSpec:
  make(dtype=torch.float32) -> nn.Module (parameters from torch.manual_seed(0))
  example(batch=None, dtype=torch.float32, seed=1) -> (args, target): the
      forward's arguments and what the loss compares with (None when the
      model computes its loss itself, as nanoGPT does); `batch` changes the
      leading size (dynamic=True tests call it with two sizes)
  loss(output, target) -> the scalar training loss
  bf16: whether the model runs in bfloat16 on the CPU in eager PyTorch
  lr: AdamW's learning rate for the step

train_step(model, optimizer, spec, args, target) runs forward, backward and
optimizer.step() (AdamW, foreach=True: make_optimizer) and returns the
output and the loss; the optimizer step always runs eagerly.

Import from a checkout: put tests/ on sys.path (the tests' conftest.py and
the bench scripts do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import CausalSelfAttention
from .convnet import ConvNet
from .llama import LlamaMLPBlock
from .mlp import MLP
from .nanogpt import NanoGPT

__all__ = ["MODELS", "ModelSpec", "make_optimizer", "train_step"]

Inputs = Tuple[Tuple[Any, ...], Optional[torch.Tensor]]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    constructor: Callable[[], nn.Module]
    inputs: Callable[[int, torch.dtype, torch.Generator], Inputs]
    batch: int
    loss_fn: Callable[[Any, Optional[torch.Tensor]], torch.Tensor]
    bf16: bool = True
    lr: float = 1e-3
    description: str = ""

    def make(self, dtype: torch.dtype = torch.float32) -> nn.Module:
        torch.manual_seed(0)
        return self.constructor().to(dtype)

    def example(self, batch: Optional[int] = None,
                dtype: torch.dtype = torch.float32, seed: int = 1) -> Inputs:
        g = torch.Generator().manual_seed(seed)
        return self.inputs(batch or self.batch, dtype, g)

    def loss(self, output: Any, target: Optional[torch.Tensor]) -> torch.Tensor:
        return self.loss_fn(output, target)


def make_optimizer(model: nn.Module, spec: ModelSpec) -> torch.optim.Optimizer:
    """AdamW as training scripts create it (foreach=True)."""
    return torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01,
                             foreach=True)


def train_step(model: Callable[..., Any], optimizer: torch.optim.Optimizer,
               spec: ModelSpec, args: Tuple[Any, ...],
               target: Optional[torch.Tensor],
               amp: Optional[torch.dtype] = None) -> Tuple[Any, torch.Tensor]:
    """One training step: forward, loss, backward, optimizer.step(); grads
    are left in .grad (zeroed at the start). `amp`: the forward and the
    loss under torch.autocast to that dtype (mixed precision as training
    scripts write it: float32 parameters, the backward outside)."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=amp or torch.bfloat16,
                        enabled=amp is not None):
        out = model(*args)
        loss = spec.loss(out, target)
    loss.backward()
    optimizer.step()
    return out, loss


# -- input makers ------------------------------------------------------------

def _tokens_in(d: int, seq: int) -> Callable[[int, torch.dtype, torch.Generator], Inputs]:
    def make(batch: int, dtype: torch.dtype, g: torch.Generator) -> Inputs:
        x = torch.randn(batch, seq, d, generator=g).to(dtype)
        target = torch.randn(batch, seq, d, generator=g).to(dtype)
        return (x,), target
    return make


def _gpt_in(vocab: int, seq: int) -> Callable[[int, torch.dtype, torch.Generator], Inputs]:
    def make(batch: int, dtype: torch.dtype, g: torch.Generator) -> Inputs:
        idx = torch.randint(0, vocab, (batch, seq), generator=g)
        targets = torch.randint(0, vocab, (batch, seq), generator=g)
        return (idx, targets), None
    return make


def _images_in(batch: int, dtype: torch.dtype, g: torch.Generator) -> Inputs:
    x = torch.randn(batch, 3, 16, 16, generator=g).to(dtype)
    labels = torch.randint(0, 10, (batch,), generator=g)
    return (x,), labels


def _mse(out: torch.Tensor, target: Optional[torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(out, target)


def _cross_entropy(out: torch.Tensor, target: Optional[torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(out, target)


def _model_loss(out: Any, target: Optional[torch.Tensor]) -> torch.Tensor:
    return out[1]  # (logits, loss): the model computed it


def _encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                      dropout=0.0, batch_first=True)


MODELS: Dict[str, ModelSpec] = {s.name: s for s in [
    ModelSpec("mlp", lambda: MLP(d=32, hidden=128), _tokens_in(32, 8), 4,
              _mse, description="LayerNorm + Linear + GELU + Linear, residual"),
    ModelSpec("llama_mlp", lambda: LlamaMLPBlock(d=32, hidden=64),
              _tokens_in(32, 8), 4, _mse,
              description="RMSNorm + SwiGLU feed-forward (Llama style)"),
    ModelSpec("attention", lambda: CausalSelfAttention(d=32, heads=4),
              _tokens_in(32, 8), 2, _mse,
              description="LayerNorm + causal scaled_dot_product_attention"),
    ModelSpec("encoder_layer", _encoder_layer, _tokens_in(32, 8), 2, _mse,
              description="nn.TransformerEncoderLayer (post-norm, ReLU)"),
    ModelSpec("nanogpt", lambda: NanoGPT(vocab=64, block=16, d=32, heads=4,
                                         layers=1),
              _gpt_in(64, 16), 2, _model_loss,
              description="nanoGPT: token + position embedding, causal block, "
                          "LM head, cross-entropy"),
    ModelSpec("convnet", ConvNet, _images_in, 4, _cross_entropy,
              description="Conv2d + BatchNorm2d + ReLU + MaxPool2d, "
                          "AdaptiveAvgPool2d, Linear, cross-entropy"),
]}
