"""How far a model's gradients move when its input moves by float32's
rounding: the sensitivity behind real_models.py's MISMATCH rows of small
conv models (bench/README.md, session 18).

    PY=$(bash deploy/python-env.sh)
    KILN_REAL_MODELS_DIR=~/.cache/kiln/real-models \\
        $PY bench/python/grad_sensitivity.py

Each model (torchvision, float64, training mode, dropout off, 2 images of
64x64 as real_models.py's default) takes one step's gradients of
mean(out^2) at x and at x * (1 + 1e-7 * noise), all in float64, and
prints the relative change of the gradient real_models.py flagged (its
largest error against float64) and the largest change of any gradient. A
change far above 1e-7 means any float32 implementation whose rounding
differs from eager's can land that far from float64.
"""

from __future__ import annotations

import copy
import os
import sys

import torch

sys.path.append(os.environ.get(
    "KILN_REAL_MODELS_DIR",
    os.path.join(os.path.expanduser("~"), ".cache", "kiln", "real-models")))
import torchvision  # noqa: E402

# (torchvision model, the gradient real_models.py flagged in session 18)
CASES = [
    ("mobilenet_v2", "features.8.conv.0.1.bias"),
    ("mnasnet0_5", "layers.8.0.layers.1.bias"),
    ("googlenet", "inception4a.branch2.0.bn.bias"),
    ("resnet18", "layer2.1.conv1.weight"),
]


def _grads(model: torch.nn.Module, x: torch.Tensor) -> dict:
    m = copy.deepcopy(model)
    m(x).pow(2).mean().backward()
    return {n: p.grad for n, p in m.named_parameters()}


def main() -> None:
    torch.manual_seed(0)
    for name, watch in CASES:
        kw = {"aux_logits": False, "init_weights": True} \
            if name == "googlenet" else {}
        model = getattr(torchvision.models, name)(**kw).double().train()
        for mod in model.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
        x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
        g0 = _grads(model, x)
        g1 = _grads(model, x * (1 + 1e-7 * torch.randn_like(x)))

        def rel(n: str) -> float:
            return ((g1[n] - g0[n]).abs().max()
                    / g0[n].abs().max().clamp_min(1e-30)).item()
        worst = max(g0, key=rel)
        print(f"{name}: {watch} moves {rel(watch):.1e}; "
              f"largest {rel(worst):.1e} ({worst})")


if __name__ == "__main__":
    main()
