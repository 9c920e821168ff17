"""A transformer-style MLP block: LayerNorm, Linear, GELU, Linear, residual."""

import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, d: int = 32, hidden: int = 128) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))
