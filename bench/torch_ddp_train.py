#!/usr/bin/python3
"""The peer for `bench/run.sh train` and `comm`: PyTorch DDP (gloo).

`train`: the demo job. `comm` (--model mlp_wide): the same 784-2048-2048-10
MLP as pstrain's `mlp_wide`, without a communication hook or with DDP's
fp16_compress_hook / bf16_compress_hook (--hook), on a subset of the
training set (--limit-train); it also counts the loopback bytes of the run.

Same model (LeNet-5), data (Fashion-MNIST, normalised the same way), batch per
process, processes, threads per process, optimizer (SGD lr 0.05 momentum 0.9,
cosine per epoch) and epochs as examples/fashion_mnist.yaml; rank 0 evaluates
on the test set after every epoch, as pstrain's worker 0 does. Prints one
JSON line: samples/s over the training loop (all ranks) and final accuracy.
"""
import argparse
import gzip
import json
import math
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(prefix):
    x = torch.from_numpy(read_idx(f"{DATA}/{prefix}-images-idx3-ubyte.gz").copy()).float()
    x = ((x / 255.0 - 0.2860) / 0.3530).unsqueeze(1)
    y = torch.from_numpy(read_idx(f"{DATA}/{prefix}-labels-idx1-ubyte.gz").copy()).long()
    return x, y


class MlpWide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 2048)
        self.fc2 = nn.Linear(2048, 2048)
        self.fc3 = nn.Linear(2048, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


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


def run(rank, args, port, results):
    try:
        train(rank, args, port, results)
    except Exception as e:  # e.g. a hook whose dtype this Gloo cannot reduce
        results.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def train(rank, args, port, results):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = args.master_addr
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("USE_LIBUV", "0")  # Debian's PyTorch 2.x has no libuv store
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    x, y = load("train")
    if args.limit_train > 0:
        x, y = x[:args.limit_train], y[:args.limit_train]
    tx, ty = load("t10k")
    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(MlpWide() if args.model == "mlp_wide" else LeNet())
    if args.hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        hook = {"fp16": default_hooks.fp16_compress_hook, "bf16": getattr(default_hooks, "bf16_compress_hook", None)}
        if hook[args.hook] is None:
            raise SystemExit(f"this PyTorch has no {args.hook}_compress_hook")
        model.register_comm_hook(None, hook[args.hook])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(len(y)), num_replicas=args.workers, rank=rank, shuffle=True, seed=args.seed)
    samples = 0
    acc = 0.0
    dist.barrier()
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        for g in opt.param_groups:  # cosine per epoch, as pstrain's lr_schedule
            g["lr"] = 0.5 * args.lr * (1 + math.cos(math.pi * epoch / args.epochs))
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)))
        for b in range(0, len(idx), args.batch):
            i = idx[b:b + args.batch]
            loss = F.cross_entropy(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            samples += len(i)
        if rank == 0:
            with torch.no_grad():
                model.eval()
                correct = sum((model.module(tx[s:s + 1000]).argmax(1) == ty[s:s + 1000]).sum().item()
                              for s in range(0, len(ty), 1000))
                model.train()
            acc = correct / len(ty)
    elapsed = time.perf_counter() - t0
    results.put({"rank": rank, "samples": samples, "seconds": elapsed, "accuracy": acc})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--model", choices=["lenet", "mlp_wide"], default="lenet")
    p.add_argument("--hook", choices=["none", "fp16", "bf16"], default="none")
    p.add_argument("--limit-train", type=int, default=0)
    # One rank of a group whose ranks run on different hosts (or network
    # namespaces): this process is rank --rank and rendezvous at
    # --master-addr:--master-port; it prints its own row.
    p.add_argument("--rank", type=int, default=-1)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=0)
    args = p.parse_args()
    if args.rank >= 0:
        class Rows(list):
            put = list.append
        rows = Rows()
        run(args.rank, args, args.master_port, rows)
        if "error" in rows[0]:
            raise SystemExit(f"DDP failed: {rows[0]['error'][:300]}")
        print(json.dumps(rows[0]))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, args, port, results)) for r in range(args.workers)]
    for pr in procs:
        pr.start()
    rows = [results.get(timeout=1800) for _ in procs]
    errors = [r["error"] for r in rows if "error" in r]
    if errors:
        for pr in procs:
            pr.terminate()
        raise SystemExit(f"DDP failed: {errors[0][:300]}")
    for pr in procs:
        pr.join()
    seconds = max(r["seconds"] for r in rows)
    samples = sum(r["samples"] for r in rows)
    acc = [r["accuracy"] for r in rows if r["rank"] == 0][0]
    print(json.dumps({"samples_per_s": samples / seconds, "seconds": seconds, "accuracy": acc}))


if __name__ == "__main__":
    main()
