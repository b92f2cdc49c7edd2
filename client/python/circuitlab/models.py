"""Trained circuitlab models in PyTorch: the weights ExportWeights (or `circuitlab export`) writes,
loaded into torch.nn.Modules whose forward pass is the engine's (docs/reference/weights.md).

    import circuitlab
    model = circuitlab.load_model("r1.safetensors")       # a file `circuitlab export` wrote
    model = client.load_model("r1", step=300)              # or straight from a server
    logits, cache = model.run_with_cache(tokens, positions)  # IMIR: a position id beside each token

`run_with_cache` returns the tensors at the same hook points, in the same shapes, as the server's
GetActivations (batch first): IMIR "embed", "L{l}.attn", "L{l}.H{h}.out", "L{l}.resid"; decoder
"embed", "L{l}.resid_pre", "L{l}.attn.pattern", "L{l}.attn.head", "L{l}.post_attn", "L{l}.post_mlp",
"final_ln"; both "logits". Layers and heads count from 1, as on every surface (the coordinate labels'
L2H1 is layer 2, head 1).

Needs PyTorch (Debian: python3-torch); the rest of the package does not.
"""
import json
import math
import struct


def read_safetensors(data):
    """(tensors, metadata) of a safetensors file's bytes: {name: torch.Tensor (float32)}, {str: str}."""
    import torch
    if len(data) < 8:
        raise ValueError("not a safetensors file: shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"not a safetensors file: header of {n} bytes in a file of {len(data)}")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = memoryview(data)[8 + n:]
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.float32)
        tensors[name] = flat.reshape(info["shape"]) if info["shape"] else flat.reshape(())
    return tensors, metadata


def _causal(T, device):
    import torch
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)


def _modules():
    import torch
    from torch import nn

    class ImirModel(nn.Module):
        """The IMIR attention-only block model (SCIENCE.md B.1), dense: X0 = [onehot(token); onehot(position)],
        each layer appends every head's A X (A = softmax_causal(X W X^T)), logits = W_out x."""

        def __init__(self, config, tensors):
            super().__init__()
            self.config = config
            self.vocab, self.positions = config["vocab"], config["positions"]
            self.layers, self.heads = config["layers"], config["heads"]
            self.kq = nn.ParameterList([nn.Parameter(tensors[f"L{l + 1}.kq"].clone()) for l in range(self.layers)])
            self.out = nn.Parameter(tensors["out"].clone())

        def forward(self, tokens, positions):
            """Logits [B, T, V] at every position from token ids and position ids [B, T] (int64)."""
            return self.run_with_cache(tokens, positions, cache=False)[0]

        def run_with_cache(self, tokens, positions, cache=True):
            tokens, positions = torch.as_tensor(tokens), torch.as_tensor(positions)
            if tokens.dim() == 1:
                tokens, positions = tokens.unsqueeze(0), positions.unsqueeze(0)
            if tokens.shape != positions.shape:
                raise ValueError(f"tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)} differ")
            kept = {}
            keep = (lambda name, v: kept.__setitem__(name, v.detach().clone())) if cache else (lambda name, v: None)
            B, T = tokens.shape
            dtype = self.out.dtype
            x = torch.zeros(B, T, self.vocab + self.positions, dtype=dtype, device=self.out.device)
            x.scatter_(-1, tokens.long().unsqueeze(-1), 1.0)
            x.scatter_(-1, (positions.long() + self.vocab).unsqueeze(-1), 1.0)
            keep("embed", x)
            causal = _causal(T, x.device)
            for l in range(self.layers):
                w = self.kq[l]                                       # [H, d, d]
                scores = torch.einsum("btd,hde,bse->bhts", x, w, x)  # X W X^T per head
                a = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
                keep(f"L{l + 1}.attn", a)                            # [B, H, T, T]
                y = torch.einsum("bhts,bsd->bhtd", a, x)             # what each head copies
                for h in range(self.heads):
                    keep(f"L{l + 1}.H{h + 1}.out", y[:, h])
                x = torch.cat([x] + [y[:, h] for h in range(self.heads)], -1)
                keep(f"L{l + 1}.resid", x)
            logits = x @ self.out.T
            keep("logits", logits)
            return logits, kept

    class DecoderModel(nn.Module):
        """The decoder-only transformer of SCIENCE.md B.2 (pre-LayerNorm blocks, RoPE in GPT-NeoX halves,
        SiLU or tanh-GELU MLP), linear maps stored [in, out] as the engine keeps them."""

        def __init__(self, config, tensors):
            super().__init__()
            self.config = config
            self.params = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v.clone()) for k, v in tensors.items()})
            # Blocks are named from L1 in format circuitlab-weights/2, from L0 in files of format 1.
            self.first = 0 if config.get("format") == "circuitlab-weights/1" else 1
            D, H = config["d_model"], config["heads"]
            half = D // H // 2
            inv = config["rope_base"] ** (-torch.arange(half, dtype=torch.float64) / half)
            angle = torch.arange(config["max_len"], dtype=torch.float64).unsqueeze(1) * inv.unsqueeze(0)
            self.register_buffer("cos", angle.cos().float(), persistent=False)
            self.register_buffer("sin", angle.sin().float(), persistent=False)

        def p(self, name):
            return self.params[name.replace(".", "__")]

        def has(self, name):
            return name.replace(".", "__") in self.params

        def _norm(self, x, prefix):
            y = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=self.config["layernorm_eps"])
            return y * self.p(prefix + ".weight") + self.p(prefix + ".bias")

        def _rope(self, x):  # [B, H, T, dh]
            T, half = x.shape[-2], x.shape[-1] // 2
            c, s = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
            x1, x2 = x[..., :half], x[..., half:]
            return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)

        def forward(self, inputs):
            """Logits [B, T, V] from token ids [B, T] (int64), or for a regression model inputs [B, T, input_dim]."""
            return self.run_with_cache(inputs, cache=False)[0]

        def run_with_cache(self, inputs, cache=True):
            cfg = self.config
            kept = {}
            keep = (lambda name, v: kept.__setitem__(name, v.detach().clone())) if cache else (lambda name, v: None)
            inputs = torch.as_tensor(inputs)
            if cfg["input_dim"] > 0:
                x = inputs.to(self.p("read_in").dtype) @ self.p("read_in")
            else:
                if inputs.dim() == 1:
                    inputs = inputs.unsqueeze(0)
                x = self.p("embed")[inputs.long()]
            keep("embed", x)
            B, T, D = x.shape
            H = cfg["heads"]
            dh = D // H
            causal = _causal(T, x.device)
            act = (lambda m: torch.nn.functional.gelu(m, approximate="tanh")) if cfg["activation"] == "gelu_tanh" \
                else torch.nn.functional.silu
            for l in range(cfg["layers"]):
                p = f"L{l + self.first}."  # the file's tensor names: blocks from 1 (format 2), from 0 (format 1)
                q_ = f"L{l + 1}."          # hook names: layers from 1
                keep(q_ + "resid_pre", x)
                h = self._norm(x, p + "ln1")

                def heads(name):
                    y = h @ self.p(p + "attn." + name)
                    if self.has(p + "attn." + name + ".bias"):
                        y = y + self.p(p + "attn." + name + ".bias")
                    return y.view(B, T, H, dh).permute(0, 2, 1, 3)  # [B, H, T, dh]

                q, k, v = self._rope(heads("q")), self._rope(heads("k")), heads("v")
                scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
                pattern = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
                keep(q_ + "attn.pattern", pattern)                   # [B, H, T, T]
                out = (pattern @ v).permute(0, 2, 1, 3)              # [B, T, H, dh]
                keep(q_ + "attn.head", out)
                attn = out.reshape(B, T, D) @ self.p(p + "attn.o")
                if self.has(p + "attn.o.bias"):
                    attn = attn + self.p(p + "attn.o.bias")
                x = x + attn
                keep(q_ + "post_attn", x)
                m = act(self._norm(x, p + "ln2") @ self.p(p + "mlp.fc1.weight") + self.p(p + "mlp.fc1.bias"))
                x = x + m @ self.p(p + "mlp.fc2.weight") + self.p(p + "mlp.fc2.bias")
                keep(q_ + "post_mlp", x)
            if cfg["final_layernorm"]:
                x = self._norm(x, "ln_f")
                keep("final_ln", x)
            logits = x @ self.p("head.weight")
            if self.has("head.bias"):
                logits = logits + self.p("head.bias")
            keep("logits", logits)
            return logits, kept

    return ImirModel, DecoderModel


def load_model(source):
    """A torch.nn.Module (in eval mode, float32) from a safetensors file's path or bytes that ExportWeights
    wrote; its .config is the model's configuration (with the run's resolved spec under "spec")."""
    data = source
    if not isinstance(source, (bytes, bytearray, memoryview)):
        with open(source, "rb") as f:
            data = f.read()
    tensors, metadata = read_safetensors(bytes(data))
    if "config" not in metadata:
        raise ValueError("this safetensors file has no circuitlab configuration (metadata 'config')")
    config = json.loads(metadata["config"])
    ImirModel, DecoderModel = _modules()
    model = ImirModel(config, tensors) if config["family"] == "imir" else DecoderModel(config, tensors)
    return model.eval()
