#!/usr/bin/python3
"""Writes a TorchScript classifier for 1x28x28 inputs that is sequential at
its top level (an nn.Sequential of blocks, each with parameters) to argv[1].

Used by the tests of pipelined TorchScript models: the workers cut it
between its top-level children. With --not-sequential the module's forward
does more than run its children in order (it adds a skip connection), so
cutting it would change the model: such a job is refused.
"""
import sys

import torch


class Block(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module, flatten: bool):
        super().__init__()
        self.layer = layer
        self.flatten = flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer(x)
        h = torch.relu(h)
        return h.flatten(1) if self.flatten else h


class NotSequential(torch.nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for m in self:
            h = m(h)
        return h + 1.0


torch.manual_seed(0)
layers = [
    Block(torch.nn.Conv2d(1, 4, 3, stride=2), flatten=True),  # 4 x 13 x 13
    Block(torch.nn.Linear(4 * 13 * 13, 64), flatten=False),
    Block(torch.nn.Linear(64, 32), flatten=False),
    torch.nn.Linear(32, 10),
]
kind = NotSequential if "--not-sequential" in sys.argv[2:] else torch.nn.Sequential
torch.jit.script(kind(*layers)).save(sys.argv[1])
