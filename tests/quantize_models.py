#!/usr/bin/python3
"""Fashion-MNIST models for the int8 export tests and bench.

  quantize_models.py train MODEL OUT_DIR [EPOCHS]
      trains mlp or lenet (seeded, Adam) and writes OUT_DIR/MODEL.pt (its
      state_dict, the names and format `pstrain export` writes) and
      OUT_DIR/calibration.pt ({"inputs": 256 training images}).
  quantize_models.py calibration OUT_DIR
      writes only OUT_DIR/calibration.pt.
  quantize_models.py score MODEL FP32_WEIGHTS MAX_DROP INT8_MODULE...
      scores the fp32 weights (rebuilt as in tests/eval_exported.py) and each
      module (torch.jit.load) on the 10,000 test images; prints one JSON line
      and exits 1 when a module scores more than MAX_DROP points below fp32.
"""
import json
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from eval_exported import DATA, LeNet, Mlp, read_idx  # noqa: E402


def images(split):
    prefix = "train" if split == "train" else "t10k"
    x = torch.from_numpy(read_idx(f"{DATA}/{prefix}-images-idx3-ubyte.gz").copy()).float()
    y = torch.from_numpy(read_idx(f"{DATA}/{prefix}-labels-idx1-ubyte.gz").copy()).long()
    return ((x / 255.0 - 0.2860) / 0.3530).unsqueeze(1), y


def accuracy(model, x, y):
    with torch.no_grad():
        return sum((model(x[i:i + 500]).argmax(1) == y[i:i + 500]).sum().item() for i in range(0, len(x), 500)) / len(x)


def train(name, out_dir, epochs):
    torch.manual_seed(36)
    torch.set_num_threads(1)
    model = LeNet() if name == "lenet" else Mlp()
    x, y = images("train")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        perm = torch.randperm(len(x))
        for i in range(0, len(x), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    # A plain dict, as `pstrain export` writes (LibTorch 1.13 cannot unpickle
    # the OrderedDict of state_dict()).
    torch.save(dict(model.state_dict()), f"{out_dir}/{name}.pt")
    calibration(out_dir, x, y)


def calibration(out_dir, x, y):
    # Two entries: LibTorch 1.13 cannot unpickle the SETITEM of a one-item dict.
    torch.save({"inputs": x[:256].clone(), "labels": y[:256].clone()}, f"{out_dir}/calibration.pt")


def score(name, weights, max_drop, modules):
    x, y = images("test")
    model = LeNet() if name == "lenet" else Mlp()
    model.load_state_dict(torch.load(weights))
    model.eval()
    result = {"fp32": accuracy(model, x, y)}
    worst = 0.0
    for path in modules:
        m = torch.jit.load(path)
        m.eval()
        result[path] = accuracy(m, x, y)
        worst = max(worst, (result["fp32"] - result[path]) * 100)
    result["worst_drop_points"] = worst
    print(json.dumps(result))
    sys.exit(1 if worst > max_drop else 0)


def main():
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    elif sys.argv[1] == "calibration":
        calibration(sys.argv[2], *images("train"))
    elif sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
