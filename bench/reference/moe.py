#!/usr/bin/env python3
"""PyTorch reference for gpukit's Mixture-of-Experts GPT (libgpu/nn: a
GPTConfig with "moe"; `trainer run --model moe`): nanoGPT's
GPT as bench/reference/gpt.py builds it, whose MLP in every moe_every-th
block (blocks l with (l + 1) % moe_every == 0: 1, 3, 5 for 6 layers and
moe_every 2) is a Mixture-of-Experts layer in nanoMoE's shape:

  router   logits = x·W_rᵀ in f32 (autocast off), W_r = mlp.router.weight
           [E, d], x the block's LayerNorm output (f32 under autocast;
           parity --router-input compute rounds it to bf16 first, as the
           experts and gpukit's router see it: one rounding changed); the k
           largest logits per token and their softmax (the renormalised
           top-k probabilities)
  experts  mlp.experts.c_fc.weight [E, W, d], mlp.experts.c_proj.weight
           [E, d, W] (one nn.Linear weight per expert, stacked; biases
           [E, W], [E, d] when the model has biases): c_fc → GELU → c_proj
  routing  dropless token choice: the T·k choices sorted by expert (stable),
           each expert's rows multiplied by its weights through
           torch._grouped_mm (bf16 on CUDA, where it runs; groups padded
           to 16 rows if it insists) or else a loop over experts, and
           combined back: y[t] = Σ_j w_tj · expert_{e_tj}(x_t)
  losses   aux = E·Σ_i f_i·P_i (f_i: choices of expert i per token, so
           Σ f_i = k; P_i: mean router probability), z = mean_t
           logsumexp(logits_t)²; the objective is CE + aux_loss·Σaux +
           z_loss·Σz over the MoE layers (nanoMoE's defaults 0.01, 0.001)

The model config is the run config's "gpt" entry (nn.GPTConfig as JSON)
with its "moe" entry (experts, top_k, moe_every, expert_width (0: 4·d),
aux_loss, z_loss); missing MoE keys take nanoMoE's defaults. Weight decay
applies to parameters of rank ≥ 2 except biases (expert biases are [E, W]).

  moe.py parity --init INIT --batches BATCHES [--dtype f32|bf16] [--device cuda|cpu] [--loop]
                [--router-input f32|compute] [--perturb EPS]
      As gpt.py parity (INIT: initial weights as safetensors; BATCHES:
      i32 "x", "y" [steps, batch, block], f32 "lr" [steps], the run's
      config as JSON in the metadata key "config"): one step per batch,
      dropout 0; prints {"step", "loss" (the cross-entropy), "aux_loss",
      "z_loss" (sums over the MoE layers, unscaled)} per step, the losses
      of the batch before its update. --loop multiplies experts one by one
      instead of through torch._grouped_mm. --router-input compute rounds
      the router's input to bf16 under autocast (a twin run: how far two
      bf16 runs drift apart when one rounding differs). --perturb EPS
      multiplies every initial weight by 1 ± EPS (signs from a fixed seed):
      the f32 twin, measuring how far training amplifies a rounding-sized
      difference (a near-tie in the router flips a token's expert).

  moe.py eval --ckpt MODEL --batches BATCHES [--dtype f32|bf16]
      Loads the checkpoint with load_state_dict(strict=True) into the
      model of its config metadata and prints {"val_loss": mean CE}.

  moe.py bench [--layers 6 --heads 6 --d-model 384 --block 256 --batch 64 --vocab 65
                --experts 8 --top-k 2 --moe-every 2] [--modes eager,compile]
      Median time of one training step (forward, backward of the whole
      objective, fused AdamW; bf16 autocast, dropout 0) per mode, and
      MFU on active parameters (H100 bf16 peak 989 TFLOP/s). Modes: eager,
      compile (torch.compile's default), compile-MODE (torch.compile's
      mode MODE, e.g. compile-max-autotune-no-cudagraphs); each line has
      first_step_s, the first step's wall time (compilation included).

  moe.py grouped [--iters 50]
      torch._grouped_mm (bf16) at the grouped GEMM benchmark shapes of
      libgpu/ops (BenchmarkGroupedGEMM): 8 experts × 4096 tokens, 768 →
      3072, balanced and skewed (busiest expert 1.64× the mean); 64
      experts, 65536 tokens, 768 → 512, skewed 3.72× (skew_counts: the
      same counts as ops' SkewCounts); the forward y = x·w[g]ᵀ and the two
      backward products, and a dense torch.mm of the same size. Prints one
      JSON line per product with ms (median of per-call CUDA events) and
      TFLOP/s (2·T·N·K).

Needs torch and safetensors.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt as base  # noqa: E402  (nanoGPT's modules, batches, schedule)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEFAULT_MOE = dict(experts=8, top_k=2, moe_every=2, expert_width=0, aux_loss=0.01, z_loss=0.001)

# How expert products run: "grouped" (torch._grouped_mm on the exact
# groups), "padded" (groups padded to multiples of 16 rows), "loop"; None
# until the first bf16 CUDA product decides.
MODE = {"mm": None}

# The router's input: "f32" (autocast's f32 LayerNorm output as it is) or
# "compute" (rounded to the autocast dtype, then widened to f32: what
# gpukit's router reads).
ROUTER = {"input": "f32"}


def moe_config(c):
    m = dict(DEFAULT_MOE)
    m.update(c.get("moe") or {})
    if not m.get("expert_width"):
        m["expert_width"] = 4 * c["d_model"]
    return m


def loop_mm(x, w, offs):
    """x [R, K], w [E, N, K], offs int32 [E] (cumulative ends) → [R, N],
    one product per expert (reads the offsets on the host)."""
    out = x.new_zeros(x.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ w[e].t()
        start = end
    return out


def padded_mm(x, w, offs, align=16):
    """torch._grouped_mm with each group padded to a multiple of align rows
    (torchtitan's workaround for kernels that need aligned groups)."""
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    pc = (counts + align - 1) // align * align
    pends = torch.cumsum(pc, 0)
    pstart = pends - pc
    starts = offs - counts
    rows = torch.arange(x.shape[0], device=x.device)
    grp = torch.searchsorted(offs.long(), rows, right=True)
    dest = pstart[grp] + rows - starts[grp]
    xp = x.new_zeros(x.shape[0] + align * w.shape[0], x.shape[1])
    xp[dest] = x
    yp = torch._grouped_mm(xp, w.transpose(-2, -1), offs=pends.to(torch.int32))
    return yp[dest]


def grouped_mm(x, w, offs):
    """x [R, K] rows grouped by expert, w [E, N, K], offs int32 [E] → [R, N].
    The first bf16 CUDA product decides how products run (MODE); once
    decided, the product is one call with no exception handling around it,
    so torch.compile traces it as it is."""
    if not (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")) or MODE["mm"] == "loop":
        return loop_mm(x, w, offs)
    if MODE["mm"] == "grouped":
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    if MODE["mm"] == "padded":
        return padded_mm(x, w, offs)
    try:
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        MODE["mm"] = "grouped"
        return y
    except Exception as err:  # noqa: BLE001 - fall back, and say so once
        print(json.dumps({"note": f"torch._grouped_mm on exact groups: {type(err).__name__}: {err}"[:300]}), file=sys.stderr)
    try:
        y = padded_mm(x, w, offs)
        MODE["mm"] = "padded"
        return y
    except Exception as err:  # noqa: BLE001
        print(json.dumps({"note": f"torch._grouped_mm padded: {type(err).__name__}: {err}"[:300]}), file=sys.stderr)
        MODE["mm"] = "loop"
        return loop_mm(x, w, offs)


def decide_mm(device="cuda"):
    """Runs one small bf16 expert product eagerly so MODE is decided
    before torch.compile traces the model."""
    if device != "cuda" or MODE["mm"] is not None:
        return
    x = torch.randn(32, 16, device=device, dtype=torch.bfloat16)
    w = torch.randn(2, 16, 16, device=device, dtype=torch.bfloat16)
    grouped_mm(x, w, torch.tensor([16, 32], device=device, dtype=torch.int32))


class ExpertLinear(nn.Module):
    """E stacked nn.Linear layers: weight [E, out, in], bias [E, out]."""

    def __init__(self, n, n_out, n_in, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n, n_out)) if bias else None

    def forward(self, x, offs, eid):
        y = grouped_mm(x, self.weight.to(x.dtype), offs)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)[eid]
        return y


class Router(nn.Module):
    def __init__(self, n, d):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, d))


class Experts(nn.Module):
    def __init__(self, n, d, width, bias):
        super().__init__()
        self.c_fc = ExpertLinear(n, width, d, bias)
        self.c_proj = ExpertLinear(n, d, width, bias)


class MoEMLP(nn.Module):
    def __init__(self, c, m):
        super().__init__()
        self.n, self.k = m["experts"], m["top_k"]
        self.router = Router(self.n, c["d_model"])
        self.experts = Experts(self.n, c["d_model"], m["expert_width"], c["bias"])
        self.gelu = nn.GELU(approximate="tanh" if c.get("gelu_tanh") else "none")
        self.dropout = nn.Dropout(c["dropout"])
        self.aux = self.z = None

    def forward(self, x):
        B, T, C = x.size()
        dev = x.device.type
        xf = x.reshape(B * T, C)
        cdt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        xr = xf if ROUTER["input"] == "f32" else xf.to(cdt)
        with torch.autocast(device_type=dev, enabled=False):
            logits = xr.float() @ self.router.weight.float().t()
            probs = logits.softmax(-1)
            topv, topi = torch.topk(logits, self.k, dim=-1)
            w = topv.softmax(-1)
            flat = topi.reshape(-1)
            # bincount's counts with a static shape (torch.compile keeps one graph)
            counts = torch.zeros(self.n, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
            ntok = xf.shape[0]
            self.aux = self.n * ((counts.float() / ntok) * probs.mean(0)).sum()
            self.z = (torch.logsumexp(logits, -1) ** 2).mean()
        order = torch.argsort(flat, stable=True)
        tok, eid = order // self.k, flat[order]
        offs = torch.cumsum(counts, 0).to(torch.int32)
        h = self.gelu(self.experts.c_fc(xf[tok].to(cdt), offs, eid))
        ys = self.experts.c_proj(h, offs, eid)
        y = torch.zeros(ntok, C, device=x.device, dtype=torch.float32)
        y = y.index_add(0, tok, ys.float() * w.reshape(-1)[order].unsqueeze(1))
        return self.dropout(y.to(cdt).view(B, T, C))


class MoEGPT(base.GPT):
    """gpt.py's GPT with MoE MLPs in blocks l where (l + 1) % moe_every == 0,
    initialised as nanoGPT's MLP (N(0, 0.02), c_proj N(0, 0.02/√(2L)), zero
    biases; the router N(0, 0.02))."""

    def __init__(self, c):
        super().__init__(c)
        m = moe_config(c)
        for l, blk in enumerate(self.transformer.h):
            if (l + 1) % m["moe_every"] == 0:
                blk.mlp = MoEMLP(c, m)
                nn.init.normal_(blk.mlp.router.weight, std=0.02)
                nn.init.normal_(blk.mlp.experts.c_fc.weight, std=0.02)
                nn.init.normal_(blk.mlp.experts.c_proj.weight, std=0.02 / math.sqrt(2 * c["layers"]))

    def moe_layers(self):
        return [b.mlp for b in self.transformer.h if isinstance(b.mlp, MoEMLP)]

    def aux_losses(self):
        ls = self.moe_layers()
        return sum(m.aux for m in ls), sum(m.z for m in ls)

    def active_params(self):
        """Non-embedding parameters a token uses: experts counted k/E."""
        n = sum(p.numel() for p in self.parameters()) - self.transformer.wpe.weight.numel()
        for m in self.moe_layers():
            n -= sum(p.numel() for p in m.experts.parameters()) * (m.n - m.k) / m.n
        return int(round(n))


def optimizer(model, cfg, device):
    """AdamW: decay on parameters of rank ≥ 2 except biases."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith("bias")]
    nodecay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.endswith("bias"))]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": nodecay, "weight_decay": 0.0}]
    kw = dict(fused=True) if device == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=1e-8, **kw)


def objective(model, m, x, y):
    loss = model(x, y)
    aux, z = model.aux_losses()
    return loss, aux, z, loss + m["aux_loss"] * aux + m["z_loss"] * z


def cmd_parity(a):
    from safetensors.torch import load_file
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.loop:
        MODE["mm"] = "loop"
    ROUTER["input"] = a.router_input
    b, cfg = base.load_batches(a.batches)
    c = base.model_config(cfg)
    c["dropout"] = 0.0
    m = moe_config(c)
    model = MoEGPT(c).to(a.device)
    missing, unexpected = model.load_state_dict(load_file(a.init), strict=False)
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        sys.exit(f"moe.py: init mismatch: missing {missing}, unexpected {unexpected}")
    if a.perturb:
        g = torch.Generator(device="cpu").manual_seed(12345)
        with torch.no_grad():
            for p in model.parameters():
                sign = torch.randint(0, 2, p.shape, generator=g).to(p) * 2 - 1
                p.mul_(1 + a.perturb * sign)
    opt = optimizer(model, cfg, a.device)
    x, y, lrs = b["x"].long().to(a.device), b["y"].long().to(a.device), b["lr"]
    for s in range(x.shape[0]):
        for grp in opt.param_groups:
            grp["lr"] = float(lrs[s])
        with base.autocast(a.dtype, a.device):
            loss, aux, z, total = objective(model, m, x[s], y[s])
        total.backward()
        if cfg.get("clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(json.dumps({"step": s + 1, "loss": loss.item(), "aux_loss": aux.item(), "z_loss": z.item()}), flush=True)
    print(json.dumps({"expert_products": MODE["mm"] or "loop"}), file=sys.stderr)


def cmd_eval(a):
    from safetensors import safe_open
    from safetensors.torch import load_file
    torch.backends.cuda.matmul.allow_tf32 = False
    with safe_open(a.ckpt, framework="pt") as f:
        meta = f.metadata()
    c = base.model_config(json.loads(meta["config"]))
    c["dropout"] = 0.0
    model = MoEGPT(c).to(a.device).eval()
    sd = {k: v for k, v in load_file(a.ckpt).items() if not k.startswith("optim/")}
    model.load_state_dict(sd, strict=True)
    b, _ = base.load_batches(a.batches)
    x, y = b["x"].long().to(a.device), b["y"].long().to(a.device)
    tot = 0.0
    with torch.no_grad():
        for s in range(x.shape[0]):
            with base.autocast(a.dtype, a.device):
                tot += model(x[s], y[s]).item()
    print(json.dumps({"val_loss": tot / x.shape[0], "batches": x.shape[0]}), flush=True)


def cmd_bench(a):
    import time
    c = dict(vocab=a.vocab, layers=a.layers, heads=a.heads, d_model=a.d_model, block=a.block, bias=False, dropout=0.0,
             moe=dict(experts=a.experts, top_k=a.top_k, moe_every=a.moe_every))
    m = moe_config(c)
    cfg = dict(lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randint(0, a.vocab, (a.batch, a.block), device="cuda", generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.block), device="cuda", generator=g)
    decide_mm()
    for mode in a.modes.split(","):
        torch.manual_seed(1)
        model = MoEGPT(c).cuda()
        opt = optimizer(model, cfg, "cuda")
        if mode == "eager":
            fwd = model
        elif mode == "compile":
            fwd = torch.compile(model)
        elif mode.startswith("compile-"):
            fwd = torch.compile(model, mode=mode[len("compile-"):])
        else:
            sys.exit(f"moe.py bench: mode {mode!r} (want eager, compile or compile-MODE)")

        def step():
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = fwd(x, y)
                aux, z = model.aux_losses()
                total = loss + m["aux_loss"] * aux + m["z_loss"] * z
            total.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        line = {"workload": "moe-step", "impl": "torch-" + mode, "batch": a.batch, "block": a.block,
                "layers": a.layers, "d_model": a.d_model, "experts": a.experts, "top_k": a.top_k,
                "device": torch.cuda.get_device_name(), "torch": torch.__version__}
        try:
            t0 = time.perf_counter()
            step()  # the first step: compilation for the compiled modes
            torch.cuda.synchronize()
            line["first_step_s"] = round(time.perf_counter() - t0, 2)
            ms = base.timed(step, a.warmup, a.iters)
            n = model.active_params()
            flops = (6 * n + 12 * a.layers * a.d_model * a.block) * a.batch * a.block
            line.update(ms=ms, active_params=n, mfu=flops / (ms * 1e-3) / 989e12, expert_products=MODE["mm"])
        except Exception as err:  # noqa: BLE001 - reported in the line
            line["error"] = f"{type(err).__name__}: {err}"[:500]
        print(json.dumps(line), flush=True)


def skew_counts(e, t, ratio):
    """libgpu/ops SkewCounts: t rows over e groups with sizes ∝ exp(a·i/(e−1)),
    a bisected so that the busiest group holds ratio × the mean."""
    def w(a):
        return [math.exp(a * i / max(e - 1, 1)) for i in range(e)]

    def peak(a):
        v = w(a)
        return e * v[-1] / sum(v)

    lo, hi = 0.0, 50.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if peak(mid) < ratio:
            lo = mid
        else:
            hi = mid
    v = w(lo)
    s = sum(v)
    counts = [math.floor(t * x / s) for x in v]
    used, i = sum(counts), e - 1
    while used < t:
        counts[i] += 1
        used += 1
        i = (i + e - 1) % e
    return counts


GROUPED_SHAPES = [("E8,T32768,768-3072,balanced", 8, 32768, 3072, 768, 1.0),
                  ("E8,T32768,768-3072,skewed1.64", 8, 32768, 3072, 768, 1.64),
                  ("E64,T65536,768-512,skewed3.72", 64, 65536, 512, 768, 3.72)]


def cmd_grouped(a):
    g = torch.Generator(device="cuda").manual_seed(3)
    dev = torch.cuda.get_device_name()
    for name, e, t, n, k, ratio in GROUPED_SHAPES:
        counts = skew_counts(e, t, ratio)
        offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16, generator=g)
        dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16, generator=g)
        flops = 2 * t * n * k
        passes = [("fwd", lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)),
                  ("dx", lambda: torch._grouped_mm(dy, w, offs=offs)),
                  ("dw", lambda: torch._grouped_mm(dy.t(), x, offs=offs)),
                  ("dense-mm", lambda: torch.mm(x, w[0].t()))]
        for pname, f in passes:
            line = {"workload": "grouped_mm", "impl": "torch._grouped_mm" if pname != "dense-mm" else "torch.mm",
                    "pass": pname, "shape": name, "busiest_over_mean": max(counts) * e / t, "device": dev,
                    "torch": torch.__version__}
            try:
                ms = base.timed(f, 5, a.iters)
                line.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
            except Exception as err:  # noqa: BLE001 - reported in the line
                line["error"] = f"{type(err).__name__}: {err}"[:300]
            print(json.dumps(line), flush=True)
        print(json.dumps({"workload": "grouped_mm", "shape": name, "counts": counts}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = sub.add_parser("parity")
    q.add_argument("--init", required=True)
    q.add_argument("--batches", required=True)
    q.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    q.add_argument("--device", default=dev)
    q.add_argument("--loop", action="store_true")
    q.add_argument("--router-input", default="f32", choices=["f32", "compute"])
    q.add_argument("--perturb", type=float, default=0.0)
    q.set_defaults(f=cmd_parity)
    q = sub.add_parser("eval")
    q.add_argument("--ckpt", required=True)
    q.add_argument("--batches", required=True)
    q.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    q.add_argument("--device", default=dev)
    q.set_defaults(f=cmd_eval)
    q = sub.add_parser("bench")
    for key, v in dict(layers=6, heads=6, d_model=384, block=256, batch=64, vocab=65, experts=8, top_k=2, moe_every=2,
                       warmup=15, iters=30).items():
        q.add_argument("--" + key.replace("_", "-"), type=int, default=v)
    q.add_argument("--modes", default="eager,compile")
    q.set_defaults(f=cmd_bench)
    q = sub.add_parser("grouped")
    q.add_argument("--iters", type=int, default=50)
    q.set_defaults(f=cmd_grouped)
    a = p.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
