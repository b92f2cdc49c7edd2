#!/usr/bin/python3
"""The Python PyTorch peer of decoder_train_bench: the same decoder (SCIENCE.md
B.2: learned embedding, pre-LN blocks, bias-free q/k/v/o with RoPE on q and k
(half-split rotation, base 10000), causal softmax, SiLU MLP with biases,
readout with bias, no final LayerNorm) from the same initial weights, trained
with AdamW on exactly the batches the C++ side dumped.

    /usr/bin/python3 bench/decoder_peer.py DUMP_FILE [--steps N] [--warmup W]

Prints one JSON object (model steps per second, the first losses).
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
        n, b, t, vocab, layers, d, heads, mlp = struct.unpack("<8q", f.read(64))
        lr, wd = struct.unpack("<2d", f.read(16))

        def tensor(*shape, dtype=np.float32):
            count = int(np.prod(shape))
            return torch.from_numpy(np.frombuffer(f.read(count * np.dtype(dtype).itemsize), dtype=dtype)
                                    .reshape(shape).copy())

        params = [tensor(vocab, d)]
        for _ in range(layers):
            params += [tensor(d), tensor(d), tensor(d, d), tensor(d, d), tensor(d, d), tensor(d, d),
                       tensor(d), tensor(d), tensor(d, mlp), tensor(mlp), tensor(mlp, d), tensor(d)]
        params += [tensor(d, vocab), tensor(vocab)]
        batches = [tensor(b, t, dtype=np.int64) for _ in range(n)]
    return params, batches, dict(layers=layers, d=d, heads=heads, lr=lr, wd=wd, t=t)


class Decoder(torch.nn.Module):
    def __init__(self, params, layers, d, heads, t):
        super().__init__()
        self.p = torch.nn.ParameterList([torch.nn.Parameter(x) for x in params])
        self.layers, self.d, self.heads = layers, d, heads
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

    def forward(self, tokens):
        p = self.p
        B, T = tokens.shape
        H, dh = self.heads, self.d // self.heads
        x = p[0][tokens]
        for l in range(self.layers):
            ln1w, ln1b, wq, wk, wv, wo, ln2w, ln2b, w1, b1, w2, b2 = p[1 + 12 * l: 13 + 12 * l]
            h = F.layer_norm(x, (self.d,)) * ln1w + ln1b
            split = lambda w: (h @ w).view(B, T, H, dh).transpose(1, 2)
            q, k, v = self.rope(split(wq)), self.rope(split(wk)), split(wv)
            att = (q @ k.transpose(-1, -2)) / dh ** 0.5
            att = att.masked_fill(self.mask[:T, :T], float("-inf")).softmax(-1)
            x = x + (att @ v).transpose(1, 2).reshape(B, T, self.d) @ wo
            m = F.silu((F.layer_norm(x, (self.d,)) * ln2w + ln2b) @ w1 + b1)
            x = x + m @ w2 + b2
        return x @ p[-2] + p[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    params, batches, cfg = load(a.dump)
    model = Decoder(params, cfg["layers"], cfg["d"], cfg["heads"], cfg["t"])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["wd"])
    first = []

    def step(i):
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
