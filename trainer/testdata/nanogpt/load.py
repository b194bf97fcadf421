#!/usr/bin/env python3
"""Load a gpukit GPT checkpoint into nanoGPT's own GPT module, strictly.

usage: load.py --ckpt MODEL.safetensors --batches VAL.safetensors [--device cuda]

Builds nanoGPT's GPT (model.py beside this file) from the checkpoint's
metadata "config", loads the file with load_state_dict(strict=True) (every
tensor of the file is a key of the module's state dict and every key is in the
file), and prints one JSON line {"val_loss": L, "batches": N, "tensors": T}:
the mean of the module's loss over the batches x, y [N, B, T] that
`trainer eval --batches-out` wrote. Exits 1 with the reason on stderr when the
load is not strict.
"""
import argparse
import contextlib
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT, GPTConfig  # noqa: E402  (nanoGPT's model.py)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--batches", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with safe_open(a.ckpt, framework="pt") as f:
        meta = f.metadata() or {}
    g = json.loads(meta["config"])["gpt"]
    if g.get("gelu_tanh"):
        sys.exit("load.py: the checkpoint uses tanh GELU; nanoGPT's MLP is nn.GELU() (erf)")
    conf = GPTConfig(block_size=g["block"], vocab_size=g["vocab"], n_layer=g["layers"], n_head=g["heads"],
                     n_embd=g["d_model"], dropout=0.0, bias=bool(g.get("bias", False)))
    with contextlib.redirect_stdout(sys.stderr):  # GPT() prints its parameter count
        model = GPT(conf)
    sd = load_file(a.ckpt)
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        sys.exit(f"load.py: load_state_dict(strict=True): {e}")
    model = model.to(a.device).eval()
    with safe_open(a.batches, framework="pt") as f:
        x, y = f.get_tensor("x").long().to(a.device), f.get_tensor("y").long().to(a.device)
    tot = 0.0
    with torch.no_grad():
        for s in range(x.shape[0]):
            _, loss = model(x[s], y[s])
            tot += loss.item()
    print(json.dumps({"val_loss": tot / x.shape[0], "batches": x.shape[0], "tensors": len(sd)}), flush=True)


if __name__ == "__main__":
    main()
