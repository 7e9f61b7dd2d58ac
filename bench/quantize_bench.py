#!/usr/bin/python3
"""bench/run.sh quantize: pstrain's int8 exports vs PyTorch 1.13's own
quantization of the same trained weights, measured in one process.

  quantize_bench.py WORK MODEL=WEIGHTS... 

For each MODEL (mlp, lenet) WORK holds MODEL-dynamic.pt (weights per
channel, the default), MODEL-dynamic-pt.pt (--per_tensor) and
MODEL-static.pt (pstrain-quantize's output for WEIGHTS, the fp32 weights a
pstrain job exported), MODEL-qat.pt (a QAT job of the same settings, converted with its
learned scales) and calibration.pt (the inputs the static export was
calibrated on). The peer: torch.ao.quantization.quantize_dynamic (Linear;
its default, weights per tensor, and per_channel_dynamic_qconfig),
FX static (prepare_fx with the engine's default qconfig mapping, the same
calibration inputs, convert_fx) and FX QAT (prepare_qat_fx, one epoch of
fine-tuning from the same weights, convert_fx), each scripted and saved as
TorchScript. Every module: file size, latency per batch of 1 and 64 test
images on one thread (median of 7 timed runs, the variants in turn), accuracy on the 10,000 test
images. Prints a table and, as its last line, one JSON object.
"""
import copy
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.ao.quantization import (get_default_qat_qconfig_mapping, get_default_qconfig_mapping,
                                   per_channel_dynamic_qconfig, quantize_dynamic)
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx, prepare_qat_fx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from quantize_models import accuracy, images  # noqa: E402
from eval_exported import LeNet, Mlp  # noqa: E402

ENGINE = "onednn"


def latency_ms(modules, x, iters, rounds=7):
    """Median ms per forward of each module over `rounds` timed runs, the
    modules taken in turn within each round so that load from elsewhere on
    the machine falls on all of them alike."""
    runs = {k: [] for k in modules}
    with torch.no_grad():
        for m in modules.values():
            for _ in range(3):
                m(x)
        for _ in range(rounds):
            for k, m in modules.items():
                start = time.perf_counter()
                for _ in range(iters):
                    m(x)
                runs[k].append((time.perf_counter() - start) / iters * 1e3)
    return {k: statistics.median(v) for k, v in runs.items()}


def saved_size(module, path):
    torch.jit.save(module, path)
    return os.path.getsize(path)


def peers(fp32, calib, train_x, train_y, example, work, name):
    out = {}
    dyn = quantize_dynamic(copy.deepcopy(fp32), {nn.Linear}, dtype=torch.qint8)
    out["torch dynamic"] = torch.jit.script(dyn)  # its default: weights per tensor
    dyn_pc = quantize_dynamic(copy.deepcopy(fp32), {nn.Linear: per_channel_dynamic_qconfig})
    out["torch dynamic pc"] = torch.jit.script(dyn_pc)
    prepared = prepare_fx(copy.deepcopy(fp32), get_default_qconfig_mapping(ENGINE), (example,))
    with torch.no_grad():
        prepared(calib)
    out["torch static"] = torch.jit.script(convert_fx(prepared))
    qat = prepare_qat_fx(copy.deepcopy(fp32).train(), get_default_qat_qconfig_mapping(ENGINE), (example,))
    opt = torch.optim.SGD(qat.parameters(), lr=1e-3, momentum=0.9)
    torch.manual_seed(36)
    perm = torch.randperm(len(train_x))
    for i in range(0, len(train_x), 64):
        idx = perm[i:i + 64]
        opt.zero_grad()
        F.cross_entropy(qat(train_x[idx]), train_y[idx]).backward()
        opt.step()
    qat.eval()
    out["torch qat"] = torch.jit.script(convert_fx(qat))
    return {k: (m, saved_size(m, f"{work}/{name}-{k.replace(' ', '_')}.pt")) for k, m in out.items()}


def main():
    work = sys.argv[1]
    torch.backends.quantized.engine = ENGINE
    torch.set_num_threads(1)
    test_x, test_y = images("test")
    train_x, train_y = images("train")
    calib = torch.load(f"{work}/calibration.pt")["inputs"]
    result = {"engine": ENGINE, "threads": 1, "models": {}}
    print(f"{'model':7} {'variant':16} {'bytes':>9} {'size':>6} {'b1 ms':>8} {'b64 ms':>8} {'accuracy':>9}",
          file=sys.stderr)
    for arg in sys.argv[2:]:
        name, weights = arg.split("=", 1)
        fp32 = LeNet() if name == "lenet" else Mlp()
        fp32.load_state_dict(torch.load(weights))
        fp32.eval()
        fp32_bytes = os.path.getsize(weights)
        modules = {"fp32": (torch.jit.script(fp32), fp32_bytes)}
        for mode in ("dynamic", "dynamic pt", "static", "qat"):
            path = f"{work}/{name}-{mode.replace(' ', '-')}.pt"
            modules[f"pstrain {mode}"] = (torch.jit.load(path).eval(), os.path.getsize(path))
        modules.update(peers(fp32, calib, train_x, train_y, test_x[:1], work, name))
        scripted = {k: m for k, (m, _) in modules.items()}
        b1 = latency_ms(scripted, test_x[:1], 300)
        b64 = latency_ms(scripted, test_x[:64], 40)
        rows = {}
        for variant, (m, size) in modules.items():
            rows[variant] = {"bytes": size, "size_vs_fp32": size / fp32_bytes, "batch1_ms": b1[variant],
                             "batch64_ms": b64[variant], "accuracy": accuracy(m, test_x, test_y)}
            r = rows[variant]
            print(f"{name:7} {variant:16} {size:9d} {r['size_vs_fp32']:6.1%} {r['batch1_ms']:8.3f} "
                  f"{r['batch64_ms']:8.3f} {r['accuracy']:9.4f}", file=sys.stderr)
        result["models"][name] = rows
    mlp = result["models"]["mlp"]
    drop = lambda v: max((m["fp32"]["accuracy"] - m[v]["accuracy"]) * 100 for m in result["models"].values())
    ratio = lambda a, b: mlp[a]["batch64_ms"] / mlp[b]["batch64_ms"]
    result["ratios"] = {
        "int8_size_vs_fp32": max(mlp["pstrain dynamic"]["size_vs_fp32"], mlp["pstrain static"]["size_vs_fp32"]),
        "dynamic_accuracy_drop": drop("pstrain dynamic"),  # points, the worse of the two models
        "static_accuracy_drop": drop("pstrain static"),
        "qat_accuracy_drop": drop("pstrain qat"),  # a QAT job of the same settings, converted
        "torch_qat_accuracy_drop": drop("torch qat"),
        # The MLP at batch 64: dynamic is the mode for a Linear-only model
        # (static is reported beside it). Against PyTorch, module for
        # module with the same weight scheme (pstrain's dynamic default is
        # per channel, PyTorch's per tensor: each against each), the worst.
        "int8_latency_vs_fp32": ratio("pstrain dynamic", "fp32"),
        "static_latency_vs_fp32": ratio("pstrain static", "fp32"),
        "int8_latency_vs_torch_int8": max(ratio("pstrain dynamic", "torch dynamic pc"),
                                          ratio("pstrain dynamic pt", "torch dynamic"),
                                          ratio("pstrain static", "torch static")),
        "dynamic_per_channel_vs_torch_per_tensor": ratio("pstrain dynamic", "torch dynamic"),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
