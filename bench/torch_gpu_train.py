"""The PyTorch peer of `bench/run.sh gpu`, and the model it shares with pstrain.

  torch_gpu_train.py model PATH          writes the benchmark's TorchScript model
  torch_gpu_train.py train --ddp 0|1 ... trains it on the GPU, prints samples/s
                                         (--device cpu: on the CPU, DDP over Gloo)

The model: ResNet-18 (torchvision's layout, written out here so no torchvision
is needed) for 1x28x28 inputs, 10 classes, 11.2M parameters. The data path is
pstrain's: a CPU dataset, each batch gathered by index, pinned and copied to
the GPU without blocking; SGD with momentum; the same batch and steps.
--precision bf16|fp16 trains under autocast (fp16 with a GradScaler), as
pstrain's `precision` does.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        skip = x if self.down is None else self.down(x)
        return F.relu(h + skip)


class ResNet18(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        layers = []
        cin = 64
        for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
            layers.append(Block(cin, cout, stride))
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        h = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    model = torch.jit.load(args.model).to(device)
    if args.ddp:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        # The rendezvous store only: Debian's PyTorch 2.x is built without
        # libuv, whose store is the default from 2.4 (1.13 ignores this).
        os.environ.setdefault("USE_LIBUV", "0")
        torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = None
    if args.precision == "fp16":
        try:
            scaler = torch.amp.GradScaler("cuda")
        except (AttributeError, TypeError):  # before 2.3
            scaler = torch.cuda.amp.GradScaler()
    g = torch.Generator().manual_seed(args.seed)
    x_all = torch.randn(args.examples, 1, 28, 28, generator=g)
    y_all = torch.randint(0, 10, (args.examples,), generator=g)
    order = torch.randperm(args.examples, generator=g)

    def step(i):
        idx = order[(i * args.batch) % (args.examples - args.batch):][: args.batch]
        x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
        if cuda:
            x = x.pin_memory().to(device, non_blocking=True)
            y = y.pin_memory().to(device, non_blocking=True)
        opt.zero_grad()  # PyTorch's default: set_to_none=True (2.0 on), as pstrain's workers do
        if amp is None:
            loss = F.cross_entropy(model(x), y)
        else:
            with torch.autocast(args.device, dtype=amp):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss

    for i in range(args.warmup):
        step(i)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    final = loss.item()
    sync()
    secs = time.perf_counter() - start
    print(json.dumps({"samples_per_s": args.steps * args.batch / secs, "loss": final, "ddp": bool(args.ddp),
                      "precision": args.precision}))
    if args.ddp:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("path")
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--ddp", type=int, default=0)
    t.add_argument("--port", type=int, default=29517)
    t.add_argument("--batch", type=int, default=256)
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--examples", type=int, default=16384)
    t.add_argument("--lr", type=float, default=0.05)
    t.add_argument("--threads", type=int, default=4)
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    args = p.parse_args()
    if args.cmd == "model":
        torch.manual_seed(0)
        torch.jit.script(ResNet18()).save(args.path)
        return
    train(args)


if __name__ == "__main__":
    sys.exit(main())
