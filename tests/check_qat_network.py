#!/usr/bin/python3
"""Replays the QAT training steps tests/qat_network_test recorded through
PyTorch's own QAT model: the built-in model rebuilt in Python from the
recorded initial parameters, prepared by prepare_qat_fx with the onednn
default QAT qconfig (version 0: FakeQuantize modules), then the same steps
(forward, cross entropy, backward, p += -0.05 * grad). Every step's logits,
gradients and every quantizer's min/max, scale and zero point must be equal
bit for bit (torch.equal).

  check_qat_network.py RECORD.pt mlp|lenet
"""
import sys

import torch
import torch.nn.functional as F
from torch.ao.quantization import QConfigMapping, disable_observer, get_default_qat_qconfig
from torch.ao.quantization.quantize_fx import prepare_qat_fx

from eval_exported import LeNet, Mlp

FIELDS = ("min_val", "max_val", "scale", "zero_point")


def main():
    record, name = torch.load(sys.argv[1]), sys.argv[2]
    model = LeNet() if name == "lenet" else Mlp()
    model.load_state_dict({k[5:]: v for k, v in record.items() if k.startswith("init/")})
    qconfig = get_default_qat_qconfig("onednn", version=0)
    net = prepare_qat_fx(model.train(), QConfigMapping().set_global(qconfig), (torch.zeros(1, 1, 28, 28),))
    acts = []
    for i in range(64):
        m = getattr(net, f"activation_post_process_{i}", None)
        if m is not None and all(m is not a for a in acts):
            acts.append(m)
    layers = ["conv1", "conv2", "fc1", "fc2", "fc3"] if name == "lenet" else ["fc1", "fc2", "fc3"]
    act_names = ["input"] + [n for l in layers for n in ((l + ".flatten",) if name == "lenet" and l == "fc1" else ())
                             + (l + ".out",)]
    assert len(acts) == len(act_names), (len(acts), act_names)
    quantizers = dict(zip(act_names, acts))
    quantizers.update({l + ".weight_fq": getattr(net, l).weight_fake_quant for l in layers})
    params = dict(net.named_parameters())
    steps = sorted({int(k.split("/")[1]) for k in record if k.startswith("step/")})
    checks = failures = 0

    def check(what, got, want):
        nonlocal checks, failures
        checks += 1
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            failures += 1
            diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "shape"
            print(f"{what}: pstrain {got.dtype} {list(got.shape)} vs PyTorch {want.dtype} {list(want.shape)}; "
                  f"max diff {diff}")

    for k in steps:
        r = {key[len(f"step/{k}/"):]: v for key, v in record.items() if key.startswith(f"step/{k}/")}
        if r["observe"].item() == 0:
            net.apply(disable_observer)
        out = net(r["x"])
        F.cross_entropy(out, r["y"]).backward()
        check(f"step {k} logits", r["out"], out.detach())
        for pname, p in params.items():
            check(f"step {k} grad {pname}", r[f"grad/{pname}"], p.grad)
        for qname, q in quantizers.items():
            theirs = {"min_val": q.activation_post_process.min_val, "max_val": q.activation_post_process.max_val,
                      "scale": q.scale, "zero_point": q.zero_point}
            for f in FIELDS:
                check(f"step {k} {qname}.{f}", r[f"{qname}.{f}"], theirs[f])
        with torch.no_grad():
            for p in params.values():
                p.add_(p.grad, alpha=-0.05)
                p.grad.zero_()
    print(f"{name}: {checks} tensors compared over {len(steps)} steps, {failures} differ")
    sys.exit(1 if failures or checks == 0 else 0)


if __name__ == "__main__":
    main()
