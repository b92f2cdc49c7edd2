#!/usr/bin/python3
"""The Python PyTorch peer of decoder_train_bench: the same decoder (SCIENCE.md
B.2: learned embedding, pre-LN blocks, bias-free q/k/v/o with RoPE on q and k
(half-split rotation, base 10000), causal softmax, SiLU MLP with biases,
readout with bias, no final LayerNorm; or B.3 for E2 regression: bias-free
read-in of (d+1)-vectors with a learnable pad in the mapsto layout, biases on
q/k/v/o, tanh-GELU MLP, final LayerNorm, bias-free scalar head, squared
error on the y positions) from the same initial weights, trained with AdamW
on exactly the batches the C++ side dumped.

    /usr/bin/python3 bench/decoder_peer.py DUMP_FILE [--steps N] [--warmup W] [--threads T]
        [--members E [--vmap]]

Prints one JSON object (model steps per second, the first losses). With
--members E (issue 48's packed sweep): E members from the same initial
weights, each on its own batch of the dump, either one after another (E
separate models and optimisers, as E runs would be) or, with --vmap, as one
ensemble step through functorch's vmap over the stacked parameters (the
peer's own way of packing); member_steps_per_s counts member steps.
"""
import argparse
import json
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F


def load(path):
    with open(path, "rb") as f:
        n, b, t, vocab, layers, d, heads, mlp, din, abias, fln, gelu = struct.unpack("<12q", f.read(96))
        lr, wd = struct.unpack("<2d", f.read(16))

        def tensor(*shape, dtype=np.float32):
            count = int(np.prod(shape))
            return torch.from_numpy(np.frombuffer(f.read(count * np.dtype(dtype).itemsize), dtype=dtype)
                                    .reshape(shape).copy())

        # The engine's parameter order (DecoderModel's constructor).
        params = [tensor(din, d), tensor(din)] if din else [tensor(vocab, d)]
        for _ in range(layers):
            block = [tensor(d), tensor(d), tensor(d, d), tensor(d, d), tensor(d, d), tensor(d, d)]
            if abias:
                block += [tensor(d) for _ in range(4)]
            params += block + [tensor(d), tensor(d), tensor(d, mlp), tensor(mlp), tensor(mlp, d), tensor(d)]
        if fln:
            params += [tensor(d), tensor(d)]
        params += [tensor(d, vocab)] + ([] if din else [tensor(vocab)])
        if din:  # x [B, n, d] and y [B, n] per batch
            batches = [(tensor(b, t // 3, din - 1), tensor(b, t // 3)) for _ in range(n)]
        else:
            batches = [tensor(b, t, dtype=np.int64) for _ in range(n)]
    return params, batches, dict(layers=layers, d=d, heads=heads, lr=lr, wd=wd, t=t, din=din, abias=bool(abias),
                                 fln=bool(fln), gelu=bool(gelu))


class Decoder(torch.nn.Module):
    def __init__(self, params, layers, d, heads, t, din=0, abias=False, fln=False, gelu=False):
        super().__init__()
        self.p = torch.nn.ParameterList([torch.nn.Parameter(x) for x in params])
        self.layers, self.d, self.heads = layers, d, heads
        self.din, self.abias, self.fln, self.gelu = din, abias, fln, gelu
        dh = d // heads
        half = dh // 2
        inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
        angle = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos, self.sin = angle.cos().float(), angle.sin().float()
        self.mask = torch.ones(t, t, dtype=torch.bool).triu(1)

    def rope(self, x):
        half = x.shape[-1] // 2
        c, s = self.cos[: x.shape[-2]], self.sin[: x.shape[-2]]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    def mapsto(self, x, y):
        # x_1 |- y_1 x_2 |- y_2 ...: [x; 0], the pad, [0_d; y].
        B, n, dx = x.shape
        xs = torch.cat([x, x.new_zeros(B, n, 1)], -1)
        ys = torch.cat([x.new_zeros(B, n, dx), y[..., None]], -1)
        pads = self.p[1].expand(B, n, dx + 1)
        return torch.stack([xs, pads, ys], 2).reshape(B, 3 * n, dx + 1)

    def forward(self, inputs):
        p = self.p
        B, T = inputs.shape[:2]
        H, dh = self.heads, self.d // self.heads
        x = inputs @ p[0] if self.din else p[0][inputs]
        i = 2 if self.din else 1
        for _ in range(self.layers):
            ln1w, ln1b, wq, wk, wv, wo = p[i: i + 6]
            i += 6
            bq = bk = bv = bo = 0
            if self.abias:
                bq, bk, bv, bo = p[i: i + 4]
                i += 4
            ln2w, ln2b, w1, b1, w2, b2 = p[i: i + 6]
            i += 6
            h = F.layer_norm(x, (self.d,)) * ln1w + ln1b
            split = lambda w, b: (h @ w + b).view(B, T, H, dh).transpose(1, 2)
            q, k, v = self.rope(split(wq, bq)), self.rope(split(wk, bk)), split(wv, bv)
            att = (q @ k.transpose(-1, -2)) / dh ** 0.5
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
            x = x + (att @ v).transpose(1, 2).reshape(B, T, self.d) @ wo + bo
            m = (F.layer_norm(x, (self.d,)) * ln2w + ln2b) @ w1 + b1
            m = F.gelu(m, approximate="tanh") if self.gelu else F.silu(m)
            x = x + m @ w2 + b2
        if self.fln:
            x = F.layer_norm(x, (self.d,)) * p[i] + p[i + 1]
            i += 2
        return x @ p[i] if self.din else x @ p[i] + p[i + 1]


def token_loss(logits, tokens):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def members_rate(params, batches, cfg, members, steps, warmup, vmap):
    """Member steps per second of `members` token-task members (see the docstring)."""
    make = lambda: Decoder([p.clone() for p in params], cfg["layers"], cfg["d"], cfg["heads"], cfg["t"])
    if not vmap:  # one run after another: each its own model, optimiser and batches
        total = 0.0
        for e in range(members):
            model = make()
            opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["wd"])
            for i in range(warmup + steps):
                if i == warmup:
                    t0 = time.perf_counter()
                tokens = batches[(e + i) % len(batches)]
                loss = token_loss(model(tokens), tokens)
                opt.zero_grad()
                loss.backward()
                opt.step()
            total += time.perf_counter() - t0
        return members * steps / total
    from functorch import combine_state_for_ensemble, vmap as fvmap
    fmodel, stacked, buffers = combine_state_for_ensemble([make() for _ in range(members)])
    stacked = [torch.nn.Parameter(p.detach().clone()) for p in stacked]
    opt = torch.optim.AdamW(stacked, lr=cfg["lr"], weight_decay=cfg["wd"])
    n = len(batches)
    grouped = [torch.stack([batches[(e + i) % n] for e in range(members)]) for i in range(n)]  # [E, B, T]
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        tokens = grouped[i % n]
        logits = fvmap(fmodel)(stacked, buffers, tokens)  # [E, B, T, V]
        loss = sum(token_loss(logits[e], tokens[e]) for e in range(members))  # each member's mean loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return members * steps / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--members", type=int, default=0)
    ap.add_argument("--vmap", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    params, batches, cfg = load(a.dump)
    if a.members:
        if cfg["din"]:
            raise SystemExit("--members: token tasks only")
        rate = members_rate(params, batches, cfg, a.members, a.steps, a.warmup, a.vmap)
        print(json.dumps({"side": "python", "members": a.members, "vmap": a.vmap, "threads": a.threads,
                          "member_steps_per_s": round(rate, 3)}))
        return
    model = Decoder(params, cfg["layers"], cfg["d"], cfg["heads"], cfg["t"], cfg["din"], cfg["abias"], cfg["fln"],
                    cfg["gelu"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["wd"])
    first = []

    def step(i):
        if cfg["din"]:  # E2: squared error of the prediction at each |- (positions 3i + 1)
            x, y = batches[i % len(batches)]
            loss = ((model(model.mapsto(x, y))[:, 1::3, 0] - y) ** 2).mean()
        else:
            tokens = batches[i % len(batches)]
            logits = model(tokens)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if len(first) < 5:
            first.append(loss.item())

    for i in range(a.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(i)
    rate = a.steps / (time.perf_counter() - t0)
    print(json.dumps({"side": "python", "model_steps_per_s": round(rate, 3),
                      "first_losses": [round(x, 6) for x in first]}))


if __name__ == "__main__":
    main()
