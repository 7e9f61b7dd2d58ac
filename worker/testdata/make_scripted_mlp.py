#!/usr/bin/python3
"""Writes a small TorchScript classifier for 1x28x28 inputs to argv[1].

Used by the tests of the torchscript:<path> model path: the module is written
in Python, compiled with torch.jit.script and trained by the C++ worker.
With --float64 its parameters and arithmetic are float64 (the GPU tests
compare runs whose only difference is the order of additions).
"""
import sys

import torch


class SmallNet(torch.nn.Module):
    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self.conv = torch.nn.Conv2d(1, 4, 3, stride=2, dtype=dtype)
        self.fc = torch.nn.Linear(4 * 13 * 13, 10, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x.to(self.dtype)))
        return self.fc(h.flatten(1))


torch.manual_seed(0)
dtype = torch.float64 if "--float64" in sys.argv[2:] else torch.float32
torch.jit.script(SmallNet(dtype)).save(sys.argv[1])
