#!/usr/bin/python3
"""Replays the fake quantization that tests/fake_quant_test recorded with
PyTorch's own FakeQuantize modules and checks every output, gradient,
observer min/max, scale and zero point bit for bit (torch.equal).

  check_fake_quant.py RECORD.pt

RECORD.pt maps "<case>/<step>/<field>" to tensors; <case> starts with the
kind: "act" (the onednn QAT activation fake quant), "wpt" (default weight
fake quant, per tensor) or "wpc" (per channel, axis 0).
"""
import sys

import torch
from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver
from torch.ao.quantization.fake_quantize import (default_per_channel_weight_fake_quant,
                                                 default_weight_fake_quant)


def make(case):
    kind = case.split("_")[0]
    if kind == "act":
        return FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
    if kind == "wpt":
        return default_weight_fake_quant()
    if kind == "wpc":
        return default_per_channel_weight_fake_quant()
    raise SystemExit(f"unknown case {case}")


def main():
    record = torch.load(sys.argv[1])
    cases = sorted({k.split("/")[0] for k in record})
    failures, checks = 0, 0
    for case in cases:
        fq = make(case)
        steps = sorted({int(k.split("/")[1]) for k in record if k.startswith(case + "/")})
        for step in steps:
            r = {k.split("/")[2]: v for k, v in record.items() if k.startswith(f"{case}/{step}/")}
            if r["observe"].item() == 1:
                fq.enable_observer()
            else:
                fq.disable_observer()
            x = r["in"].clone().requires_grad_(True)
            y = fq(x)
            (y * r["g"]).sum().backward()
            theirs = {"out": y.detach(), "grad": x.grad, "min_val": fq.activation_post_process.min_val,
                      "max_val": fq.activation_post_process.max_val, "scale": fq.scale,
                      "zero_point": fq.zero_point}
            for field, want in theirs.items():
                checks += 1
                got = r[field]
                if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
                    failures += 1
                    print(f"{case} step {step} {field}: pstrain {got.dtype} {list(got.shape)} "
                          f"{got.flatten()[:6].tolist()} vs PyTorch {want.dtype} {list(want.shape)} "
                          f"{want.flatten()[:6].tolist()}")
    print(f"{checks} tensors compared over {len(cases)} cases, {failures} differ")
    sys.exit(1 if failures or checks == 0 else 0)


if __name__ == "__main__":
    main()
