#!/usr/bin/env python3
"""PyTorch reference for gpukit's GPT (`trainer run --model gpt`): the same
architecture as nanoGPT's model.py (pre-LN blocks, causal self-attention
through F.scaled_dot_product_attention, 4x MLP with GELU, final LayerNorm,
lm_head tied to the token embedding), the same parameter names, the same
AdamW groups and schedule.

  gpt.py parity --init INIT --batches BATCHES [--dtype f32|bf16] [--device cuda|cpu]
      INIT: safetensors of initial weights (`trainer init --model gpt`);
      BATCHES: safetensors with i32 "x", "y" [steps, batch, block] and f32
      "lr" [steps], and the run's config as JSON in the metadata key
      "config" (what the trainer's parity test writes). Trains one step
      per batch with dropout 0 and prints {"step": s, "loss": l} per step
      (the loss of step s's batch before its update). f32 runs with TF32
      off; bf16 under torch.autocast(bfloat16).

  gpt.py eval --ckpt MODEL --batches BATCHES [--dtype f32|bf16]
      Builds nanoGPT's GPT from the checkpoint's config metadata, loads the
      checkpoint with load_state_dict(strict=True) and prints the mean
      loss over the batches: {"val_loss": l}.

  gpt.py bench [--layers 6 --heads 6 --d-model 384 --block 256 --batch 64 --vocab 65]
      Times one training step (forward, backward, AdamW; dropout 0) in
      bf16 autocast in three modes: eager, torch.compile, and
      torch.compile(mode="reduce-overhead") (CUDA graphs). Prints one JSON
      line per mode with the median step time in ms (CUDA events, after
      warm-up).

  gpt.py train --data FILE [--steps 5000 ...]
      nanoGPT's shakespeare-char recipe end to end with torch.compile: the
      character tokenizer, 90/10 split, random batches, eval of
      --eval-batches batches every --eval-every steps; prints eval lines and
      the end-to-end wall time (start-up and compilation included).

  gpt.py attention [--shape B,H,T,D[,noncausal] ...]
      Times bf16 SDPA forward and forward+backward (causal unless the shape
      ends in ",noncausal").

  torchrun --nproc-per-node N gpt.py ddp [--layers 12 --heads 12 --d-model 768 --block 1024
                                          --batch 16 --vocab 65 --mode compile --bucket-mb 25
                                          --optims adamw,zero]
      Data-parallel training throughput with DistributedDataParallel
      (NCCL, bucket_cap_mb --bucket-mb, gradient_as_bucket_view): the
      global batch of --batch sequences split over the ranks (--batch/N
      each, random tokens), bf16 autocast, dropout 0, no clipping. --mode:
      eager (DDP alone), compile (torch.compile of the DDP module;
      TorchDynamo's DDPOptimizer splits the graph at bucket boundaries so
      the all-reduces still overlap the backward) or reduce-overhead (the
      same with CUDA graphs; PyTorch's docs call DDP with CUDA graphs
      fragile: a failure is printed as {"error": ...}). --optims lists the
      optimizers timed one after the other on the same (compiled) DDP
      module: adamw (fused AdamW on every rank) and zero
      (torch.distributed.optim.ZeroRedundancyOptimizer over fused AdamW:
      ZeRO-1, each rank's AdamW holding its share of the parameters' state,
      the updated parameters broadcast from their owners). Rank 0 prints
      one JSON line per optimizer: tokens/s of the whole job and the step
      time (CUDA events around --iters steps after --warmup, median of
      --repeats), and rank 0's peak memory while that optimizer ran
      (torch.cuda.max_memory_allocated and max_memory_reserved, GiB).

Needs torch and safetensors (numpy for batches).
"""
import argparse
import gc
import json
import math
import os
import sys
import time

T0 = time.time()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["d_model"], 3 * c["d_model"], bias=c["bias"])
        self.c_proj = nn.Linear(c["d_model"], c["d_model"], bias=c["bias"])
        self.resid_dropout = nn.Dropout(c["dropout"])
        self.dropout = c["dropout"]  # nanoGPT's attn_dropout, inside SDPA (gpukit: inside its flash kernels)
        self.n_head = c["heads"]

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        h = self.n_head
        q = q.view(B, T, h, C // h).transpose(1, 2)
        k = k.view(B, T, h, C // h).transpose(1, 2)
        v = v.view(B, T, h, C // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["d_model"], 4 * c["d_model"], bias=c["bias"])
        self.gelu = nn.GELU(approximate="tanh" if c.get("gelu_tanh") else "none")
        self.c_proj = nn.Linear(4 * c["d_model"], c["d_model"], bias=c["bias"])
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["d_model"], c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["d_model"], c["bias"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT: parameter names transformer.wte/wpe/h.N.*/ln_f and
    lm_head (tied to wte)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab"], c["d_model"]),
            wpe=nn.Embedding(c["block"], c["d_model"]),
            drop=nn.Dropout(c["dropout"]),
            h=nn.ModuleList([Block(c) for _ in range(c["layers"])]),
            ln_f=LayerNorm(c["d_model"], c["bias"]),
        ))
        self.lm_head = nn.Linear(c["d_model"], c["vocab"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c["layers"]))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)


def optimizer(model, cfg, device):
    """nanoGPT's configure_optimizers: decay on params of rank >= 2."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    nodecay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": nodecay, "weight_decay": 0.0}]
    kw = dict(fused=True) if device == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=1e-8, **kw)


def get_lr(it, cfg):
    """nanoGPT's get_lr (and train.LMConfig.LRAt)."""
    if it < cfg["warmup"]:
        return cfg["lr"] * (it + 1) / (cfg["warmup"] + 1)
    if it > cfg["decay_steps"]:
        return cfg["min_lr"]
    span = cfg["decay_steps"] - cfg["warmup"]
    ratio = (it - cfg["warmup"]) / span if span > 0 else 0.0
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg["min_lr"] + coeff * (cfg["lr"] - cfg["min_lr"])


def model_config(cfg):
    g = dict(cfg["gpt"])
    g.setdefault("bias", False)
    g.setdefault("dropout", 0.0)
    return g


def load_batches(path):
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        t = {k: f.get_tensor(k) for k in f.keys()}
    return t, json.loads(meta["config"])


def autocast(dtype, device):
    if dtype == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    import contextlib
    return contextlib.nullcontext()


def cmd_parity(a):
    from safetensors.torch import load_file
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    b, cfg = load_batches(a.batches)
    c = model_config(cfg)
    c["dropout"] = 0.0
    model = GPT(c).to(a.device)
    sd = load_file(a.init)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        sys.exit(f"gpt.py: init mismatch: missing {missing}, unexpected {unexpected}")
    opt = optimizer(model, cfg, a.device)
    x, y, lrs = b["x"].long().to(a.device), b["y"].long().to(a.device), b["lr"]
    for s in range(x.shape[0]):
        for grp in opt.param_groups:
            grp["lr"] = float(lrs[s])
        with autocast(a.dtype, a.device):
            loss = model(x[s], y[s])
        loss.backward()
        if cfg.get("clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(json.dumps({"step": s + 1, "loss": loss.item()}), flush=True)


def cmd_eval(a):
    from safetensors import safe_open
    from safetensors.torch import load_file
    torch.backends.cuda.matmul.allow_tf32 = False
    with safe_open(a.ckpt, framework="pt") as f:
        meta = f.metadata()
    cfg = json.loads(meta["config"])
    c = model_config(cfg)
    c["dropout"] = 0.0
    model = GPT(c).to(a.device).eval()
    sd = {k: v for k, v in load_file(a.ckpt).items() if not k.startswith("optim/")}
    model.load_state_dict(sd, strict=True)
    b, _ = load_batches(a.batches)
    x, y = b["x"].long().to(a.device), b["y"].long().to(a.device)
    tot = 0.0
    with torch.no_grad():
        for s in range(x.shape[0]):
            with autocast(a.dtype, a.device):
                tot += model(x[s], y[s]).item()
    print(json.dumps({"val_loss": tot / x.shape[0], "batches": x.shape[0]}), flush=True)


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def cmd_bench(a):
    c = dict(vocab=a.vocab, layers=a.layers, heads=a.heads, d_model=a.d_model, block=a.block, bias=False, dropout=0.0)
    cfg = dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(0, a.vocab, (a.batch, a.block), device="cuda", generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.block), device="cuda", generator=g)
    for mode in a.modes.split(","):
        torch.manual_seed(1)
        model = GPT(c).cuda()
        opt = optimizer(model, cfg, "cuda")
        fwd = model
        if mode == "compile":
            fwd = torch.compile(model)
        elif mode == "reduce-overhead":
            fwd = torch.compile(model, mode="reduce-overhead")

        def step():
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = fwd(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        ms = timed(step, a.warmup, a.iters)
        print(json.dumps({"workload": "gpt-step", "impl": "torch-" + mode, "ms": ms, "batch": a.batch,
                          "block": a.block, "layers": a.layers, "d_model": a.d_model}), flush=True)


def cmd_attention(a):
    for shape in a.shape:
        parts = shape.split(",")
        B, H, T, D = (int(v) for v in parts[:4])
        causal = parts[4:] != ["noncausal"]
        g = torch.Generator(device="cuda").manual_seed(2)
        q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
        do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 10, 50)

        def fb():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.backward(do)
        both = timed(fb, 10, 50)
        flops = 4 * B * H * T * T * D / (2 if causal else 1)
        print(json.dumps({"workload": "attention", "impl": "torch-sdpa", "shape": [B, H, T, D], "causal": causal,
                          "fwd_ms": fwd, "fwd_bwd_ms": both, "fwd_tflops": flops / fwd / 1e9,
                          "bwd_tflops": 2.5 * flops / (both - fwd) / 1e9}), flush=True)


def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def cmd_ddp(a):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    if a.batch % world:
        sys.exit(f"gpt.py ddp: --batch {a.batch} does not divide by the world size {world}")
    if not set(a.optims.split(",")) <= {"adamw", "zero"}:
        sys.exit(f"gpt.py ddp: --optims {a.optims!r}: want adamw and/or zero")
    b = a.batch // world
    c = dict(vocab=a.vocab, layers=a.layers, heads=a.heads, d_model=a.d_model, block=a.block, bias=False, dropout=0.0)
    cfg = dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1)
    torch.manual_seed(1)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = GPT(c).cuda()
    ddp = DDP(model, device_ids=[local], bucket_cap_mb=a.bucket_mb, gradient_as_bucket_view=True)
    fwd = ddp
    if a.mode == "compile":
        fwd = torch.compile(ddp)
    elif a.mode == "reduce-overhead":
        fwd = torch.compile(ddp, mode="reduce-overhead")
    g = torch.Generator(device="cuda").manual_seed(100 + rank)
    x = torch.randint(0, a.vocab, (b, a.block), device="cuda", generator=g)
    y = torch.randint(0, a.vocab, (b, a.block), device="cuda", generator=g)

    for name in a.optims.split(","):
        if name == "adamw":
            opt = optimizer(model, cfg, "cuda")
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            params = [p for p in model.parameters() if p.requires_grad]
            opt = ZeroRedundancyOptimizer(
                [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg["weight_decay"]},
                 {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                optimizer_class=torch.optim.AdamW, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=1e-8, fused=True)

        def step(opt=opt):
            if a.mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = fwd(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay bucket views
            return loss

        impl = "torch-ddp-" + a.mode + ("-zero" if name == "zero" else "")
        line = {"workload": "gpt-dp", "impl": impl, "optim": name, "ranks": world, "batch": a.batch,
                "block": a.block, "layers": a.layers, "d_model": a.d_model, "bucket_mb": a.bucket_mb,
                "torch": torch.__version__, "nccl": nccl_version()}
        torch.cuda.reset_peak_memory_stats()
        try:
            for _ in range(a.warmup):
                step()
            ms = []
            for _ in range(a.repeats):
                dist.barrier()
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(a.iters):
                    step()
                e.record()
                e.synchronize()
                ms.append(s.elapsed_time(e) / a.iters)
            ms.sort()
            step_ms = ms[len(ms) // 2]
            line.update(step_ms=step_ms, tokens_per_s=a.batch * a.block / (step_ms / 1e3), repeats_ms=ms,
                        max_mem_alloc_GiB=torch.cuda.max_memory_allocated() / 2**30,
                        max_mem_reserved_GiB=torch.cuda.max_memory_reserved() / 2**30)
        except Exception as err:  # noqa: BLE001 - reported in the line; every rank fails alike
            line["error"] = f"{type(err).__name__}: {err}"[:500]
        if rank == 0:
            print(json.dumps(line), flush=True)
        del opt
        gc.collect()
        torch.cuda.empty_cache()
    dist.destroy_process_group()


def cmd_train(a):
    device = "cuda"
    text = open(a.data, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    import numpy as np
    ids = np.array([stoi[ch] for ch in text], dtype=np.int64)
    n = int(len(ids) * 0.9)
    train, val = torch.from_numpy(ids[:n]), torch.from_numpy(ids[n:])
    c = dict(vocab=len(chars), layers=a.layers, heads=a.heads, d_model=a.d_model, block=a.block, bias=False,
             dropout=a.dropout)
    cfg = dict(lr=a.lr, min_lr=a.min_lr, warmup=a.warmup, decay_steps=a.steps, beta1=0.9, beta2=a.beta2,
               weight_decay=0.1)
    torch.manual_seed(1337)
    model = GPT(c).to(device)
    opt = optimizer(model, cfg, device)
    cmodel = torch.compile(model)

    def batch(split):
        d = train if split == "train" else val
        ix = torch.randint(len(d) - a.block, (a.batch,))
        x = torch.stack([d[i:i + a.block] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + a.block] for i in ix])
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)

    def evaluate():
        model.eval()
        tot = torch.zeros((), device=device)
        with torch.no_grad():
            for _ in range(a.eval_batches):
                x, y = batch("val")
                with torch.autocast(device_type=device, dtype=torch.bfloat16):
                    tot += cmodel(x, y)
        model.train()
        return (tot / a.eval_batches).item()

    x, y = batch("train")
    for it in range(a.steps + 1):
        if it % a.eval_every == 0 or it == a.steps:
            print(json.dumps({"step": it, "val_loss": evaluate(), "elapsed_s": time.time() - T0}), flush=True)
        if it == a.steps:
            break
        for grp in opt.param_groups:
            grp["lr"] = get_lr(it, cfg)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = cmodel(x, y)
        x, y = batch("train")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(json.dumps({"workload": "gpt-train", "impl": "torch-compile", "wall_s": time.time() - T0}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("parity")
    q.add_argument("--init", required=True)
    q.add_argument("--batches", required=True)
    q.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    q.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    q.set_defaults(f=cmd_parity)
    q = sub.add_parser("eval")
    q.add_argument("--ckpt", required=True)
    q.add_argument("--batches", required=True)
    q.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    q.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    q.set_defaults(f=cmd_eval)
    q = sub.add_parser("bench")
    for k, v in dict(layers=6, heads=6, d_model=384, block=256, batch=64, vocab=65, warmup=15, iters=30).items():
        q.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    q.add_argument("--modes", default="eager,compile,reduce-overhead")
    q.set_defaults(f=cmd_bench)
    q = sub.add_parser("ddp")
    for k, v in dict(layers=12, heads=12, d_model=768, block=1024, batch=16, vocab=65, warmup=15, iters=20,
                     repeats=3).items():
        q.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    q.add_argument("--bucket-mb", type=float, default=25.0)
    q.add_argument("--mode", default="compile", choices=["eager", "compile", "reduce-overhead"])
    q.add_argument("--optims", default="adamw")
    q.set_defaults(f=cmd_ddp)
    q = sub.add_parser("attention")
    q.add_argument("--shape", action="append", default=None)
    q.set_defaults(f=cmd_attention)
    q = sub.add_parser("train")
    q.add_argument("--data", required=True)
    for k, v in dict(layers=6, heads=6, d_model=384, block=256, batch=64, steps=5000, warmup=100,
                     eval_every=250, eval_batches=200).items():
        q.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    for k, v in dict(lr=1e-3, min_lr=1e-4, dropout=0.2, beta2=0.99).items():
        q.add_argument("--" + k.replace("_", "-"), type=float, default=v)
    q.set_defaults(f=cmd_train)
    a = p.parse_args()
    if a.cmd == "attention" and not a.shape:
        a.shape = ["64,6,256,64", "8,16,2048,128"]
    a.f(a)


if __name__ == "__main__":
    main()
