#!/usr/bin/python3
"""The peer for `bench/run.sh pipeline`: PyTorch 1.13's Pipe on the CPU.

The model is worker/model.cc's `mlp_deep`, layer for layer (784 -> 1024 x 7
-> 10, ReLU between layers), cut into --stages partitions of consecutive
layers as pstrain's parameter-count cut does for it (equal runs, the first
layer's larger input counted), each a nn.Sequential on the CPU; Pipe cuts each
batch into --chunks micro-batches (GPipe's schedule: Pipe has no 1F1B).
Pipe needs torch.distributed.rpc initialised (one process, world size 1).
SGD with momentum 0.9, lr 0.05, cross-entropy; random 1x28x28 inputs and
labels (only the speed is compared). --threads intra-op threads. --plain:
the same model without Pipe, for reference.

Prints one JSON line: samples/s over --steps steps after --warmup steps, and
the process's peak RSS (getrusage ru_maxrss).
"""
import argparse
import json
import os
import resource
import tempfile
import time

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
from torch.distributed.pipeline.sync import Pipe

LAYERS, WIDTH = 8, 1024


def partitions(stages):
    """Consecutive layers per stage, the largest stage's parameters as few as
    they can be (pipeline/stage_cut.h's BalancedCut on parameter counts)."""
    sizes = [784 * WIDTH + WIDTH] + [WIDTH * WIDTH + WIDTH] * (LAYERS - 2) + [WIDTH * 10 + 10]
    best = None

    def cuts(start, left):
        if left == 1:
            yield [(start, LAYERS)]
            return
        for end in range(start + 1, LAYERS - left + 2):
            for rest in cuts(end, left - 1):
                yield [(start, end)] + rest

    for c in cuts(0, stages):
        worst = max(sum(sizes[a:b]) for a, b in c)
        if best is None or worst < best[0]:
            best = (worst, c)
    return best[1]


def layer(i):
    lin = nn.Linear(784 if i == 0 else WIDTH, 10 if i == LAYERS - 1 else WIDTH)
    mods = [nn.Flatten()] if i == 0 else []
    mods.append(lin)
    if i < LAYERS - 1:
        mods.append(nn.ReLU())
    return mods


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stages", type=int, required=True)
    p.add_argument("--chunks", type=int, required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--plain", action="store_true", help="the model without Pipe (one nn.Sequential)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    store = tempfile.NamedTemporaryFile()
    rpc.init_rpc("pipe", rank=0, world_size=1,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method="file://" + store.name))
    stages = nn.Sequential(*[nn.Sequential(*[m for i in range(a, b) for m in layer(i)])
                             for a, b in partitions(args.stages)])
    model = stages if args.plain else Pipe(stages, chunks=args.chunks)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(args.batch, 1, 28, 28)
    y = torch.randint(0, 10, (args.batch,))

    def step():
        out = model(x) if args.plain else model(x).local_value()
        loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - start
    rpc.shutdown()
    print(json.dumps({"samples_per_s": args.steps * args.batch / seconds, "seconds": seconds,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
