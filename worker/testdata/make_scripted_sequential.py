#!/usr/bin/python3
"""Writes a TorchScript classifier for 1x28x28 inputs that is sequential at
its top level (an nn.Sequential of blocks, each with parameters) to argv[1].

Used by the tests of pipelined TorchScript models: the workers cut it
between its top-level children. With --not-sequential the module's forward
does more than run its children in order (it adds a skip connection), so
cutting it would change the model: such a job is refused.

With --named-stages the module is not sequential (a skip connection, a
flatten between children) but names its stages: methods stage_0, stage_1,
stage_2 whose chain is its forward; the workers cut it between them. With
--shared-stages two of those methods use one layer: refused.
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


class NamedStages(torch.nn.Module):
    shared: torch.jit.Final[bool]  # a constant: the branch not taken is not compiled

    def __init__(self, shared: bool):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, stride=2)
        # One container, its layers in two stages (stage_1 reads enc.a,
        # stage_2 enc.b): the stages own what they read, not all of enc.
        self.enc = torch.nn.Module()
        self.enc.a = torch.nn.Linear(4 * 13 * 13, 64)
        self.enc.b = torch.nn.Linear(32, 10)
        self.skip = torch.nn.Linear(4 * 13 * 13, 64)
        self.fc2 = torch.nn.Linear(64, 32)
        self.shared = shared

    @torch.jit.export
    def stage_0(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)).flatten(1)

    @torch.jit.export
    def stage_1(self, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.enc.a(h)) + self.skip(h)

    @torch.jit.export
    def stage_2(self, h: torch.Tensor) -> torch.Tensor:
        if self.shared:
            h = h + self.enc.a.bias
        return self.enc.b(torch.relu(self.fc2(h)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage_2(self.stage_1(self.stage_0(x)))


torch.manual_seed(0)
if "--named-stages" in sys.argv[2:] or "--shared-stages" in sys.argv[2:]:
    torch.jit.script(NamedStages("--shared-stages" in sys.argv[2:])).save(sys.argv[1])
    sys.exit(0)
layers = [
    Block(torch.nn.Conv2d(1, 4, 3, stride=2), flatten=True),  # 4 x 13 x 13
    Block(torch.nn.Linear(4 * 13 * 13, 64), flatten=False),
    Block(torch.nn.Linear(64, 32), flatten=False),
    torch.nn.Linear(32, 10),
]
kind = NotSequential if "--not-sequential" in sys.argv[2:] else torch.nn.Sequential
torch.jit.script(kind(*layers)).save(sys.argv[1])
