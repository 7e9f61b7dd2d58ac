#!/usr/bin/python3
"""The peer for `bench/run.sh pushpull`: a parameter server written with
torch.distributed.rpc, on the same model, shard count and worker count.

Ranks 0..S-1 are shards holding their part of the model and applying SGD;
ranks S..S+W-1 are workers that, every step, send each shard its gradient
slice and get the updated values back (rpc_async to all shards at once, the
same PushPull pattern as pstrain). Prints one JSON line per worker and a
summary JSON line last.

  /usr/bin/python3 bench/torch_rpc_ps.py --model flat --transport tcp
"""
import argparse
import json
import os
import socket
import threading
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

LR = 0.01
_state = {}
_lock = threading.Lock()


def model_shapes(model):
    if model == "flat":
        return [(10_000_000,)]
    shapes = [(2048, 1024)] + [(1024, 1024)] * 5 + [(512, 1024), (512, 512), (256, 512),
              (256, 256), (128, 256), (4096,), (2048,), (1024,), (1024,), (512,), (256,),
              (128,), (10, 256)]
    total = sum(torch.Size(s).numel() for s in shapes)
    return shapes + [(10_000_000 - total,)]


def split(model, shards, chunk_bytes=4 << 20):
    """Chunks of at most chunk_bytes, largest first onto the least-loaded shard (as pstrain's plan)."""
    chunks = []
    for i, s in enumerate(model_shapes(model)):
        n = torch.Size(s).numel()
        per = chunk_bytes // 4  # float32 elements
        pieces = (n + per - 1) // per
        base, extra = divmod(n, pieces)
        off = 0
        for k in range(pieces):
            m = base + (1 if k < extra else 0)
            chunks.append((i, off, m))
            off += m
    order = sorted(range(len(chunks)), key=lambda c: -chunks[c][2])
    load = [0] * shards
    assign = [[] for _ in range(shards)]
    for c in order:
        s = load.index(min(load))
        load[s] += chunks[c][2]
        assign[s].append(chunks[c])
    return assign


def init_shard(values):
    with _lock:
        _state["values"] = values


def push_pull(grads, idx=None):
    """SGD on the shard's chunks (those at `idx` of its list, or all), the new values back."""
    with _lock:
        out = []
        values = _state["values"] if idx is None else [_state["values"][j] for j in idx]
        for v, g in zip(values, grads):
            v.sub_(g, alpha=LR)
            out.append(v.clone())
        return out


def run(rank, args, port, start_at, results):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    shards, workers = args.shards, args.workers
    world = shards + workers
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120)
    if args.transport == "tcp":
        opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=120,
                                               _transports=["uv"], _channels=["basic"])
    name = f"ps{rank}" if rank < shards else f"w{rank - shards}"
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=opts)
    if rank >= shards:
        w = rank - shards
        torch.manual_seed(0)
        params = [torch.randn(s) for s in model_shapes(args.model)]
        grads = [torch.randn(s) * 1e-4 for s in model_shapes(args.model)]
        plan = split(args.model, shards, args.chunk_bytes)
        flat_p = [p.view(-1) for p in params]
        flat_g = [g.view(-1) for g in grads]
        if w == 0:
            for s in range(shards):
                rpc.rpc_sync(f"ps{s}", init_shard,
                             args=([flat_p[i][o:o + n].clone() for i, o, n in plan[s]],))
        step_bytes = 2 * sum(p.numel() * 4 for p in params)

        # --in-flight 0: one request per shard carrying all its chunks.
        # Otherwise as pstrain's training path: one request per chunk, at
        # most that many in flight per shard, the next sent as one returns.
        def send(s, idx):
            return rpc.rpc_async(f"ps{s}", push_pull,
                                 args=([flat_g[i][o:o + n] for i, o, n in (plan[s][j] for j in idx)], idx))

        def step():
            if not args.in_flight:
                futs = [rpc.rpc_async(f"ps{s}", push_pull, args=([flat_g[i][o:o + n] for i, o, n in plan[s]],))
                        for s in range(shards)]
                for s, f in enumerate(futs):
                    for (i, o, n), v in zip(plan[s], f.wait()):
                        flat_p[i][o:o + n].copy_(v)
                return
            queued = [list(range(len(plan[s]))) for s in range(shards)]
            inflight = []
            for s in range(shards):
                for _ in range(min(args.in_flight, len(queued[s]))):
                    j = queued[s].pop(0)
                    inflight.append((s, j, send(s, [j])))
            while inflight:
                s, j, f = inflight.pop(0)
                (i, o, n), = [plan[s][j]]
                flat_p[i][o:o + n].copy_(f.wait()[0])
                if queued[s]:
                    j2 = queued[s].pop(0)
                    inflight.append((s, j2, send(s, [j2])))

        time.sleep(max(0.0, start_at - 2.0 - time.time()))
        for _ in range(3):
            step()
        time.sleep(max(0.0, start_at - time.time()))
        lat = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            a = time.perf_counter()
            step()
            lat.append((time.perf_counter() - a) * 1000)
        el = time.perf_counter() - t0
        lat.sort()
        results.put({"worker": w, "steps": len(lat), "seconds": el,
                     "gb_per_s": step_bytes * len(lat) / el / 1e9,
                     "p50_ms": lat[len(lat) // 2], "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))]})
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="flat", choices=["flat", "mixed"])
    p.add_argument("--transport", default="tcp", choices=["tcp", "default"])
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--chunk-bytes", type=int, default=4 << 20)
    p.add_argument("--in-flight", type=int, default=0,
                   help="0: one request per shard; N: one per chunk, N in flight per shard")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 12  # rpc init and warm-up happen before this
    procs = [ctx.Process(target=run, args=(r, args, port, start_at, results))
             for r in range(args.shards + args.workers)]
    for pr in procs:
        pr.start()
    rows = [results.get(timeout=300) for _ in range(args.workers)]
    for pr in procs:
        pr.join(60)
    for r in rows:
        print(json.dumps(r))
    print(json.dumps({"transport": args.transport, "model": args.model,
                      "gb_per_s": sum(r["gb_per_s"] for r in rows),
                      "p50_ms": sorted(r["p50_ms"] for r in rows)[len(rows) // 2],
                      "p99_ms": max(r["p99_ms"] for r in rows)}))


if __name__ == "__main__":
    main()
