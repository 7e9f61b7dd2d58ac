#!/usr/bin/python3
"""Writes a small TorchScript classifier for 1x28x28 inputs to argv[1].

Used by the tests of the torchscript:<path> model path: the module is written
in Python, compiled with torch.jit.script and trained by the C++ worker.
"""
import sys

import torch


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, stride=2)
        self.fc = torch.nn.Linear(4 * 13 * 13, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        return self.fc(h.flatten(1))


torch.manual_seed(0)
torch.jit.script(SmallNet()).save(sys.argv[1])
