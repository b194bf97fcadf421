#!/usr/bin/env python3
"""PyTorch reference for gpukit's second-order optimizers (libgpu/optim),
written from the papers (and the choices libgpu/optim documents), in
float64:

  Shampoo  Gupta, Koren & Singer 2018; Anil et al. 2020 — block-diagonal
           statistics L ← β2·L + (1−β2)·GGᵀ, R ← β2·R + (1−β2)·GᵀG (β2 = 1:
           sums), roots (L + rI)^(-1/4) every update_freq steps from
           start_step (r = matrix_eps + rel_eps·‖L‖_F), the filtered gradient
           m̂ = EMA_β1(g)/(1−β1ᵗ), an Adam (or AdaGrad) graft per block
           (Agarwal et al. 2020), decoupled weight decay; roots put in use
           max_staleness steps after their refresh with async.
  SOAP     Vyas et al. 2024 — Adam in the eigenbasis of Shampoo's statistics
           (βs = β2), the basis refreshed at steps 1, 1+k, ... (first by
           eigendecomposition, then by one power-iteration step and QR with
           V permuted to follow the basis' rows); step 1
           gathers statistics only; bias correction √(1−β2ᵗ)/(1−β1ᵗ) with t
           the updates so far; AdamW (PyTorch's) for vectors.
  Muon     Jordan et al. 2024 — Nesterov momentum, Newton–Schulz (a, b, c) =
           (3.4445, −4.7750, 2.0315) × 5 on U/‖U‖_F, step scaled by
           max(1, m/n)^½; AdamW for vectors and names with wte/wpe/emb/head.
  K-FAC    Martens & Grosse 2015 — A = E[āāᵀ], G = E[(N·dy)(N·dy)ᵀ] moving
           averages (the first overwrites), π-damped inverses every
           update_freq steps, KL clipping (Ba et al. 2017), SGD momentum;
           SGD momentum for parameters outside the layers.

  optim.py parity FILE
      FILE is a safetensors file written by libgpu/optim's TestTorchParity:
      the optimizer's Spec (metadata "spec", JSON), "names" and "layers"
      (JSON), the initial parameters p<i>, the gradients g<s>_<i> of every
      step s (and for K-FAC the layers' inputs x<s>_<l> and output
      gradients dy<s>_<l>), and gpukit's parameters after the last step
      w<i>. Runs the same steps here and prints {"rel_err": e, "steps": n}:
      ‖gpukit − torch‖ over the size of the run's total update.

Needs torch and safetensors.
"""
import argparse
import json
import math

import torch
from safetensors import safe_open

D = torch.float64


def blocking(m, n, max_block):
    rows, cols = -(-m // max_block), -(-n // max_block)
    br, bc = -(-m // rows), -(-n // cols)
    return [(i * br, j * bc, min(br, m - i * br), min(bc, n - j * bc)) for i in range(rows) for j in range(cols)]


def as_matrix(t):
    return t.reshape(1, -1) if t.dim() == 1 else t.reshape(t.shape[0], -1)


def inv_root(s, p, ridge):
    w, v = torch.linalg.eigh(s)
    return (v * (w.clamp_min(0) + ridge).pow(-1.0 / p)) @ v.T


def eig_rows(s):
    _, v = torch.linalg.eigh(s)
    return v.T


def soap_qr_rows(s, q):
    """SOAP's refresh after the first (Vyas et al. 2024, the reference
    code's get_orthogonal_matrix_QR; ops.SOAPBasis): rows q_i of the basis
    in use ordered by the estimates q_i·s·q_iᵀ, the rows s·q_i
    orthonormalised in descending order of them (Gram–Schmidt, positive
    diagonal), returned in ascending order with the permutation perm (new
    row k refines old row perm[k])."""
    p = q @ s
    perm = torch.argsort((p * q).sum(1), stable=True)
    g = p[perm.flip(0)]
    u, r = torch.linalg.qr(g.T)
    sign = torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(D)
    return (u * sign).T.flip(0), perm


def matches(name, subs):
    return any(x and x in name for x in subs or [])


class Shampoo:
    def __init__(self, spec, params, names):
        self.s, self.t, self.pending = spec, 0, 0
        self.st = []
        for p, name in zip(params, names):
            m = as_matrix(p)
            st = {"m": torch.zeros_like(m), "v": torch.zeros_like(m), "blocks": []}
            if p.dim() >= 2 and not matches(name, spec.get("exclude")):
                for (r0, c0, rr, rc) in blocking(m.shape[0], m.shape[1], spec["max_block"]):
                    st["blocks"].append({"at": (r0, c0, rr, rc), "L": torch.zeros(rr, rr, dtype=D),
                                         "R": torch.zeros(rc, rc, dtype=D), "PL": torch.eye(rr, dtype=D),
                                         "PR": torch.eye(rc, dtype=D)})
            self.st.append(st)

    def step(self, params, grads):
        s = self.s
        self.t += 1
        t = self.t
        b2 = s["beta2"]
        for st, g in zip(self.st, grads):
            g = as_matrix(g)
            for b in st["blocks"]:
                r0, c0, rr, rc = b["at"]
                gb = g[r0:r0 + rr, c0:c0 + rc]
                if b2 == 1:
                    b["L"] += gb @ gb.T
                    b["R"] += gb.T @ gb
                else:
                    b["L"] = b2 * b["L"] + (1 - b2) * gb @ gb.T
                    b["R"] = b2 * b["R"] + (1 - b2) * gb.T @ gb
        lag = s["max_staleness"] if s["async"] else 0
        if self.pending and t >= self.pending + lag:
            self.publish()
        start, every = s["start_step"], s["update_freq"]
        if t >= start and (t - start) % every == 0:
            for st in self.st:
                for b in st["blocks"]:
                    eps, rel = s["matrix_eps"], s["rel_eps"]
                    b["nL"] = inv_root(b["L"], 4, eps + rel * torch.linalg.norm(b["L"]))
                    b["nR"] = inv_root(b["R"], 4, eps + rel * torch.linalg.norm(b["R"]))
            self.pending = t
            if lag == 0:
                self.publish()
        ready = t >= start + lag
        for p, g, st in zip(params, grads, self.st):
            pm, g = as_matrix(p), as_matrix(g)
            b1 = s["beta1"]
            mh = g
            if b1 > 0:
                st["m"] = b1 * st["m"] + (1 - b1) * g
                mh = st["m"] / (1 - b1 ** t)
            if s["graft"] == "adagrad":
                st["v"] = st["v"] + g * g
                vh = st["v"]
            else:
                gb2 = s["graft_beta2"]
                st["v"] = gb2 * st["v"] + (1 - gb2) * g * g
                vh = st["v"] / (1 - gb2 ** t)
            a = mh / (vh.sqrt() + s["graft_eps"])
            d = a
            if ready and st["blocks"]:
                d = torch.zeros_like(a)
                for b in st["blocks"]:
                    r0, c0, rr, rc = b["at"]
                    sb = b["PL"] @ mh[r0:r0 + rr, c0:c0 + rc] @ b["PR"]
                    ns = torch.linalg.norm(sb)
                    scale = torch.linalg.norm(a[r0:r0 + rr, c0:c0 + rc]) / ns if ns > 0 else 0
                    d[r0:r0 + rr, c0:c0 + rc] = scale * sb
            pm -= s["lr"] * (d + s["weight_decay"] * pm)

    def publish(self):
        for st in self.st:
            for b in st["blocks"]:
                b["PL"], b["PR"] = b["nL"], b["nR"]
        self.pending = 0


class AdamW:
    """PyTorch's AdamW update on one parameter (float64)."""

    def __init__(self, p, lr, b1, b2, eps, wd):
        self.m, self.v, self.t = torch.zeros_like(p), torch.zeros_like(p), 0
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, b1, b2, eps, wd

    def step(self, p, g):
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * g
        self.v = self.b2 * self.v + (1 - self.b2) * g * g
        mh, vh = self.m / (1 - self.b1 ** self.t), self.v / (1 - self.b2 ** self.t)
        p -= self.lr * (mh / (vh.sqrt() + self.eps) + self.wd * p)


class SOAP:
    def __init__(self, spec, params, names):
        self.s, self.t = spec, 0
        self.st = []
        for p, name in zip(params, names):
            if p.dim() < 2 or matches(name, spec.get("exclude")):
                self.st.append({"adam": AdamW(p, spec["lr"], spec["beta1"], spec["beta2"], spec["eps"], spec["weight_decay"])})
                continue
            m = as_matrix(p)
            blocks = [{"at": at, "L": torch.zeros(at[2], at[2], dtype=D), "R": torch.zeros(at[3], at[3], dtype=D),
                       "QL": torch.eye(at[2], dtype=D), "QR": torch.eye(at[3], dtype=D),
                       "V": torch.zeros(at[2], at[3], dtype=D)} for at in blocking(m.shape[0], m.shape[1], spec["max_block"])]
            self.st.append({"m": torch.zeros_like(m), "blocks": blocks})

    def step(self, params, grads):
        s = self.s
        self.t += 1
        first = self.t == 1
        refresh = (self.t - 1) % s["update_freq"] == 0
        tu = self.t - 1
        b1, b2, bs, eps = s["beta1"], s["beta2"], s["beta2"], s["eps"]
        for p, g, st in zip(params, grads, self.st):
            if "adam" in st:
                if not first:
                    st["adam"].step(p, g)
                continue
            pm, g = as_matrix(p), as_matrix(g)
            if not first:
                st["m"] = b1 * st["m"] + (1 - b1) * g
            step = torch.zeros_like(pm)
            for b in st["blocks"]:
                r0, c0, rr, rc = b["at"]
                gb = g[r0:r0 + rr, c0:c0 + rc]
                b["L"] = bs * b["L"] + (1 - bs) * gb @ gb.T
                b["R"] = bs * b["R"] + (1 - bs) * gb.T @ gb
                if refresh and (first or s.get("eigh_refresh")):
                    b["QL"], b["QR"] = eig_rows(b["L"]), eig_rows(b["R"])
                elif refresh:
                    b["QL"], pl = soap_qr_rows(b["L"], b["QL"])
                    b["QR"], pr = soap_qr_rows(b["R"], b["QR"])
                    b["V"] = b["V"][pl][:, pr]
                if first:
                    continue
                gr = b["QL"] @ gb @ b["QR"].T
                mr = b["QL"] @ st["m"][r0:r0 + rr, c0:c0 + rc] @ b["QR"].T
                b["V"] = b2 * b["V"] + (1 - b2) * gr * gr
                step[r0:r0 + rr, c0:c0 + rc] = b["QL"].T @ (mr / (b["V"].sqrt() + eps)) @ b["QR"]
            if not first:
                coef = math.sqrt(1 - b2 ** tu) / (1 - b1 ** tu)
                pm -= s["lr"] * (coef * step + s["weight_decay"] * pm)


def newton_schulz(x, steps=5, a=3.4445, b=-4.7750, c=2.0315):
    for _ in range(steps):
        g = x @ x.T
        x = a * x + (b * g + c * g @ g) @ x
    return x


class Muon:
    def __init__(self, spec, params, names):
        self.s = spec
        self.st = []
        subs = spec.get("exclude") or ["wte", "wpe", "emb", "head"]
        for p, name in zip(params, names):
            if p.dim() != 2 or matches(name, subs):
                wd = 0 if p.dim() < 2 else spec["weight_decay"]
                self.st.append({"adam": AdamW(p, spec["adam_lr"], spec["beta1"], spec["beta2"], spec["eps"], wd)})
            else:
                self.st.append({"buf": torch.zeros_like(p)})

    def step(self, params, grads):
        s = self.s
        for p, g, st in zip(params, grads, self.st):
            if "adam" in st:
                st["adam"].step(p, g)
                continue
            mu = s["momentum"]
            st["buf"] = mu * st["buf"] + g
            u = g + mu * st["buf"]  # Nesterov (optim.DefaultMuon)
            x = u / (torch.linalg.norm(u) + 1e-7)
            m, n = p.shape
            o = newton_schulz(x.T).T if m > n else newton_schulz(x)
            p.mul_(1 - s["lr"] * s["weight_decay"]).sub_(s["lr"] * math.sqrt(max(1, m / n)) * o)


class KFAC:
    def __init__(self, spec, params, names, layers):
        self.s, self.t = spec, 0
        self.names = names
        self.layers = layers
        idx = {n: i for i, n in enumerate(names)}
        self.lay = []
        inlayer = set()
        for l in layers:
            w, b = idx[l["weight"]], idx.get(l.get("bias") or "")
            out, inn = params[w].shape
            din = inn + (1 if b is not None else 0)
            self.lay.append({"w": w, "b": b, "A": None, "G": None, "Ai": torch.eye(din, dtype=D),
                             "Gi": torch.eye(out, dtype=D), "bw": torch.zeros_like(params[w]),
                             "bb": torch.zeros_like(params[b]) if b is not None else None})
            inlayer.update([w] + ([b] if b is not None else []))
        self.rest = [i for i in range(len(params)) if i not in inlayer]
        self.rbuf = {i: torch.zeros_like(params[i]) for i in self.rest}

    def step(self, params, grads, xs, dys):
        s = self.s
        self.t += 1
        rho, lr, mu, wd = s["stat_decay"], s["lr"], s["momentum"], s["weight_decay"]
        vs, total = [], 0.0
        for k, L in enumerate(self.lay):
            x, dy = xs[k], dys[k]
            n = x.shape[0]
            if L["b"] is not None:
                x = torch.cat([x, torch.ones(n, 1, dtype=D)], 1)
            a = x.T @ x / n
            gg = (n * dy).T @ (n * dy) / n
            if self.t % s["cov_every"] == 0:
                if self.t == s["cov_every"]:
                    L["A"], L["G"] = a, gg
                else:
                    L["A"], L["G"] = rho * L["A"] + (1 - rho) * a, rho * L["G"] + (1 - rho) * gg
            if (self.t - 1) % s["update_freq"] == 0:
                A, G = L["A"], L["G"]
                pi = math.sqrt((torch.trace(A) / A.shape[0]) / (torch.trace(G) / G.shape[0]))
                sl = math.sqrt(s["damping"])
                L["Ai"] = torch.linalg.inv(A + pi * sl * torch.eye(A.shape[0], dtype=D))
                L["Gi"] = torch.linalg.inv(G + sl / pi * torch.eye(G.shape[0], dtype=D))
            gm = grads[L["w"]]
            if L["b"] is not None:
                gm = torch.cat([gm, grads[L["b"]][:, None]], 1)
            v = L["Gi"] @ gm @ L["Ai"]
            vs.append(v)
            total += float((v * gm).sum())
        nu = 1.0
        if s["kl_clip"] > 0 and lr * lr * total > 0:
            nu = min(1.0, math.sqrt(s["kl_clip"] / (lr * lr * total)))
        for L, v in zip(self.lay, vs):
            w = params[L["w"]]
            inn = w.shape[1]
            L["bw"] = mu * L["bw"] + nu * v[:, :inn] + wd * w
            w -= lr * L["bw"]
            if L["b"] is not None:
                L["bb"] = mu * L["bb"] + nu * v[:, inn]
                params[L["b"]] -= lr * L["bb"]
        for i in self.rest:
            self.rbuf[i] = mu * self.rbuf[i] + grads[i] + wd * params[i]
            params[i] -= lr * self.rbuf[i]


def cmd_parity(a):
    with safe_open(a.file, "pt") as f:
        meta = f.metadata()
        spec = json.loads(meta["spec"])
        names = json.loads(meta["names"])
        layers = json.loads(meta.get("layers") or "[]")
        steps = int(meta["steps"])
        t = {k: f.get_tensor(k).to(D) for k in f.keys()}
    params = [t[f"p{i}"].clone() for i in range(len(names))]
    start = [p.clone() for p in params]
    name = spec["name"]
    if name == "shampoo":
        opt = Shampoo(spec, params, names)
    elif name == "soap":
        opt = SOAP(spec, params, names)
    elif name == "muon":
        opt = Muon(spec, params, names)
    elif name == "kfac":
        opt = KFAC(spec, params, names, layers)
    else:
        raise SystemExit(f"optim.py: no reference for {name}")
    for s in range(steps):
        grads = [t[f"g{s}_{i}"] for i in range(len(names))]
        if name == "kfac":
            opt.step(params, grads, [t[f"x{s}_{k}"] for k in range(len(layers))], [t[f"dy{s}_{k}"] for k in range(len(layers))])
        else:
            opt.step(params, grads)
    num = sum(float(((t[f"w{i}"] - p) ** 2).sum()) for i, p in enumerate(params))
    den = sum(float(((p - p0) ** 2).sum()) for p, p0 in zip(params, start))
    print(json.dumps({"rel_err": math.sqrt(num / den), "steps": steps, "optimizer": name}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("parity")
    q.add_argument("file")
    a = p.parse_args()
    cmd_parity(a)


if __name__ == "__main__":
    main()
