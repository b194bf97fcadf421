#!/usr/bin/env python3
"""PyTorch reference for gpukit's HRM on Sudoku (issue 23): the Hierarchical
Reasoning Model of sapientinc/HRM (arXiv 2506.21734), models/hrm/hrm_act_v1.py
with its loss head (models/losses.py, ACTLossHead with stablemax cross-entropy),
optimizers (AdamATan2 from the adam-atan2 package, sign-SGD on the puzzle
embedding from models/sparse_embedding.py) and the learning-rate schedule of
pretrain.py, at the defaults of the reference's Sudoku-Extreme 1k run
(config/arch/hrm_v1.yaml, config/cfg_pretrain.yaml, README: lr 1e-4,
puzzle_emb_lr 1e-4, weight_decay 1.0, puzzle_emb_weight_decay 1.0, global
batch 768, 2000 warm-up steps, lr_min_ratio 1.0). Written from the reference,
not copied; flash-attn is replaced by F.scaled_dot_product_attention (the
same non-causal attention, scale 1/sqrt(head_dim)). The host loop is the
reference's: one segment per optimizer step, halting decided on the host.

  hrm.py init --out INIT [--seed S] [architecture flags]
      Writes initial weights drawn as the reference draws them.
  hrm.py parity --init INIT --replay REPLAY [--dtype f32|bf16] [--compile] [--out F]
                [--perturb EPS] [--sdpa default|math|efficient|flash|cudnn]
      Trains one segment step per replay step; prints one JSON line per step.
      --perturb multiplies each initial weight by 1 ± EPS (signs from a fixed
      seed) and --sdpa picks the attention backend: the same model rounded
      otherwise, to measure how much the training amplifies rounding.
  hrm.py train --data DIR [--steps N --batch 768 --num-aug 1000 --seed S --eval-every K --compile --out F]
      Trains on DIR/train.safetensors with its own seeded sampler and
      on-the-fly augmentation; evaluates on DIR/test.safetensors.
  hrm.py eval --ckpt F --test DIR/test.safetensors [--batch 768 --n N]
      Exact-puzzle accuracy, cell accuracy and mean segments, with halting
      and with always halt_max_steps segments, and the seconds each took
      (on CUDA after one untimed warm-up batch).
  hrm.py bench [--batch 768] [--modes eager,compile] [--no-eval]
      Median time of one training segment step; time of an evaluation.
  hrm.py selfcheck
      Checks the pure-Python pieces (schedule, augmentation, names) without torch.

Architecture flags (defaults = the reference's): --hidden 512 --heads 8
--h-layers 4 --l-layers 4 --h-cycles 2 --l-cycles 2 --expansion 4
--halt-max-steps 16 --halt-exploration-prob 0.1. Training flags: --lr 1e-4
--puzzle-emb-lr 1e-4 --weight-decay 1.0 --puzzle-emb-weight-decay 1.0
--beta1 0.9 --beta2 0.95 --warmup 2000 --lr-min-ratio 1.0.

LAYOUT CONTRACT (what the Go model follows for step-by-step parity)
===================================================================

Data (libgpu/data/sudoku). Set files train.safetensors / test.safetensors:
inputs, labels U8 [N, 81], row-major cells, inputs 0 = blank and 1-9 given,
labels 1-9. Tokens are digit + 1, as build_sudoku_dataset.py writes them:
0 = pad (never used: every puzzle has 81 cells), 1 = blank, 2..10 = digits
1..9; vocabulary 11; the label token of a cell is its solution digit + 1 and
every cell counts in the loss (givens too, as in the reference; no ignored
label). There is one puzzle identifier (0) for every Sudoku, so the "puzzle
token" is one learned vector shared by all puzzles.

Sequence: position 0 is the puzzle embedding (puzzle_emb_len = 1, since
puzzle_emb_ndim = hidden), positions 1..81 are the cells; 82 positions.
RoPE over the 82 positions (theta 10000, head_dim 64, rotate_half layout:
cos/sin = cat(freqs, freqs)).

Replay files (`trainer data replay --set train.safetensors --out F`; sudoku.Replay,
gpukit-sudoku-replay/1):
    inputs         U8  [S, B, 81]  step t's candidate puzzles (0 blank)
    labels         U8  [S, B, 81]  their solutions
    min_halt_steps I32 [S, B]      exploration draws: 0 or 2..halt_max_steps
    puzzle, copy   I32 [S, B]      provenance (training index, augmentation copy)
At step t (0-based) the model gets the full batch inputs[t], labels[t];
row b replaces the carried puzzle of slot b only where slot b halted after
step t-1 (every slot at t = 0, when all start halted), exactly as
HierarchicalReasoningModel_ACTV1.forward: carry z_H, z_L reset to H_init,
L_init and the segment count to 0 in those slots. min_halt_steps[t] replaces
the reference's (rand < 0.1) * randint(2, halt_max_steps + 1) draw of step t.

Weights (INIT and checkpoints): safetensors, every tensor F32 (master
weights), names = the reference's state_dict of
HierarchicalReasoningModel_ACTV1 (prefix "model." under ACTLossHead,
"_orig_mod.model." under torch.compile), shapes at the defaults:
    inner.embed_tokens.embedding_weight          [11, 512]   trunc-normal std 1/sqrt(512)
    inner.puzzle_emb.weights                     [1, 512]    zeros (sign-SGD, not AdamATan2)
    inner.lm_head.weight                         [11, 512]   trunc-normal std 1/sqrt(512)
    inner.q_head.weight                          [2, 512]    zeros; row 0 = halt, row 1 = continue
    inner.q_head.bias                            [2]         -5, -5
    inner.H_init, inner.L_init                   [512]       trunc-normal std 1, rounded to bf16 (not trained)
    inner.{H,L}_level.layers.{i}.self_attn.qkv_proj.weight  [1536, 512]
        rows [0,512) q, [512,1024) k, [1024,1536) v; head h = rows 64h..64h+63 of each
    inner.{H,L}_level.layers.{i}.self_attn.o_proj.weight    [512, 512]
    inner.{H,L}_level.layers.{i}.mlp.gate_up_proj.weight    [3072, 512]
        rows [0,1536) gate, [1536,3072) up (inter = 256*ceil(round(4*512*2/3)/256) = 1536)
    inner.{H,L}_level.layers.{i}.mlp.down_proj.weight       [512, 1536]
i = 0..3. Linear layers compute x @ W^T, no biases except q_head's.
"Trunc-normal std s" is the reference's jax-style truncated normal (cut at
+-2 of the unit normal, rescaled so the std is s). Metadata "config" holds the
architecture as JSON.

One segment (training step t, s = t + 1), as the reference:
    x = sqrt(512) * cat(puzzle_emb[0], embed_tokens[tokens])            (forward dtype)
    no grad:  for h in 0..H_cycles-1: for l in 0..L_cycles-1, except the last pair:
                  z_L = L_level(z_L, z_H + x);   after each h but the last: z_H = H_level(z_H, z_L)
    with grad: z_L = L_level(z_L, z_H + x); z_H = H_level(z_H, z_L)     (the one-step gradient)
    level(z, inj) = blocks(z + inj); block(h) = rms(h + attn(h)); rms(h + swiglu(h))   (post-norm, no weight, eps 1e-5, in f32)
    logits = lm_head(z_H)[:, 1:]; q_halt, q_continue = q_head(z_H[:, 0]) in f32
    carry = (z_H, z_L) detached; steps += 1; halted = steps >= 16 or q_halt > q_continue,
    then halted &= steps >= min_halt_steps; target_q_continue = sigmoid(steps >= 16 ? q_halt' :
    max(q_halt', q_continue')) from a second no-grad forward of the NEW carry on the same data.
    loss = sum_b mean_cells stablemax_ce(logits) + 0.5 * (BCE(q_halt, all 81 right) + BCE(q_continue, target)),
    summed over the batch (BCE with logits); backward of loss / B.
    lr(s) = base * s / 2000 for s < 2000, else base (lr_min_ratio 1: no decay).
    AdamATan2 (every parameter above but puzzle_emb.weights, H_init, L_init):
        p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = lerp(v, g^2, 1-b2);
        p -= lr/(1-b1^s) * atan2(m, sqrt(v)/sqrt(1-b2^s)).
    Sign-SGD on puzzle_emb.weights: G = sum of the gradient over the batch rows of each
        identifier; for the identifiers present, w = w*(1 - lr*wd) - lr*sign(G).
Printed per step: {"step", "lr", "loss", "lm_loss", "q_halt_loss", "q_continue_loss" (each
/B), "count" (halted after the step), "accuracy", "exact_accuracy", "q_halt_accuracy",
"steps" (each over the halted rows, as pretrain.py), "halted"}.

bf16: forward in bfloat16 (weights cast per use, RMSNorm and RoPE in f32, the
stablemax in float64), master weights and optimizer state f32. f32: forward in
float32 with TF32 off.

Needs torch and safetensors (selfcheck needs neither). Checked on the CPU with
Debian's python3-torch 1.13 (no SDPA, no torch.compile: sdpa() falls back to
plain ops) at a tiny size: init, parity on a replay, train, eval, bench eager.
"""
import argparse
import json
import math
import os
import sys
import time

# ---------------------------------------------------------------- pure Python

ARCH_DEFAULTS = dict(hidden=512, heads=8, h_layers=4, l_layers=4, h_cycles=2, l_cycles=2, expansion=4.0,
                     halt_max_steps=16, halt_exploration_prob=0.1, vocab=11, seq_len=81, num_puzzle_ids=1,
                     rope_theta=10000.0, rms_eps=1e-5)
TRAIN_DEFAULTS = dict(lr=1e-4, puzzle_emb_lr=1e-4, weight_decay=1.0, puzzle_emb_weight_decay=1.0,
                      beta1=0.9, beta2=0.95, warmup=2000, lr_min_ratio=1.0, batch=768)


def find_multiple(a, b):
    return -(a // -b) * b


def swiglu_inter(hidden, expansion):
    """The SwiGLU width of models/layers.py: round(expansion*hidden*2/3) up to a multiple of 256."""
    return find_multiple(round(expansion * hidden * 2 / 3), 256)


def lr_at(step, base, warmup, total, min_ratio):
    """pretrain.py's cosine_schedule_with_warmup_lr_lambda at 1-based step (the reference
    increments its step before computing the rate, so the first update uses step 1)."""
    if step < warmup:
        return base * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return base * (min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


def tensor_names(c):
    """Names and shapes of the weights file (the reference's state_dict names)."""
    h, v, inter = c["hidden"], c["vocab"], swiglu_inter(c["hidden"], c["expansion"])
    out = [("inner.embed_tokens.embedding_weight", [v, h]), ("inner.puzzle_emb.weights", [c["num_puzzle_ids"], h]),
           ("inner.lm_head.weight", [v, h]), ("inner.q_head.weight", [2, h]), ("inner.q_head.bias", [2]),
           ("inner.H_init", [h]), ("inner.L_init", [h])]
    for lvl, n in (("H", c["h_layers"]), ("L", c["l_layers"])):
        for i in range(n):
            p = f"inner.{lvl}_level.layers.{i}."
            out += [(p + "self_attn.qkv_proj.weight", [3 * h, h]), (p + "self_attn.o_proj.weight", [h, h]),
                    (p + "mlp.gate_up_proj.weight", [2 * inter, h]), (p + "mlp.down_proj.weight", [h, inter])]
    return out


def transform_lists(rng):
    """One augmentation as build_sudoku_dataset.py's shuffle_sudoku draws it, from a
    random.Random: (digit map [10], row perm [9], col perm [9], transpose)."""
    perm = list(range(1, 10))
    rng.shuffle(perm)
    digits = [0] + perm
    transpose = rng.random() < 0.5

    def lines():
        bands = [0, 1, 2]
        rng.shuffle(bands)
        out = []
        for b in bands:
            r = [0, 1, 2]
            rng.shuffle(r)
            out += [b * 3 + x for x in r]
        return out
    return digits, lines(), lines(), transpose


def apply_lists(grid, t):
    """Apply transform_lists' transform to an 81-list: transpose, then cell (r, c) takes
    (rows[r], cols[c]), then relabel digits (the reference's order)."""
    digits, rows, cols, transpose = t
    x = [grid[(i % 9) * 9 + i // 9] for i in range(81)] if transpose else list(grid)
    return [digits[x[rows[i // 9] * 9 + cols[i % 9]]] for i in range(81)]


def valid_solution(g):
    units = [[r * 9 + c for c in range(9)] for r in range(9)] + [[r * 9 + c for r in range(9)] for c in range(9)]
    units += [[(br * 3 + r) * 9 + bc * 3 + c for r in range(3) for c in range(3)] for br in range(3) for bc in range(3)]
    return all(sorted(g[i] for i in u) == list(range(1, 10)) for u in units)


def selfcheck():
    """Checks what runs without torch: the schedule, the SwiGLU width, the names, and that
    the augmentation keeps a valid grid valid and its puzzle consistent."""
    import random
    seed = int(time.time_ns() % (1 << 32))
    rng = random.Random(seed)
    assert swiglu_inter(512, 4) == 1536
    assert lr_at(1, 1e-4, 2000, 10**6, 1.0) == 1e-4 / 2000 and lr_at(5000, 1e-4, 2000, 10**6, 1.0) == 1e-4
    names = dict(tensor_names(ARCH_DEFAULTS))
    assert len(names) == 7 + 4 * 8 and names["inner.H_level.layers.3.mlp.gate_up_proj.weight"] == [3072, 512]
    n_params = sum(math.prod(s) for k, s in names.items() if k not in ("inner.H_init", "inner.L_init", "inner.puzzle_emb.weights"))
    # A valid grid: the pattern (r*3 + r//3 + c) % 9 + 1.
    sol = [(r * 3 + r // 3 + c) % 9 + 1 for r in range(9) for c in range(9)]
    assert valid_solution(sol)
    for _ in range(200):
        puzzle = [v if rng.random() < 0.3 else 0 for v in sol]
        t = transform_lists(rng)
        ts, tp = apply_lists(sol, t), apply_lists(puzzle, t)
        assert valid_solution(ts), (t, ts)
        assert all(p == 0 or p == s for p, s in zip(tp, ts))
        assert sum(p != 0 for p in tp) == sum(p != 0 for p in puzzle)
    print(json.dumps({"selfcheck": "ok", "seed": seed, "params": n_params}))


# ---------------------------------------------------------------- torch

def torch_imports():
    global torch, nn, F
    import torch  # noqa: F401
    import torch.nn as nn  # noqa: F401
    import torch.nn.functional as F  # noqa: F401


def trunc_normal_(t, std):
    """models/common.py's trunc_normal_init_ (jax's truncated normal: cut at +-2, std exactly std)."""
    with torch.no_grad():
        if std == 0:
            return t.zero_()
        lo, hi = -2.0, 2.0
        sqrt2 = math.sqrt(2)
        a, b = math.erf(lo / sqrt2), math.erf(hi / sqrt2)
        z = (b - a) / 2
        c = (2 * math.pi) ** -0.5
        pdf_u, pdf_l = c * math.exp(-0.5 * lo ** 2), c * math.exp(-0.5 * hi ** 2)
        comp = std / math.sqrt(1 - (hi * pdf_u - lo * pdf_l) / z - ((pdf_u - pdf_l) / z) ** 2)
        t.uniform_(a, b).erfinv_().mul_(sqrt2 * comp).clip_(lo * comp, hi * comp)
    return t


def build_model_classes():
    class CastedLinear(nn.Module):
        def __init__(self, fin, fout, bias):
            super().__init__()
            self.weight = nn.Parameter(trunc_normal_(torch.empty(fout, fin), 1.0 / fin ** 0.5))
            self.bias = nn.Parameter(torch.zeros(fout)) if bias else None

        def forward(self, x):
            return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    class CastedEmbedding(nn.Module):
        def __init__(self, n, d, std, dtype):
            super().__init__()
            self.dtype = dtype
            self.embedding_weight = nn.Parameter(trunc_normal_(torch.empty(n, d), std))

        def forward(self, idx):
            return F.embedding(idx, self.embedding_weight.to(self.dtype))

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rms_norm(x, eps):
        dt = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)).to(dt)

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.heads, self.hd = c["heads"], c["hidden"] // c["heads"]
            self.qkv_proj = CastedLinear(c["hidden"], 3 * c["hidden"], False)
            self.o_proj = CastedLinear(c["hidden"], c["hidden"], False)

        def forward(self, cos, sin, x):
            B, S, _ = x.shape
            qkv = self.qkv_proj(x).view(B, S, 3 * self.heads, self.hd)
            q, k, v = qkv[:, :, :self.heads], qkv[:, :, self.heads:2 * self.heads], qkv[:, :, 2 * self.heads:]
            dt = q.dtype
            q, k = q.to(cos.dtype), k.to(cos.dtype)
            q = (q * cos.unsqueeze(-2) + rotate_half(q) * sin.unsqueeze(-2)).to(dt)
            k = (k * cos.unsqueeze(-2) + rotate_half(k) * sin.unsqueeze(-2)).to(dt)
            o = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            return self.o_proj(o.transpose(1, 2).reshape(B, S, -1))

    class SwiGLU(nn.Module):
        def __init__(self, c):
            super().__init__()
            inter = swiglu_inter(c["hidden"], c["expansion"])
            self.gate_up_proj = CastedLinear(c["hidden"], 2 * inter, False)
            self.down_proj = CastedLinear(inter, c["hidden"], False)

        def forward(self, x):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.eps = c["rms_eps"]
            self.self_attn = Attention(c)
            self.mlp = SwiGLU(c)

        def forward(self, cos, sin, h):
            h = rms_norm(h + self.self_attn(cos, sin, h), self.eps)
            return rms_norm(h + self.mlp(h), self.eps)

    class Level(nn.Module):
        def __init__(self, c, n):
            super().__init__()
            self.layers = nn.ModuleList([Block(c) for _ in range(n)])

        def forward(self, cos, sin, z, inj):
            z = z + inj
            for layer in self.layers:
                z = layer(cos, sin, z)
            return z

    class Inner(nn.Module):
        def __init__(self, c, dtype):
            super().__init__()
            self.c, self.dtype = c, dtype
            h = c["hidden"]
            self.embed_scale = math.sqrt(h)
            self.embed_tokens = CastedEmbedding(c["vocab"], h, 1.0 / self.embed_scale, dtype)
            self.lm_head = CastedLinear(h, c["vocab"], False)
            self.q_head = CastedLinear(h, 2, True)
            self.puzzle_emb = nn.Module()  # the table is a buffer: sign-SGD trains it, not AdamATan2
            self.puzzle_emb.register_buffer("weights", torch.zeros(c["num_puzzle_ids"], h))
            hd = h // c["heads"]
            inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            freqs = torch.outer(torch.arange(c["seq_len"] + 1, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)
            self.H_level = Level(c, c["h_layers"])
            self.L_level = Level(c, c["l_layers"])
            self.register_buffer("H_init", trunc_normal_(torch.empty(h, dtype=torch.bfloat16), 1.0).float())
            self.register_buffer("L_init", trunc_normal_(torch.empty(h, dtype=torch.bfloat16), 1.0).float())
            with torch.no_grad():
                self.q_head.weight.zero_()
                self.q_head.bias.fill_(-5)

        def forward(self, zH, zL, tokens, pe):
            """pe: the puzzle-embedding rows of the batch [B, hidden] f32 (a leaf with a
            gradient in training: models/sparse_embedding.py's local_weights)."""
            c = self.c
            x = torch.cat((pe.to(self.dtype).view(-1, 1, c["hidden"]), self.embed_tokens(tokens)), dim=-2)
            x = self.embed_scale * x
            cos, sin = self.cos, self.sin
            with torch.no_grad():
                for hs in range(c["h_cycles"]):
                    for ls in range(c["l_cycles"]):
                        if not (hs == c["h_cycles"] - 1 and ls == c["l_cycles"] - 1):
                            zL = self.L_level(cos, sin, zL, zH + x)
                    if hs != c["h_cycles"] - 1:
                        zH = self.H_level(cos, sin, zH, zL)
            zL = self.L_level(cos, sin, zL, zH + x)
            zH = self.H_level(cos, sin, zH, zL)
            logits = self.lm_head(zH)[:, 1:]
            q = self.q_head(zH[:, 0]).float()
            return zH.detach(), zL.detach(), logits, q[..., 0], q[..., 1]

    class HRM(nn.Module):
        """HierarchicalReasoningModel_ACTV1 with ACTLossHead's loss: step() is one segment."""

        def __init__(self, c, dtype):
            super().__init__()
            self.c = c
            self.inner = Inner(c, dtype)

        def forward(self, zH, zL, steps, halted, cur_in, cur_lab, batch_in, batch_lab, min_halt, pe):
            """One segment (HierarchicalReasoningModel_ACTV1.forward + ACTLossHead.forward).
            Tokens are digit + 1 (cur_in, batch_in [B, 81]; labels [B, 81] in 2..10); halted [B]
            bool says which slots take batch row b; min_halt [B] the exploration draws; pe the
            puzzle-embedding rows [B, hidden]. Returns the new carry, the summed loss and metrics."""
            c, inner = self.c, self.inner
            h3 = halted.view(-1, 1, 1)
            zH = torch.where(h3, inner.H_init.to(inner.dtype), zH)
            zL = torch.where(h3, inner.L_init.to(inner.dtype), zL)
            steps = torch.where(halted, 0, steps)
            cur_in = torch.where(halted.view(-1, 1), batch_in, cur_in)
            cur_lab = torch.where(halted.view(-1, 1), batch_lab, cur_lab)
            zH, zL, logits, qh, qc = inner(zH, zL, cur_in, pe)
            out = {}
            with torch.no_grad():
                steps = steps + 1
                last = steps >= c["halt_max_steps"]
                halted = last
                if self.training and c["halt_max_steps"] > 1:
                    halted = (halted | (qh > qc)) & (steps >= min_halt)
                    _, _, _, nqh, nqc = inner(zH, zL, cur_in, pe)
                    out["target_q_continue"] = torch.sigmoid(torch.where(last, nqh, torch.maximum(nqh, nqc)))
                correct = logits.argmax(-1) == cur_lab
                seq_ok = correct.sum(-1) == cur_lab.shape[-1]
                valid = halted
                out.update(count=valid.sum(), accuracy=torch.where(valid, correct.float().mean(-1), 0).sum(),
                           exact_accuracy=(valid & seq_ok).sum(), q_halt_accuracy=(valid & ((qh >= 0) == seq_ok)).sum(),
                           steps=torch.where(valid, steps, 0).sum())
            lm = (stablemax_ce(logits, cur_lab) / cur_lab.shape[-1]).sum()
            qhl = F.binary_cross_entropy_with_logits(qh, seq_ok.to(qh.dtype), reduction="sum")
            qcl = 0
            if "target_q_continue" in out:
                qcl = F.binary_cross_entropy_with_logits(qc, out["target_q_continue"], reduction="sum")
                out["q_continue_loss"] = qcl.detach()
            out.update(lm_loss=lm.detach(), q_halt_loss=qhl.detach(), logits=logits.detach(), q_halt=qh.detach(),
                       q_continue=qc.detach())
            return (zH, zL, steps, halted, cur_in, cur_lab), lm + 0.5 * (qhl + qcl), out

    return HRM


def sdpa(q, k, v):
    """Non-causal attention, scale 1/sqrt(head_dim) (flash_attn_func's default in the
    reference); [B, H, S, D]. PyTorch < 2.0 (no SDPA) computes it in plain ops."""
    f = getattr(F, "scaled_dot_product_attention", None)
    if f is not None:
        return f(q, k, v, is_causal=False)
    w = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return (w.softmax(-1) @ v.float()).to(q.dtype)


def stablemax_ce(logits, labels):
    """models/losses.py's stablemax_cross_entropy (Prieto et al. 2025): s(x) = 1/(1-x) for
    x < 0, x + 1 otherwise; log(s(x_y) / sum s(x)), in float64. Per cell, no reduction."""
    x = logits.to(torch.float64)
    s = torch.where(x < 0, 1 / (1 - x + 1e-30), x + 1)
    logp = torch.log(s / s.sum(-1, keepdim=True))
    return -logp.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)



class AdamATan2:
    """adam-atan2's AdamATan2 (github.com/imoneoi/adam-atan2, csrc/adam_atan2.cu) in f32:
    p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = lerp(v, g*g, 1-b2);
    p -= lr/(1-b1^t) * atan2(m, sqrt(v)/sqrt(1-b2^t))."""

    def __init__(self, named_params, betas, weight_decay):
        self.names, self.params = zip(*named_params)
        self.b1, self.b2 = betas
        self.wd = weight_decay
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def step(self, lr):
        self.t += 1
        step_size = lr / (1 - self.b1 ** self.t)
        bc2 = math.sqrt(1 - self.b2 ** self.t)
        with torch.no_grad():
            for p, m, v in zip(self.params, self.m, self.v):
                if p.grad is None:
                    continue
                g = p.grad
                p.mul_(1 - lr * self.wd)
                m.lerp_(g, 1 - self.b1)
                v.lerp_(g * g, 1 - self.b2)
                p.sub_(step_size * torch.atan2(m, v.sqrt() / bc2))
                p.grad = None


def sign_sgd(weights, local, ids, lr, wd):
    """models/sparse_embedding.py's _sparse_emb_signsgd_dist on one rank: sum the gradient
    rows of each identifier, then w = w*(1 - lr*wd) - lr*sign(G) for the identifiers present."""
    with torch.no_grad():
        uniq, inv = ids.unique(return_inverse=True)
        g = torch.zeros(uniq.shape[0], weights.shape[1], dtype=local.grad.dtype, device=weights.device)
        g.index_add_(0, inv, local.grad)
        p = weights[uniq]
        p.mul_(1.0 - lr * wd).add_(torch.sign(g), alpha=-lr)
        weights[uniq] = p


def arch_config(a):
    c = dict(ARCH_DEFAULTS)
    for k in ("hidden", "heads", "h_layers", "l_layers", "h_cycles", "l_cycles", "expansion", "halt_max_steps",
              "halt_exploration_prob"):
        if getattr(a, k, None) is not None:
            c[k] = getattr(a, k)
    return c


def train_config(a):
    t = dict(TRAIN_DEFAULTS)
    for k in t:
        if getattr(a, k, None) is not None:
            t[k] = getattr(a, k)
    return t


def new_model(c, dtype, device, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    HRM = build_model_classes()
    return HRM(c, torch.bfloat16 if dtype == "bf16" else torch.float32).to(device)


def weights_of(model):
    """The weights file's tensors: the reference's state_dict names, f32, contiguous."""
    sd = model.state_dict()
    want = [n for n, _ in tensor_names(model.c)]
    return {n: sd[n].detach().float().contiguous().cpu() for n in want}


def save_weights(model, path, extra_meta=None):
    from safetensors.torch import save_file
    meta = {"config": json.dumps(model.c), "format": "gpukit-hrm/1"}
    meta.update(extra_meta or {})
    save_file(weights_of(model), path, metadata=meta)


def load_weights(path, dtype, device):
    """Builds the model from the file's config metadata and loads every tensor strictly
    (names and shapes must be exactly tensor_names(config))."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    if "config" not in meta:
        sys.exit(f"hrm.py: {path}: no config metadata")
    c = dict(ARCH_DEFAULTS)
    c.update(json.loads(meta["config"]))
    model = new_model(c, dtype, device)
    sd = {k: v for k, v in load_file(path).items() if not k.startswith("optim/")}
    want = dict(tensor_names(c))
    if set(sd) != set(want) or any(list(sd[k].shape) != want[k] for k in want):
        bad = sorted(set(sd) ^ set(want)) or [k for k in want if list(sd[k].shape) != want[k]]
        sys.exit(f"hrm.py: {path}: tensors do not match the layout contract: {bad[:5]}")
    model.load_state_dict(sd, strict=True)
    return model


def load_set(path, device):
    """A gpukit-sudoku/1 set file as tokens (digit + 1): inputs, labels int32 [N, 81]."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != "gpukit-sudoku/1":
            sys.exit(f"hrm.py: {path}: format {meta.get('format')!r}, want gpukit-sudoku/1")
        x, y = f.get_tensor("inputs"), f.get_tensor("labels")
    return x.to(device=device, dtype=torch.int32) + 1, y.to(device=device, dtype=torch.int32) + 1


class Trainer:
    """The reference's train_batch: one segment per step, state carried between steps."""

    def __init__(self, model, t, batch, compile_=False):
        self.model, self.t, self.B = model, t, batch
        c, dev, dt = model.c, model.inner.cos.device, model.inner.dtype
        S, h = c["seq_len"] + 1, c["hidden"]
        self.opt = AdamATan2([(n, p) for n, p in model.named_parameters()], (t["beta1"], t["beta2"]), t["weight_decay"])
        self.zH = torch.zeros(batch, S, h, dtype=dt, device=dev)
        self.zL = torch.zeros(batch, S, h, dtype=dt, device=dev)
        self.steps = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.halted = torch.ones(batch, dtype=torch.bool, device=dev)
        self.cur_in = torch.zeros(batch, c["seq_len"], dtype=torch.int32, device=dev)
        self.cur_lab = torch.zeros(batch, c["seq_len"], dtype=torch.int32, device=dev)
        self.ids = torch.zeros(batch, dtype=torch.long, device=dev)
        self.fn = torch.compile(model, dynamic=False) if compile_ else model
        self.step_no = 0

    def step(self, batch_in, batch_lab, min_halt, total_steps=10**9):
        """Tokens batch_in, batch_lab [B, 81] int32 (digit + 1), min_halt [B] int32."""
        m, t = self.model, self.t
        m.train()
        self.step_no += 1
        s = self.step_no
        pe = m.inner.puzzle_emb.weights[self.ids].detach().clone().requires_grad_(True)
        carry, loss, out = self.fn(self.zH, self.zL, self.steps, self.halted, self.cur_in, self.cur_lab,
                                   batch_in, batch_lab, min_halt, pe)
        (loss / self.B).backward()
        lr = lr_at(s, t["lr"], t["warmup"], total_steps, t["lr_min_ratio"])
        plr = lr_at(s, t["puzzle_emb_lr"], t["warmup"], total_steps, t["lr_min_ratio"])
        sign_sgd(m.inner.puzzle_emb.weights, pe, self.ids, plr, t["puzzle_emb_weight_decay"])
        self.opt.step(lr)
        self.zH, self.zL, self.steps, self.halted, self.cur_in, self.cur_lab = carry
        cnt = max(int(out["count"]), 1)
        line = {"step": s, "lr": lr, "loss": float(loss) / self.B}
        for k in ("lm_loss", "q_halt_loss", "q_continue_loss"):
            if k in out:
                line[k] = float(out[k]) / self.B
        line["count"] = int(out["count"])
        for k in ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps"):
            line[k] = float(out[k]) / cnt
        line["halted"] = int(self.halted.sum())
        return line


def evaluate(model, x, y, batch, halting, compile_=False):
    """Exact-puzzle accuracy (all 81 cells right), cell accuracy and mean segments over
    tokens x, y [N, 81]. halting: each sequence stops at the first segment where
    q_halt > q_continue (no exploration) or at halt_max_steps, and keeps that segment's
    answer; else every sequence runs halt_max_steps segments (the reference's evaluate).
    The loop is the reference's host loop: one forward per segment, a host check of
    'all halted' after each."""
    c = model.c
    model.eval()
    fn = torch.compile(model, dynamic=False) if compile_ else model
    dev, dt = model.inner.cos.device, model.inner.dtype
    exact = cells = segs = 0
    n = x.shape[0]
    with torch.inference_mode():
        for lo in range(0, n, batch):
            bi, bl = x[lo:lo + batch], y[lo:lo + batch]
            b = bi.shape[0]
            if b < batch:  # pad to the static batch; padded rows are ignored
                bi = torch.cat((bi, bi[:1].expand(batch - b, -1)))
                bl = torch.cat((bl, bl[:1].expand(batch - b, -1)))
            S, h = c["seq_len"] + 1, c["hidden"]
            zH = torch.zeros(batch, S, h, dtype=dt, device=dev)
            zL = torch.zeros(batch, S, h, dtype=dt, device=dev)
            steps = torch.zeros(batch, dtype=torch.int32, device=dev)
            halted = torch.ones(batch, dtype=torch.bool, device=dev)
            cur_in, cur_lab = bi.clone(), bl.clone()
            pe = model.inner.puzzle_emb.weights[torch.zeros(batch, dtype=torch.long, device=dev)]
            zero = torch.zeros(batch, dtype=torch.int32, device=dev)
            done = torch.zeros(batch, dtype=torch.bool, device=dev)
            used = torch.zeros(batch, dtype=torch.int32, device=dev)
            pred = torch.zeros_like(bl)
            for seg in range(c["halt_max_steps"]):
                (zH, zL, steps, halted, cur_in, cur_lab), _, out = fn(zH, zL, steps, halted, cur_in, cur_lab, bi, bl, zero, pe)
                stop = halted | (out["q_halt"] > out["q_continue"]) if halting else halted
                new = stop & ~done
                pred = torch.where(new.view(-1, 1), out["logits"].argmax(-1).to(pred.dtype), pred)
                used = torch.where(new, seg + 1, used)
                done = done | new
                # In eval mode the model halts a slot only at halt_max_steps, so slots that
                # stopped early run on (their answers are kept from their stopping segment).
                if bool(done.all()):
                    break
            ok = (pred == bl)[:b]
            exact += int(ok.all(-1).sum())
            cells += int(ok.sum())
            segs += int(used[:b].sum())
    return {"exact_accuracy": exact / n, "cell_accuracy": cells / (n * c["seq_len"]), "mean_segments": segs / n,
            "puzzles": n, "halting": halting}


def load_replay(path, device):
    """A gpukit-sudoku-replay/1 file: tokens (digit + 1) inputs, labels int32 [S, B, 81],
    min_halt_steps int32 [S, B], and its metadata."""
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != "gpukit-sudoku-replay/1":
            sys.exit(f"hrm.py: {path}: format {meta.get('format')!r}, want gpukit-sudoku-replay/1")
        t = {k: f.get_tensor(k) for k in f.keys()}
    to = dict(device=device, dtype=torch.int32)
    return t["inputs"].to(**to) + 1, t["labels"].to(**to) + 1, t["min_halt_steps"].to(**to), meta


class Augment:
    """The reference 1k setting's data, built on the fly: each training puzzle has copy 0
    (itself) and num_aug shuffles (build_sudoku_dataset.py's shuffle_sudoku), drawn once
    from the seed; a batch takes puzzles in epoch permutations (puzzle_dataset.py's group
    order) and one uniformly chosen copy of each. Not the Go sampler's draws (those come in
    a replay file); the same distribution."""

    def __init__(self, x, y, num_aug, seed, device):
        g = torch.Generator(device="cpu").manual_seed(seed)
        n, k = x.shape[0], num_aug + 1
        perm = lambda *shape: torch.argsort(torch.rand(*shape, generator=g), dim=-1)  # noqa: E731
        self.digits = torch.cat((torch.zeros(n, k, 1, dtype=torch.long), perm(n, k, 9) + 1), dim=-1)
        bands, within = perm(n, k, 3), perm(n, k, 3, 3)
        self.rows = (bands.unsqueeze(-1) * 3 + within).reshape(n, k, 9)
        stacks, within = perm(n, k, 3), perm(n, k, 3, 3)
        self.cols = (stacks.unsqueeze(-1) * 3 + within).reshape(n, k, 9)
        self.transpose = torch.rand(n, k, generator=g) < 0.5
        ident = torch.arange(9)
        self.digits[:, 0], self.rows[:, 0], self.cols[:, 0], self.transpose[:, 0] = torch.arange(10), ident, ident, False
        for name in ("digits", "rows", "cols", "transpose"):
            setattr(self, name, getattr(self, name).to(device))
        self.x, self.y, self.n, self.k = x, y, n, k
        self.g = torch.Generator(device="cpu").manual_seed(seed + 1)
        self.order, self.pos, self.device = torch.randperm(n, generator=self.g), 0, device

    def apply(self, tok, i, k):
        """Transform tokens tok [B, 81] (digit + 1) with copy k[b] of puzzle i[b]."""
        B = tok.shape[0]
        g = (tok - 1).view(B, 9, 9)
        g = torch.where(self.transpose[i, k].view(B, 1, 1), g.transpose(1, 2), g)
        g = g.gather(1, self.rows[i, k].unsqueeze(-1).expand(B, 9, 9))
        g = g.gather(2, self.cols[i, k].unsqueeze(1).expand(B, 9, 9))
        return self.digits[i, k].gather(1, g.reshape(B, 81).long()).to(tok.dtype) + 1

    def batch(self, B):
        idx = []
        while len(idx) < B:
            take = min(B - len(idx), self.n - self.pos)
            idx += self.order[self.pos:self.pos + take].tolist()
            self.pos += take
            if self.pos == self.n:
                self.order, self.pos = torch.randperm(self.n, generator=self.g), 0
        i = torch.tensor(idx, device=self.device)
        k = torch.randint(0, self.k, (B,), generator=self.g).to(self.device)
        return self.apply(self.x[i], i, k), self.apply(self.y[i], i, k)


def exploration(B, c, g, device):
    """The reference's draw: (rand < halt_exploration_prob) * randint(2, halt_max_steps + 1)."""
    u = torch.rand(B, generator=g)
    m = torch.randint(2, c["halt_max_steps"] + 1, (B,), generator=g)
    return ((u < c["halt_exploration_prob"]) * m).to(device=device, dtype=torch.int32)


def setup(a):
    torch_imports()
    if a.dtype == "f32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("hrm.py: no CUDA device (pass --device cpu)")


def cmd_init(a):
    setup(a)
    model = new_model(arch_config(a), a.dtype, "cpu", seed=a.seed)
    save_weights(model, a.out, {"seed": str(a.seed)})
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"out": a.out, "params": n, "seed": a.seed}), flush=True)


def perturb_(model, eps, seed):
    """Multiplies every tensor of the weights file by 1 + eps·u, u = ±1 drawn
    from seed: two runs that differ by that much at the start measure how far
    the recurrent training amplifies a rounding-sized difference."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    sd = model.state_dict()
    with torch.no_grad():
        for n, _ in tensor_names(model.c):
            t = sd[n]
            u = torch.randint(0, 2, t.shape, generator=g).to(t.device, t.dtype) * 2 - 1
            t.mul_(1 + eps * u)


def sdpa_backend(name):
    """A context that runs scaled_dot_product_attention on one backend
    (math, efficient, flash, cudnn); "default" lets PyTorch choose."""
    import contextlib
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[name])


def cmd_parity(a):
    setup(a)
    model = load_weights(a.init, a.dtype, a.device)
    if a.perturb:
        perturb_(model, a.perturb, 12345)
    x, y, mh, meta = load_replay(a.replay, a.device)
    if int(meta.get("halt_max_steps", model.c["halt_max_steps"])) != model.c["halt_max_steps"]:
        sys.exit(f"hrm.py: replay drawn for halt_max_steps {meta['halt_max_steps']}, model has {model.c['halt_max_steps']}")
    tr = Trainer(model, train_config(a), x.shape[1], compile_=a.compile)
    steps = x.shape[0] if a.steps is None else min(a.steps, x.shape[0])
    with sdpa_backend(a.sdpa):
        for t in range(steps):
            print(json.dumps(tr.step(x[t], y[t], mh[t])), flush=True)
    if a.out:
        save_weights(model, a.out, {"step": str(steps)})


def cmd_train(a):
    setup(a)
    c, t = arch_config(a), train_config(a)
    model = load_weights(a.init, a.dtype, a.device) if a.init else new_model(c, a.dtype, a.device, seed=a.seed)
    c = model.c
    x, y = load_set(os.path.join(a.data, "train.safetensors"), a.device)
    tx, ty = load_set(os.path.join(a.data, "test.safetensors"), a.device)
    if a.eval_n:
        tx, ty = tx[:a.eval_n], ty[:a.eval_n]
    aug = Augment(x, y, a.num_aug, a.seed, a.device)
    g = torch.Generator(device="cpu").manual_seed(a.seed + 2)
    tr = Trainer(model, t, t["batch"], compile_=a.compile)
    start = time.time()
    for s in range(1, a.steps + 1):
        bi, bl = aug.batch(t["batch"])
        line = tr.step(bi, bl, exploration(t["batch"], c, g, a.device), total_steps=a.steps)
        if s % a.log_every == 0 or s == a.steps:
            line["elapsed_s"] = time.time() - start
            print(json.dumps(line), flush=True)
        if (a.eval_every and s % a.eval_every == 0) or s == a.steps:
            for halting in (True, False):
                r = evaluate(model, tx, ty, t["batch"], halting)
                r.update(step=s, elapsed_s=time.time() - start)
                print(json.dumps(r), flush=True)
    if a.out:
        save_weights(model, a.out, {"step": str(a.steps)})


def cmd_eval(a):
    setup(a)
    model = load_weights(a.ckpt, a.dtype, a.device)
    x, y = load_set(a.test, a.device)
    if a.n:
        x, y = x[:a.n], y[:a.n]
    if a.device == "cuda":  # one untimed batch: CUDA context, cuBLAS handles, kernels (and compile_'s graphs)
        evaluate(model, x[:a.batch], y[:a.batch], a.batch, True, compile_=a.compile)
        torch.cuda.synchronize()
    for halting in (True, False):
        start = time.time()
        r = evaluate(model, x, y, a.batch, halting, compile_=a.compile)
        if a.device == "cuda":
            torch.cuda.synchronize()
        r.update(ckpt=a.ckpt, seconds=time.time() - start)
        print(json.dumps(r), flush=True)


def cmd_bench(a):
    setup(a)
    c = arch_config(a)
    g = torch.Generator(device="cpu").manual_seed(1)
    sol = [(r * 3 + r // 3 + col) % 9 + 1 for r in range(9) for col in range(9)]
    y = torch.tensor(sol, dtype=torch.int32).repeat(a.batch, 1) + 1
    x = torch.where(torch.rand(a.batch, 81, generator=g) < 0.3, y, 1).to(torch.int32)
    x, y = x.to(a.device), y.to(a.device)
    for mode in a.modes.split(","):
        model = new_model(c, a.dtype, a.device, seed=1)
        tr = Trainer(model, train_config(a), a.batch, compile_=(mode == "compile"))
        mh = exploration(a.batch, c, g, a.device)
        ts = []
        for i in range(a.warmup + a.iters):
            if a.device == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
            t0 = time.time()
            tr.step(x, y, mh)
            if a.device == "cuda":
                e.record()
                e.synchronize()
                ms = s.elapsed_time(e)
            else:
                ms = (time.time() - t0) * 1e3
            if i >= a.warmup:
                ts.append(ms)
        ts.sort()
        print(json.dumps({"workload": "hrm-segment-step", "impl": "torch-" + mode, "dtype": a.dtype, "ms": ts[len(ts) // 2],
                          "batch": a.batch, "hidden": c["hidden"], "h_cycles": c["h_cycles"], "l_cycles": c["l_cycles"]}), flush=True)
        if a.no_eval:
            continue
        start = time.time()
        r = evaluate(model, x, y, a.batch, True, compile_=(mode == "compile"))
        if a.device == "cuda":
            torch.cuda.synchronize()
        print(json.dumps({"workload": "hrm-eval-batch", "impl": "torch-" + mode, "ms": (time.time() - start) * 1e3,
                          "batch": a.batch, "mean_segments": r["mean_segments"]}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def arch(sp):
        for k in ("hidden", "heads", "h_layers", "l_layers", "h_cycles", "l_cycles", "halt_max_steps"):
            sp.add_argument("--" + k.replace("_", "-"), type=int, dest=k)
        sp.add_argument("--expansion", type=float)
        sp.add_argument("--halt-exploration-prob", type=float, dest="halt_exploration_prob")

    def common(sp):
        sp.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
        sp.add_argument("--device", default="cuda")
        sp.add_argument("--compile", action="store_true", help="torch.compile the segment (as pretrain.py does)")

    def training(sp):
        for k in ("lr", "puzzle_emb_lr", "weight_decay", "puzzle_emb_weight_decay", "beta1", "beta2", "lr_min_ratio"):
            sp.add_argument("--" + k.replace("_", "-"), type=float, dest=k)
        sp.add_argument("--warmup", type=int)
        sp.add_argument("--batch", type=int)

    sp = sub.add_parser("init")
    sp.add_argument("--out", required=True)
    sp.add_argument("--seed", type=int, default=0)
    arch(sp)
    sp.set_defaults(fn=cmd_init, dtype="f32", device="cpu")

    sp = sub.add_parser("parity")
    sp.add_argument("--init", required=True)
    sp.add_argument("--replay", required=True)
    sp.add_argument("--steps", type=int)
    sp.add_argument("--out")
    sp.add_argument("--perturb", type=float, default=0.0)
    sp.add_argument("--sdpa", default="default", choices=("default", "math", "efficient", "flash", "cudnn"))
    common(sp)
    training(sp)
    sp.set_defaults(fn=cmd_parity)

    sp = sub.add_parser("train")
    sp.add_argument("--data", required=True)
    sp.add_argument("--init")
    sp.add_argument("--steps", type=int, default=1000)
    sp.add_argument("--num-aug", type=int, default=1000, dest="num_aug")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--log-every", type=int, default=100, dest="log_every")
    sp.add_argument("--eval-every", type=int, default=0, dest="eval_every")
    sp.add_argument("--eval-n", type=int, default=0, dest="eval_n")
    sp.add_argument("--out")
    arch(sp)
    common(sp)
    training(sp)
    sp.set_defaults(fn=cmd_train)

    sp = sub.add_parser("eval")
    sp.add_argument("--ckpt", required=True)
    sp.add_argument("--test", required=True)
    sp.add_argument("--batch", type=int, default=768)
    sp.add_argument("--n", type=int, default=0)
    common(sp)
    sp.set_defaults(fn=cmd_eval)

    sp = sub.add_parser("bench")
    sp.add_argument("--batch", type=int, default=768)
    sp.add_argument("--modes", default="eager,compile")
    sp.add_argument("--warmup", type=int, default=3)
    sp.add_argument("--iters", type=int, default=10)
    sp.add_argument("--no-eval", action="store_true", dest="no_eval", help="time the training step only")
    arch(sp)
    common(sp)
    sp.set_defaults(fn=cmd_bench)

    sp = sub.add_parser("selfcheck")
    sp.set_defaults(fn=lambda a: selfcheck())

    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
