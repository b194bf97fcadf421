#!/usr/bin/env python3
"""PyTorch reference for gpukit's diffusion U-Net (`trainer run --model unet`,
`sampler`): the same modules and state-dict names as libgpu/nn/unet.go, the
same noise schedules, sampler updates (DDPM, DDIM with eta, DPM-Solver++(2M),
classifier-free guidance, trailing timesteps) and the same counter-based noise
(Philox4x32-10 with the Box-Muller transform), so it draws the same images
from the same checkpoint, seed and settings.

  unet.py compare --ckpt MODEL --samples SAMPLES [--dtype f32|bf16] [--raw-weights]
      SAMPLES: the file `sampler sample --save` writes (samples, labels, and in
      its metadata the plan, seed and batch). Samples the same images here and
      prints {"rel_err", "max_abs", "n"} against gpukit's. f32 runs with TF32
      off; bf16 under torch.autocast(bfloat16), as sampler --precision bf16.

  unet.py bench [--batch 256 --steps 20 --modes eager,graph,compile]
      One guided DPM-Solver++ step at --batch (2·batch through the U-Net, bf16:
      the model evaluation and the update), timed in three modes: eager, a
      CUDA graph of the step (torch.cuda.CUDAGraph), and torch.compile
      (mode="max-autotune-no-cudagraphs" off: the default mode) of the step.
      Prints one JSON line per mode: ms per step (median, CUDA events) and
      images/s of a --steps-step run.

  unet.py video [--steps 4 --batch 1 --config C --residual-guidance G --modes eager,graph,compile]
      Video frame latency: re-noise the previous frame to strength 0.5, then
      --steps guided steps with temporal blending (classifier-free guidance
      at 3, or R-CFG at G: one U-Net pass a step); one JSON line per mode
      (ms per frame).

  unet.py train-bench [--batch 128 --modes eager,compile]
      One training step (q_sample, forward, MSE, backward, AdamW, EMA) in bf16
      autocast; one JSON line per mode.

Conv weights are [Cout, Cin, KH, KW] in the checkpoint (gpukit computes with
[Cout, KH, KW, Cin] and converts when it writes checkpoints); images are
NHWC in gpukit's files and NCHW here. Needs torch, numpy and safetensors.
"""
import argparse
import json
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- the model ----


class ResBlock(nn.Module):
    def __init__(self, cin, cout, emb, groups, dropout=0.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=1e-5)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=1e-5)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, emb_act):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb(emb_act)[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (self.skip(x) if self.skip is not None else x) + h


class Attention(nn.Module):
    def __init__(self, c, groups, heads):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(groups, c, eps=1e-5)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        B, C, H, W = x.shape
        a = self.norm(x).permute(0, 2, 3, 1).reshape(B, H * W, C)
        q, k, v = self.qkv(a).split(C, dim=-1)  # q, k, v side by side, heads within (gpukit's SelfAttention)
        q, k, v = (t.view(B, H * W, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, H * W, C)
        return x + self.proj(a).view(B, H, W, C).permute(0, 3, 1, 2)


class Level(nn.Module):
    def __init__(self, cin, cout, emb, groups, heads, attn, dropout):
        super().__init__()
        self.res = ResBlock(cin, cout, emb, groups, dropout)
        self.attn = Attention(cout, groups, heads) if attn else None


class Mid(nn.Module):
    def __init__(self, c, emb, groups, heads, dropout):
        super().__init__()
        self.res1 = ResBlock(c, c, emb, groups, dropout)
        self.attn = Attention(c, groups, heads)
        self.res2 = ResBlock(c, c, emb, groups, dropout)


class Up(nn.Module):
    def __init__(self, cin, cout, emb, groups, dropout):
        super().__init__()
        self.res = ResBlock(cin, cout, emb, groups, dropout)


def timestep_embedding(t, dim, max_period=10000.0):
    """guided-diffusion's timestep_embedding, [cos | sin], in f32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class UNet(nn.Module):
    """libgpu/nn/unet.go's U-Net (see UNetConfig there)."""

    def __init__(self, channels=(64, 128, 256), in_channels=1, size=32, classes=10, groups=32, heads=4, dropout=0.0):
        super().__init__()
        C0, L, E = channels[0], len(channels), 4 * channels[0]
        self.c0, self.classes = C0, classes
        self.time_embed = nn.Sequential(nn.Linear(C0, E), nn.SiLU(), nn.Linear(E, E))
        self.class_embed = nn.Embedding(classes + 1, E)
        self.conv_in = nn.Conv2d(in_channels, C0, 3, padding=1)
        self.down = nn.ModuleList()
        prev = C0
        for l, c in enumerate(channels):
            self.down.append(Level(prev, c, E, groups, heads, l == L - 1, dropout))
            prev = c
        self.mid = Mid(prev, E, groups, heads, dropout)
        self.up = nn.ModuleList()
        for l in range(L - 2, -1, -1):
            self.up.append(Up(prev + channels[l], channels[l], E, groups, dropout))
            prev = channels[l]
        self.out_norm = nn.GroupNorm(groups, C0, eps=1e-5)
        self.out_conv = nn.Conv2d(C0, in_channels, 3, padding=1)

    def forward(self, x, t, y):
        emb = self.time_embed(timestep_embedding(t, self.c0))
        emb = emb + self.class_embed(y)
        ea = F.silu(emb)
        h = self.conv_in(x)
        skips = []
        for l, lv in enumerate(self.down):
            h = lv.res(h, ea)
            if lv.attn is not None:
                h = lv.attn(h)
            else:
                skips.append(h)
                h = F.avg_pool2d(h, 2)
        h = self.mid.res2(self.mid.attn(self.mid.res1(h, ea)), ea)
        for up in self.up:
            h = torch.cat([F.interpolate(h, scale_factor=2, mode="nearest"), skips.pop()], dim=1)
            h = up.res(h, ea)
        return self.out_conv(F.silu(self.out_norm(h)))


def build(cfg):
    u = cfg["unet"]
    return UNet(tuple(u["channels"]), u["in_channels"], u["size"], u["classes"], u["groups"], u["heads"], u.get("dropout", 0.0))


def load(path, raw=False, device="cuda"):
    """The model of a gpukit checkpoint, with its EMA weights (or raw ones).

    The trainer's model.safetensors holds the EMA under the state-dict names
    (metadata weights=ema); its state.safetensors adds the raw weights under
    raw/. Earlier files held the raw weights under the plain names and the
    EMA under ema/."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        names = list(f.keys())
        cfg = json.loads(meta["config"])
        if meta.get("weights") == "ema":
            if raw and not any(n.startswith("raw/") for n in names):
                raise SystemExit(f"{path} holds the EMA only; the raw weights are in the run's state.safetensors")
            prefix = "raw/" if raw else ""
        else:
            prefix = "ema/" if not raw and any(n.startswith("ema/") for n in names) else ""
        others = ("optim/", "ema/", "raw/")
        sd = {n[len(prefix):]: f.get_tensor(n) for n in names
              if n.startswith(prefix) and not any(n.startswith(o) for o in others if o != prefix)}
    m = build(cfg)
    m.load_state_dict(sd, strict=True)
    return m.to(device).eval(), cfg, meta


# ---- schedules, plans, noise ----


def schedule(kind, T):
    """ᾱ_t (float64) of libgpu/diffusion's linear and cosine schedules."""
    if kind == "linear":
        scale = 1000 / T
        b0, b1 = scale * 1e-4, scale * 0.02
        betas = np.array([b0 + (b1 - b0) * i / (T - 1) if T > 1 else b0 for i in range(T)])
    elif kind == "cosine":
        f = lambda t: math.cos((t / T + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
        betas = np.array([min(1 - f(i + 1) / f(i), 0.999) for i in range(T)])
    else:
        raise ValueError(kind)
    return np.cumprod(1 - betas)


def timesteps(tmax, n):
    return [int(round(tmax - i * tmax / n)) - 1 for i in range(n)]


# Row fields (ops.Coef*).
A, S, CX, CX0, CEPS, CD, SIGMA, G, TNEXT, BLEND, CLIP, RESID = range(12)


def plan(ab, scheduler, steps, eta=0.0, guidance=1.0, clip=True, strength=1.0, blend=0.0, residual=False):
    """libgpu/diffusion.NewPlan: rows of 12 coefficients, row 0 the start;
    residual: R-CFG (ops.CoefResidual) at every step."""
    T = len(ab)
    ts = timesteps(int(round(strength * T)), steps)
    abar = lambda i: 1.0 if i >= len(ts) else ab[ts[i]]  # noqa: E731
    lam = lambda v: 0.5 * math.log(v / (1 - v))  # noqa: E731
    rows = np.zeros((len(ts) + 1, 12))
    rows[0, S] = 1
    if strength < 1:
        rows[0, A], rows[0, S] = math.sqrt(abar(0)), math.sqrt(1 - abar(0))
    rows[0, TNEXT] = ts[0]
    for i in range(len(ts)):
        r = rows[i + 1]
        a, an = abar(i), abar(i + 1)
        Aa, Ss, An, Sn = math.sqrt(a), math.sqrt(1 - a), math.sqrt(an), math.sqrt(1 - an)
        r[A], r[S], r[G], r[CLIP], r[BLEND] = Aa, Ss, guidance, 1 if clip else 0, blend
        r[TNEXT] = ts[i + 1] if i + 1 < len(ts) else ts[i]
        r[RESID] = 1 if residual else 0
        if scheduler == "ddpm":
            bp = 1 - a / an
            r[CX0] = math.sqrt(an) * bp / (1 - a)
            r[CX] = math.sqrt(a / an) * (1 - an) / (1 - a)
            r[SIGMA] = math.sqrt(max(0.0, bp * (1 - an) / (1 - a)))
        elif scheduler == "ddim":
            sigma = eta * math.sqrt((1 - an) / (1 - a)) * math.sqrt(max(0.0, 1 - a / an))
            r[CX0], r[CEPS], r[SIGMA] = An, math.sqrt(max(0.0, 1 - an - sigma * sigma)), sigma
        elif scheduler == "dpmsolver++":
            w = An - Sn * Aa / Ss
            r[CX], r[CX0] = Sn / Ss, w
            if i > 0 and i + 1 < len(ts):
                h = lam(an) - lam(a)
                k = 1 / (2 * (lam(a) - lam(abar(i - 1))) / h)
                r[CX0], r[CD] = w * (1 + k), -w * k
        else:
            raise ValueError(scheduler)
    return ts, rows.astype(np.float32)


M32 = 0xFFFFFFFF


def normals(seed, stream, step, n):
    """ops.NormalAt for elements [0, n): Philox4x32-10 at counter (q, stream,
    step) under key seed, Box-Muller on words (0,1) and (2,3)."""
    q = np.arange((n + 3) // 4, dtype=np.uint64)
    c0, c1 = q & M32, q >> np.uint64(32)
    c2 = np.full_like(q, stream & M32)
    c3 = np.full_like(q, step & M32)
    k0, k1 = np.uint64(seed & M32), np.uint64((seed >> 32) & M32)
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(0x9E3779B9)) & np.uint64(M32)
            k1 = (k1 + np.uint64(0xBB67AE85)) & np.uint64(M32)
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(M32)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(M32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    z = np.empty((len(q), 4))
    for k, (ra, rb) in enumerate(((c0, c1), (c2, c3))):
        u1 = ((ra >> np.uint64(8)) + np.uint64(1)).astype(np.float64) / 16777216.0
        u2 = (rb >> np.uint64(8)).astype(np.float64) / 16777216.0
        rad = np.sqrt(-2 * np.log(u1))
        z[:, 2 * k] = rad * np.cos(2 * np.pi * u2)
        z[:, 2 * k + 1] = rad * np.sin(2 * np.pi * u2)
    return z.reshape(-1)[:n].astype(np.float32)


def step_update(row, x, eps, d, prev, z, passes):
    """ops.DiffusionStep's update in f32 (x, d, prev, z: [n]; eps: [passes·n]);
    row: the step's f32 coefficients as Python floats (no device sync, so
    the update can be captured in a CUDA graph)."""
    row = [float(v) for v in row]
    n = x.numel()
    e = eps[:n]
    if passes == 2:
        u = eps[n:]
        e = u + row[G] * (e - u)
    elif prev is not None and row[RESID] != 0:
        u = (x - row[A] * prev) / row[S]  # R-CFG's residual noise (ops.CoefResidual)
        e = u + row[G] * (e - u)
    x0 = (x - row[S] * e) / row[A]
    if row[CLIP] != 0:
        x0 = x0.clamp(-1, 1)
    if prev is not None and row[BLEND] != 0:
        x0 = (1 - row[BLEND]) * x0 + row[BLEND] * prev
    out = row[CX] * x + row[CX0] * x0 + row[SIGMA] * z
    if row[CEPS] != 0:
        out = out + row[CEPS] * ((x - row[A] * x0) / row[S])
    if d is not None and row[CD] != 0:
        out = out + row[CD] * d
    return out, x0


def sample(model, cfg, rows, labels, seed, run, passes, dtype, device, prev=None):
    """One sampling run as libgpu/diffusion.Sampler runs it: images f32
    [N, S, S, C] (NHWC) in [-1, 1]."""
    u = cfg["unet"]
    N, Sz, Cc = len(labels), u["size"], u["in_channels"]
    n = N * Sz * Sz * Cc
    r0 = [float(v) for v in rows[0]]
    x = r0[S] * torch.tensor(normals(seed, 0, run, n), device=device)
    if prev is not None:
        x = x + r0[A] * prev
    d = torch.zeros(n, device=device)
    y = torch.tensor(labels, device=device, dtype=torch.long)
    if passes == 2:
        y = torch.cat([y, torch.full_like(y, u["classes"])])
    t = int(rows[0][TNEXT])
    ctx = torch.autocast(device_type=device, dtype=torch.bfloat16) if dtype == "bf16" else torch.no_grad()
    with torch.no_grad(), ctx:
        for i in range(1, len(rows)):
            xin = x.view(N, Sz, Sz, Cc).permute(0, 3, 1, 2)
            if passes == 2:
                xin = torch.cat([xin, xin])
            if dtype == "bf16":
                xin = xin.to(torch.bfloat16)  # gpukit's model input buffer is bf16
            tt = torch.full((passes * N,), t, device=device, dtype=torch.long)
            eps = model(xin, tt, y).float().permute(0, 2, 3, 1).reshape(-1)
            z = torch.tensor(normals(seed, i, run, n), device=device)
            x, x0 = step_update(rows[i], x, eps, d, prev, z, passes)
            d = x0
            t = int(rows[i][TNEXT])
    return x.view(N, Sz, Sz, Cc)


# ---- commands ----


def cmd_compare(a):
    from safetensors import safe_open
    if a.dtype == "f32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model, cfg, _ = load(a.ckpt, a.raw_weights, a.device)
    with safe_open(a.samples, framework="pt") as f:
        meta = f.metadata()
        ours = f.get_tensor("samples").to(a.device)
        labels = f.get_tensor("labels").tolist()
    p = json.loads(meta["plan"])
    seed, batch = int(meta["seed"]), int(meta["batch"])
    ab = schedule(cfg["schedule"], cfg["timesteps"])
    _, rows = plan(ab, p["scheduler"], p["steps"], p["eta"], p["guidance_scale"], p["clip"])
    passes = 1 if p["guidance_scale"] == 1 else 2
    out = []
    for b, i0 in enumerate(range(0, len(labels), batch)):
        lab = labels[i0:i0 + batch]
        lab = lab + [0] * (min(batch, len(labels)) - len(lab))  # gpukit pads the last run with class 0
        out.append(sample(model, cfg, rows, lab, seed, b, passes, a.dtype, a.device)[: len(labels) - i0])
    theirs = torch.cat(out)
    diff = (theirs - ours).float()
    rel = (diff.norm() / ours.float().norm().clamp_min(1e-30)).item()
    print(json.dumps({"rel_err": rel, "max_abs": diff.abs().max().item(), "n": len(labels), "dtype": a.dtype}), flush=True)


def timed(fn, warmup=5, iters=30):
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


def default_model():
    torch.manual_seed(1)
    return UNet().cuda().eval()


def guided_step_fn(model, B, rows, i, x, d, y, t, z):
    """One guided DPM-Solver++ step on static tensors (graph-capturable)."""
    def step():
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            xin = x.view(B, 1, 32, 32)
            eps = model(torch.cat([xin, xin]), t, y).float().reshape(-1)
        xn, x0 = step_update(rows[i], x, eps, d, None, z, 2)
        x.copy_(xn)
        d.copy_(x0)
    return step


def run_modes(modes, make, label, extra):
    for mode in modes.split(","):
        step = make()
        if mode == "compile":
            step = torch.compile(step)
        if mode == "graph":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            fn = g.replay
        else:
            fn = step
        ms = timed(fn)
        print(json.dumps(dict({"workload": label, "impl": "torch-" + mode, "ms": ms}, **extra(ms))), flush=True)


def cmd_bench(a):
    model = default_model()
    B = a.batch
    ab = schedule("linear", 1000)
    _, rows = plan(ab, "dpmsolver++", a.steps, guidance=3.0)

    def make():
        x = torch.randn(B * 1024, device="cuda")
        d = torch.zeros_like(x)
        z = torch.randn_like(x)
        y = torch.cat([torch.arange(B, device="cuda") % 10, torch.full((B,), 10, device="cuda")])
        t = torch.full((2 * B,), 500, device="cuda")
        return guided_step_fn(model, B, rows, 2, x, d, y, t, z)

    run_modes(a.modes, make, "unet-guided-step", lambda ms: {"batch": B, "images_per_s": B / (ms * a.steps / 1000),
                                                             "steps": a.steps})


def cmd_video(a):
    """A video frame (re-noise to 0.5, a.steps guided steps with blending)
    of the default U-Net, or with --config of a U-Net of random weights at
    that model configuration (a checkpoint's JSON, as `sampler video
    --random-init` takes it); --batch B streams in one batch, as `sampler
    video --streams B`; --residual-guidance G guides by R-CFG at scale G
    (one U-Net pass of B images a step), as `sampler video
    --residual-guidance G`, else by classifier-free guidance at 3 (2B)."""
    if a.config:
        torch.manual_seed(1)
        with open(a.config) as f:
            model = build(json.load(f)).cuda().eval()
        with open(a.config) as f:
            u = json.load(f)["unet"]
        C, side = u["in_channels"], u["size"]
    else:
        model, C, side = default_model(), 1, 32
    n, B = C * side * side, a.batch
    ab = schedule("linear", 1000)
    resid = a.residual_guidance > 0
    _, rows = plan(ab, "dpmsolver++", a.steps, guidance=a.residual_guidance if resid else 3.0, strength=0.5, blend=0.2,
                   residual=resid)
    r0 = [float(v) for v in rows[0]]
    passes = 1 if resid else 2

    def make():
        prev = torch.rand(B * n, device="cuda") * 2 - 1
        x = torch.zeros(B * n, device="cuda")
        d = torch.zeros_like(x)
        zs = [torch.randn(B * n, device="cuda") for _ in rows]
        y = torch.tensor([3] * B + [10] * B * (passes - 1), device="cuda")
        ts = [torch.full((passes * B,), int(r[TNEXT]), device="cuda") for r in rows]

        def frame():
            with torch.no_grad():
                x.copy_(r0[S] * zs[0] + r0[A] * prev)
                for i in range(1, len(rows)):
                    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                        xin = x.view(B, C, side, side)
                        if passes == 2:
                            xin = torch.cat([xin, xin])
                        eps = model(xin, ts[i - 1], y).float().reshape(-1)
                    xn, x0 = step_update(rows[i], x, eps, d, prev, zs[i], passes)
                    x.copy_(xn)
                    d.copy_(x0)
                prev.copy_(x)
        return frame

    params = sum(p.numel() for p in model.parameters())
    run_modes(a.modes, make, "unet-video-frame", lambda ms: {"steps": a.steps, "streams": B, "params": params,
                                                             "guidance": "rcfg" if resid else "cfg",
                                                             "frames_per_s": 1000 / ms, "images_per_s": B * 1000 / ms})


def cmd_train_bench(a):
    B = a.batch
    ab = torch.tensor(schedule("linear", 1000), device="cuda", dtype=torch.float32)
    for mode in a.modes.split(","):
        torch.manual_seed(1)
        model = UNet().cuda()
        ema = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0, fused=True)
        x0 = torch.rand(B, 1, 32, 32, device="cuda") * 2 - 1
        y = torch.randint(0, 11, (B,), device="cuda")
        t = torch.randint(0, 1000, (B,), device="cuda")

        def loss_fn():
            eps = torch.randn_like(x0)
            a_ = ab[t].sqrt()[:, None, None, None]
            s_ = (1 - ab[t]).sqrt()[:, None, None, None]
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                pred = model(a_ * x0 + s_ * eps, t, y)
            return F.mse_loss(pred.float(), eps)

        fwd = torch.compile(loss_fn) if mode == "compile" else loss_fn

        def step():
            loss = fwd()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                torch._foreach_lerp_(ema, list(model.parameters()), 1 - 0.9995)

        ms = timed(step)
        print(json.dumps({"workload": "unet-train-step", "impl": "torch-" + mode, "ms": ms, "batch": B}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("compare")
    q.add_argument("--ckpt", required=True)
    q.add_argument("--samples", required=True)
    q.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    q.add_argument("--raw-weights", action="store_true")
    q.add_argument("--device", default="cuda")
    q = sub.add_parser("bench")
    q.add_argument("--batch", type=int, default=256)
    q.add_argument("--steps", type=int, default=20)
    q.add_argument("--modes", default="eager,graph,compile")
    q = sub.add_parser("video")
    q.add_argument("--steps", type=int, default=4)
    q.add_argument("--config", help="a model configuration JSON (random weights at that size)")
    q.add_argument("--batch", type=int, default=1, help="video streams sampled together")
    q.add_argument("--residual-guidance", type=float, default=0, help="R-CFG at this scale (0: CFG at 3)")
    q.add_argument("--modes", default="eager,graph,compile")
    q = sub.add_parser("train-bench")
    q.add_argument("--batch", type=int, default=128)
    q.add_argument("--modes", default="eager,compile")
    a = p.parse_args()
    {"compare": cmd_compare, "bench": cmd_bench, "video": cmd_video, "train-bench": cmd_train_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
