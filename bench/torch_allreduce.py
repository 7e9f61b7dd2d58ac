#!/usr/bin/python3
"""The peer for `bench/run.sh allreduce`: torch.distributed (gloo) all-reduce
of float32 tensors, timed exactly as bench/allreduce_bench.cc times
pstrain's: warm-up (>= 3 ops and >= 0.25 s), one timed op to pick the iteration count (broadcast from
rank 0), a barrier, then back-to-back all-reduces; time per op on rank 0.

usage: torch_allreduce.py --world N --port P [--sizes ...] [--seconds-per-size S]
Prints one JSON line: {"sizes": [...], "seconds": [...]}.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, args, queue):
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ.setdefault("USE_LIBUV", "0")  # Debian's PyTorch 2.x has no libuv store
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.world)
    sizes, seconds = [], []
    for nbytes in args.sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        # Warm-up exactly as allreduce_bench.cc: >= 3 ops and >= 0.25 s,
        # rank 0 deciding when it is over.
        warm_start, i = time.perf_counter(), 0
        while True:
            dist.all_reduce(t)
            more = torch.tensor([1 if i < 2 or time.perf_counter() - warm_start < 0.25 else 0], dtype=torch.long)
            dist.broadcast(more, 0)
            if more.item() == 0:
                break
            i += 1
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        one = time.perf_counter() - start
        iters = torch.tensor([max(3, int(args.seconds_per_size / max(one, 1e-6)))], dtype=torch.long)
        dist.broadcast(iters, 0)
        n = min(int(iters.item()), 2000)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t)
        sizes.append(nbytes)
        seconds.append((time.perf_counter() - start) / n)
    if rank == 0:
        queue.put({"sizes": sizes, "seconds": seconds})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29501)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4096, 1 << 20, 16 << 20, 64 << 20, 256 << 20])
    p.add_argument("--seconds-per-size", type=float, default=2.0)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, args, queue)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    result = queue.get()
    for proc in procs:
        proc.join()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
