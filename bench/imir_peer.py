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
    def __init__(self, vocab, positions, layers, heads, std=0.01, first_layer="gather"):
        super().__init__()
        self.vocab, self.heads, self.first_layer = vocab, heads, first_layer
        d = vocab + positions
        self.kq = torch.nn.ParameterList()
        for _ in range(layers):
            self.kq.append(torch.nn.Parameter(torch.randn(heads, d, d) * std))
            d *= heads + 1
        self.readout = torch.nn.Parameter(torch.randn(vocab, d) * std)

    def embed(self, tok, pid):
        """X0: one-hot token and position (offset by V) columns, d0 = V + P."""
        x = torch.zeros(*tok.shape, self.kq[0].shape[-1])
        x.scatter_(-1, tok.unsqueeze(-1), 1.0)
        x.scatter_(-1, (pid + self.vocab).unsqueeze(-1), 1.0)
        return x

    def one_hot_layer(self, w, x, tok, pid, causal):
        """Layer 1 on the one-hot input x (= X0) without a matmul: X0 W is the sum of two
        gathered rows, the scores gather two columns of it, the heads' outputs
        scatter the attention rows into the token and position columns."""
        h, d0 = w.shape[0], w.shape[-1]
        b, t = tok.shape
        pos = pid + self.vocab
        q = w[:, tok] + w[:, pos]                                       # [H, B, T, d0]
        ka = tok[None, :, None, :].expand(h, b, t, t)
        kp = pos[None, :, None, :].expand(h, b, t, t)
        scores = q.gather(-1, ka) + q.gather(-1, kp)                    # [H, B, T, T]
        a = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
        y = torch.zeros(h, b, t, d0).scatter_add(-1, ka, a).scatter_add(-1, kp, a)
        return torch.cat([x, y.permute(1, 2, 0, 3).reshape(b, t, -1)], -1)

    def forward(self, tok, pid):
        b, t = tok.shape
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        x, layers = self.embed(tok, pid), self.kq[:-1]
        if self.first_layer == "gather" and len(self.kq) > 1:
            x, layers = self.one_hot_layer(self.kq[0], x, tok, pid, causal), self.kq[1:-1]
        for w in layers:
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
    ap.add_argument("--first-layer", choices=["gather", "matmul"], default="gather",
                    help="layer 1 on the one-hot input by gathers (default) or as the dense matmuls")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    batches, vocab, positions, layers, heads, lr = load(args.batches)
    model = Imir(vocab, positions, layers, heads, first_layer=args.first_layer)
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
                      "first_layer": args.first_layer,
                      "model_steps_per_s": round(args.steps / dt, 2)}))


if __name__ == "__main__":
    main()
