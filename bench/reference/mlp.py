#!/usr/bin/env python3
"""PyTorch reference for gpukit's trainer: the same MLP, the same initial
weights, the same batches in the same order, and the same update rule.

  mlp.py train --init INIT --batches BATCHES --data DIR [--steps N]
               [--precision f32|tf32|bf16] [--out MODEL] [--device cuda|cpu]
      INIT is a safetensors file written by `trainer init` (fc<i>.weight,
      fc<i>.bias); BATCHES is the file `trainer run --batches-out` writes
      (i32 "indices" [steps, batch] and the run's config in its metadata:
      widths, act, optim, lr, weight_decay, momentum, clip). Prints one JSON
      line per step, {"step": s, "loss": l}, the loss of step s's batch
      before its update, as `trainer run --log-every 1` does; --out writes
      the trained parameters as safetensors.

  mlp.py eval --ckpt MODEL --data DIR [--act relu|gelu] [--device cuda|cpu]
      Loads fc<i>.weight/bias from MODEL (written by trainer or by this
      script), classifies the Fashion-MNIST test set and prints
      {"test_accuracy": a, "correct": c, "examples": n}.

The pixels are normalised exactly as libgpu/data does it, in float32:
(p/255 - 0.2860)/0.3530. Needs torch, numpy and safetensors.
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

MEAN = np.float32(0.2860)
STD = np.float32(0.3530)


def read_idx(path):
    """Reads an IDX file (gzip'd or not): returns a uint8 array of its dims."""
    for p in (path + ".gz", path):
        if os.path.exists(p):
            break
    else:
        sys.exit(f"mlp.py: {path}(.gz) not found")
    opener = gzip.open if p.endswith(".gz") else open
    with opener(p, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">I", raw[:4])
    nd = magic & 0xFF
    dims = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def load_split(data, prefix):
    img = read_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte"))
    lab = read_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte"))
    return img.reshape(img.shape[0], -1), lab


def normalise(img):
    """(p/255 - MEAN)/STD in float32, as libgpu/data.Set.Normalize."""
    x = img.astype(np.float32) / np.float32(255)
    return (x - MEAN) / STD


class MLP(torch.nn.Module):
    """fc0 … fc<L-1> (nn.Linear, PyTorch layout [out, in]) with act between."""

    def __init__(self, widths, act):
        super().__init__()
        self.n = len(widths) - 1
        for i in range(self.n):
            setattr(self, f"fc{i}", torch.nn.Linear(widths[i], widths[i + 1]))
        self.act = torch.relu if act == "relu" else (lambda z: F.gelu(z, approximate="tanh"))

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, f"fc{i}")(x)
            if i < self.n - 1:
                x = self.act(x)
        return x


def widths_of(state):
    ws, i = [], 0
    while f"fc{i}.weight" in state:
        w = state[f"fc{i}.weight"]
        if i == 0:
            ws.append(w.shape[1])
        ws.append(w.shape[0])
        i += 1
    if len(ws) < 2:
        sys.exit("mlp.py: no fc0.weight in the checkpoint")
    return ws


def build(path, act, device):
    state = {k: v for k, v in load_file(path).items() if k.startswith("fc")}
    model = MLP(widths_of(state), act).to(device)
    model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()})
    return model


def set_precision(p):
    torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
    torch.backends.cudnn.allow_tf32 = p == "tf32"


def train(a):
    with safe_open(a.batches, "pt") as f:
        cfg = json.loads(f.metadata()["config"])
        idx = f.get_tensor("indices").numpy()
    if a.steps:
        idx = idx[: a.steps]
    dev = torch.device(a.device)
    set_precision(a.precision)
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = build(a.init, cfg["act"], dev)
    if widths_of(model.state_dict()) != cfg["widths"]:
        sys.exit(f"mlp.py: {a.init} has widths {widths_of(model.state_dict())}, the run {cfg['widths']}")
    if a.perturb:
        # The twin of a parity test: every initial weight times 1 ± EPS
        # (signs from a fixed seed), the same model otherwise, to measure
        # how far training amplifies a rounding-sized difference.
        g = torch.Generator(device="cpu").manual_seed(12345)
        with torch.no_grad():
            for p in model.parameters():
                u = torch.randint(0, 2, p.shape, generator=g).to(p) * 2 - 1
                p.mul_(1 + a.perturb * u)
    params = list(model.parameters())
    if cfg["optim"] == "adamw":
        opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=cfg["weight_decay"])
    else:
        opt = torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg["momentum"],
                              weight_decay=cfg["weight_decay"])
    clip = cfg.get("clip", 0) or 0
    img, lab = load_split(a.data, "train")
    for s, rows in enumerate(idx, 1):
        x = torch.from_numpy(normalise(img[rows])).to(dev)
        y = torch.from_numpy(lab[rows].astype(np.int64)).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        print(json.dumps({"step": s, "loss": loss.item()}), flush=True)
    if a.out:
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, a.out)


@torch.no_grad()
def evaluate(a):
    dev = torch.device(a.device)
    set_precision(a.precision)
    model = build(a.ckpt, a.act, dev)
    img, lab = load_split(a.data, "t10k")
    correct = 0
    for lo in range(0, len(lab), a.batch):
        x = torch.from_numpy(normalise(img[lo:lo + a.batch])).to(dev)
        pred = model(x).argmax(dim=1).cpu().numpy()
        correct += int((pred == lab[lo:lo + a.batch]).sum())
    print(json.dumps({"test_accuracy": correct / len(lab), "correct": correct, "examples": len(lab)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    default_data = os.environ.get("GPUKIT_DATA_DIR", "/usr/share/datasets/fashion-mnist")
    default_dev = "cuda" if torch.cuda.is_available() else "cpu"
    t = sub.add_parser("train")
    t.add_argument("--init", required=True)
    t.add_argument("--batches", required=True)
    t.add_argument("--data", default=default_data)
    t.add_argument("--steps", type=int, default=0, help="train only the first N steps (0: all)")
    t.add_argument("--precision", default="f32", choices=["f32", "tf32", "bf16"])
    t.add_argument("--out", default="")
    t.add_argument("--perturb", type=float, default=0.0,
                   help="multiply each initial weight by 1 ± EPS (a twin run measuring the training's amplification of rounding)")
    t.add_argument("--device", default=default_dev)
    e = sub.add_parser("eval")
    e.add_argument("--ckpt", required=True)
    e.add_argument("--data", default=default_data)
    e.add_argument("--act", default="relu", choices=["relu", "gelu"])
    e.add_argument("--batch", type=int, default=500)
    e.add_argument("--precision", default="f32", choices=["f32", "tf32", "bf16"])
    e.add_argument("--device", default=default_dev)
    a = ap.parse_args()
    train(a) if a.cmd == "train" else evaluate(a)


if __name__ == "__main__":
    main()
