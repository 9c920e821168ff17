"""A small image classifier: two Conv2d + BatchNorm2d + ReLU stages with
MaxPool2d, AdaptiveAvgPool2d, a Linear classifier (trained with
cross-entropy; BatchNorm in training mode updates its running stats)."""

import torch
import torch.nn as nn


class ConvNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(16, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))
