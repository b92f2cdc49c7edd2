#!/usr/bin/python3
"""The Python PyTorch peer of imir_train_bench: the same IMIR block-residual
model (SCIENCE.md B.1: one-hot embeddings, merged key-query matrix per head,
fixed copying value/output maps, concatenated residual, readout at the last
position), trained with plain SGD on exactly the batches the C++ side dumped.

    /usr/bin/python3 bench/imir_peer.py BATCHES_FILE [--steps N] [--threads T]

Prints one JSON object (model steps per second).
"""
import argparse
import json
import struct
import time

import numpy as np
import torch


def load(path):
    with open(path, "rb") as f:
        n, b, t, vocab, positions, layers, heads = struct.unpack("<7q", f.read(56))
        (lr,) = struct.unpack("<d", f.read(8))
        batches = []
        for _ in range(n):
            tok = np.frombuffer(f.read(8 * b * t), dtype=np.int64).reshape(b, t)
            pid = np.frombuffer(f.read(8 * b * t), dtype=np.int64).reshape(b, t)
            tgt = np.frombuffer(f.read(8 * b), dtype=np.int64)
            batches.append(tuple(torch.from_numpy(a.copy()) for a in (tok, pid, tgt)))
    return batches, vocab, positions, layers, heads, lr


class Imir(torch.nn.Module):
    def __init__(self, vocab, positions, layers, heads, std=0.01):
        super().__init__()
        self.vocab, self.heads = vocab, heads
        d = vocab + positions
        self.kq = torch.nn.ParameterList()
        for _ in range(layers):
            self.kq.append(torch.nn.Parameter(torch.randn(heads, d, d) * std))
            d *= heads + 1
        self.readout = torch.nn.Parameter(torch.randn(vocab, d) * std)

    def forward(self, tok, pid):
        b, t = tok.shape
        x = torch.zeros(b, t, self.kq[0].shape[-1])                      # d0 = V + P
        x.scatter_(-1, tok.unsqueeze(-1), 1.0)
        x.scatter_(-1, (pid + self.vocab).unsqueeze(-1), 1.0)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        for w in self.kq[:-1]:
            d = x.shape[-1]
            # One GEMM over every (sequence, position) row, as the C++ side does (a
            # broadcast [B, 1, T, d] @ [H, 1, d, d] copies w per sequence).
            q = torch.matmul(x.reshape(1, b * t, d), w).view(-1, b, t, d).transpose(0, 1)  # [B, H, T, d]
            scores = torch.matmul(q, x.unsqueeze(1).transpose(-1, -2))  # [B, H, T, T]
            a = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
            y = torch.matmul(a, x.unsqueeze(1))                         # [B, H, T, d]
            x = torch.cat([x, y.permute(0, 2, 1, 3).reshape(b, t, -1)], -1)
        xq = x[:, -1]                                                   # [B, d]
        q = torch.matmul(xq, self.kq[-1]).transpose(0, 1)               # [H, B, d] -> [B, H, d] (one GEMM per head)
        scores = torch.einsum("bhd,btd->bht", q, x)
        y = torch.einsum("bht,btd->bhd", torch.softmax(scores, -1), x)
        xl = torch.cat([xq, y.reshape(b, -1)], -1)
        return xl @ self.readout.t()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("batches")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    batches, vocab, positions, layers, heads, lr = load(args.batches)
    model = Imir(vocab, positions, layers, heads)
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(i):
        tok, pid, tgt = batches[i % len(batches)]
        loss = torch.nn.functional.cross_entropy(model(tok, pid), tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "python", "torch": torch.__version__, "threads": args.threads,
                      "model_steps_per_s": round(args.steps / dt, 2)}))


if __name__ == "__main__":
    main()
