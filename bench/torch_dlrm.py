#!/usr/bin/python3
"""The peer for `bench/run.sh embeddings`: pstrain's `dlrm` in PyTorch.

The model is worker/dlrm_model.cc's, layer for layer: bottom MLP 13 -> 64 ->
dim (ReLU after every layer), the dot interaction of [x, e_1..e_26] (the
upper triangle, i < j, flattened), top MLP (dim + 351) -> 64 -> 32 -> 1 (ReLU
between layers), BCE with logits; weights N(0, 2 / (in + out)) and biases
N(0, 1 / out) drawn in the C++ model's order from a generator seeded with
the job's seed (42) (the same distributions; equal values are likely, as
both draw from LibTorch's CPU generator, but not checked). Embeddings: one
nn.EmbeddingBag(rows, dim, mode=sum, sparse=True) per field, the hashing
trick (id mod rows) to --rows rows, rows U(-1/sqrt(dim), 1/sqrt(dim)) as the
shards' default initializer. Optimizer: torch.optim.Adagrad (it takes sparse
gradients), dense parameters at --lr-dense, embedding rows at --lr-emb, eps
1e-10: the arithmetic of the job's `adagrad` on the dense table and on the
rows.

Data: the same Criteo TSV, read as worker/criteo_data.cc reads it: dense
features log(1 + max(x, 0)), a missing one 0; ids hex, a missing one -1;
rank r of w keeps line i when i % w == r, in file order, no shuffling, as
pstrain's workers do. The file is parsed before the clock starts (pstrain's
workers parse while they train: the peer is not charged for Python's parser).

--workers 1: one process (--threads intra-op threads). --workers N: DDP on
Gloo, N processes (spawned), --threads each; DDP all-reduces the sparse
gradients as sparse tensors. Rank 0 evaluates the test file after training.

Prints one JSON line: samples/s (all ranks' samples over the slowest rank's
training seconds), test AUC (ties averaged) and log loss, steps, and every
process's peak RSS (getrusage ru_maxrss).
"""
import argparse
import json
import math
import os
import resource
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DENSE, SPARSE = 13, 26


def read_criteo(path, rank=0, world=1):
    """(labels float32 [n], dense float32 [n, 13], ids int64 [n, 26]) of this
    rank's lines."""
    labels, dense, ids = [], [], []
    with open(path, "r") as f:
        i = 0
        for line in f:
            line = line.rstrip("\r\n")
            if not line:
                continue
            keep = i % world == rank
            i += 1
            if not keep:
                continue
            cells = line.split("\t")
            if len(cells) != 1 + DENSE + SPARSE:
                raise SystemExit(f"{path}: a line with {len(cells)} columns")
            labels.append(float(cells[0]))
            dense.append([int(c) if c else 0 for c in cells[1:1 + DENSE]])
            ids.append([int(c, 16) if c else -1 for c in cells[1 + DENSE:]])
    d = np.log1p(np.maximum(np.asarray(dense, dtype=np.float64), 0)).astype(np.float32)
    # Criteo's ids are 8 hex digits: int64 holds them as they are.
    return (torch.tensor(labels, dtype=torch.float32), torch.from_numpy(d),
            torch.tensor(ids, dtype=torch.int64))


class Dlrm(nn.Module):
    def __init__(self, rows, dim, seed, bottom=(64,), top=(64, 32)):
        super().__init__()
        self.rows = rows
        gen = torch.Generator().manual_seed(seed)
        n = SPARSE + 1
        self.bottom = self.mlp([DENSE, *bottom, dim], gen)
        self.top = self.mlp([dim + n * (n - 1) // 2, *top, 1], gen)
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(SPARSE))
        with torch.no_grad():
            for t in self.tables:
                t.weight.uniform_(-1 / math.sqrt(dim), 1 / math.sqrt(dim))
        self.register_buffer("pairs", torch.tensor([i * n + j for i in range(n) for j in range(i + 1, n)]))

    @staticmethod
    def mlp(sizes, gen):
        layers = nn.ModuleList()
        with torch.no_grad():
            for a, b in zip(sizes[:-1], sizes[1:]):
                layer = nn.Linear(a, b)
                layer.weight.normal_(0.0, math.sqrt(2.0 / (a + b)), generator=gen)
                layer.bias.normal_(0.0, math.sqrt(1.0 / b), generator=gen)
                layers.append(layer)
        return layers

    def forward(self, dense, ids):
        x = dense
        for layer in self.bottom:
            x = F.relu(layer(x))
        rows = torch.remainder(ids, self.rows)  # the hashing trick; -1 (missing) -> rows - 1
        pooled = [t(rows[:, f:f + 1]) for f, t in enumerate(self.tables)]  # one id per bag
        t = torch.stack([x, *pooled], 1)
        z = torch.bmm(t, t.transpose(1, 2)).reshape(t.shape[0], -1)
        y = torch.cat([x, z.index_select(1, self.pairs)], 1)
        for i, layer in enumerate(self.top):
            y = layer(y)
            if i + 1 < len(self.top):
                y = F.relu(y)
        return y.reshape(-1)


def auc(scores, labels):
    """Mann-Whitney AUC with tied scores given their average rank."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels) > 0.5
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2.0)[inverse]  # average 1-based rank of each tie group
    pos = labels.sum()
    neg = len(labels) - pos
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def evaluate(model, path):
    labels, dense, ids = read_criteo(path)
    scores = []
    with torch.no_grad():
        model.eval()
        for s in range(0, len(labels), 1024):
            scores.append(torch.sigmoid(model(dense[s:s + 1024], ids[s:s + 1024])))
    p = torch.cat(scores).double().clamp(1e-12, 1 - 1e-12)
    y = labels.double()
    log_loss = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
    return auc(p.numpy(), labels.numpy()), log_loss


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def train(rank, args, port, results):
    torch.set_num_threads(args.threads)
    ddp = args.workers > 1
    if ddp:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    labels, dense, ids = read_criteo(args.train, rank, args.workers)
    torch.manual_seed(args.seed)  # the tables' rows: every run, and every DDP rank, starts from the same values
    model = Dlrm(args.rows, args.dim, args.seed)
    net = nn.parallel.DistributedDataParallel(model) if ddp else model
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    opt = torch.optim.Adagrad([{"params": dense_params, "lr": args.lr_dense},
                               {"params": list(model.tables.parameters()), "lr": args.lr_emb}], eps=1e-10)
    steps = (len(labels) + args.batch - 1) // args.batch
    if args.max_steps > 0:
        steps = min(steps, args.max_steps)
    if ddp:  # every rank the same number of steps (DDP's collectives pair up)
        t = torch.tensor([steps])
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        steps = int(t)
        dist.barrier()
    samples = 0
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        for b in range(steps):
            s = slice(b * args.batch, (b + 1) * args.batch)
            loss = F.binary_cross_entropy_with_logits(net(dense[s], ids[s]), labels[s])
            opt.zero_grad()
            loss.backward()
            opt.step()
            samples += len(labels[s])
    seconds = time.perf_counter() - t0
    row = {"rank": rank, "samples": samples, "seconds": seconds, "steps": steps * args.epochs}
    if rank == 0 and args.test:
        row["auc"], row["log_loss"] = evaluate(model, args.test)
    row["peak_rss_mb"] = peak_rss_mb()
    results.put(row)
    if ddp:
        dist.destroy_process_group()


def run(rank, args, port, results):
    try:
        train(rank, args, port, results)
    except Exception as e:  # reported, not hung on
        results.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", required=True)
    p.add_argument("--test", default="")
    p.add_argument("--rows", type=int, required=True, help="rows per table (ids are taken mod rows)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--workers", type=int, default=1, help="1: one process; N: DDP (gloo), N processes")
    p.add_argument("--batch", type=int, default=128, help="per process")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--lr-dense", type=float, default=0.02)
    p.add_argument("--lr-emb", type=float, default=0.05)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    class Rows(list):
        put = list.append

    if args.workers == 1:
        rows = Rows()
        run(0, args, 0, rows)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=run, args=(r, args, port, queue)) for r in range(args.workers)]
        for pr in procs:
            pr.start()
        rows = [queue.get(timeout=1800) for _ in procs]
        if any("error" in r for r in rows):
            for pr in procs:
                pr.terminate()
        for pr in procs:
            pr.join()
    errors = [r["error"] for r in rows if "error" in r]
    if errors:
        raise SystemExit(f"torch_dlrm failed: {errors[0][:300]}")
    rows.sort(key=lambda r: r["rank"])
    seconds = max(r["seconds"] for r in rows)
    samples = sum(r["samples"] for r in rows)
    print(json.dumps({"samples_per_s": samples / seconds, "seconds": seconds, "samples": samples,
                      "steps": rows[0]["steps"], "auc": rows[0].get("auc"), "log_loss": rows[0].get("log_loss"),
                      "peak_rss_mb": [round(r["peak_rss_mb"], 1) for r in rows],
                      "table_mb": SPARSE * args.rows * args.dim * 4 / 2**20,
                      "adagrad_state_mb": SPARSE * args.rows * args.dim * 4 / 2**20}))


if __name__ == "__main__":
    main()
