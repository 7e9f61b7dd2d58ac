#!/usr/bin/python3
"""Loads weights exported by pstrain (model.pt) with torch.load, rebuilds the
model in Python with the same parameter names, and prints its accuracy on
the Fashion-MNIST test set (first N examples), normalised as the job was.

  eval_exported.py MODEL.pt lenet|mlp N
"""
import gzip
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    path, model_name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    weights = torch.load(path)
    model = LeNet() if model_name == "lenet" else Mlp()
    model.load_state_dict(weights)  # strict: every name and shape must match
    model.eval()
    x = torch.from_numpy(read_idx(f"{DATA}/t10k-images-idx3-ubyte.gz")[:n].copy()).float()
    x = ((x / 255.0 - 0.2860) / 0.3530).unsqueeze(1)
    y = torch.from_numpy(read_idx(f"{DATA}/t10k-labels-idx1-ubyte.gz")[:n].copy()).long()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
