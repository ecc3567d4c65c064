#!/usr/bin/env python3
"""The PyTorch side of benchmarks/host_train: the same GPT (pre-norm, tied embeddings,
tanh GELU, causal attention), the same AdamW step with global-norm clipping, timed the
same way (median over the timed steps, after warm-up). Prints one JSON object.

Run with Debian's /usr/bin/python3 (python3-torch)."""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h)
        self.q, self.k, self.v, self.proj = (nn.Linear(h, h) for _ in range(4))
        self.ln_2 = nn.LayerNorm(h)
        self.fc = nn.Linear(h, ffn)
        self.mlp_proj = nn.Linear(ffn, h)

    def forward(self, x):
        B, S, H = x.shape
        hd = H // self.heads
        y = self.ln_1(x)
        q, k, v = (m(y).view(B, S, self.heads, hd).transpose(1, 2) for m in (self.q, self.k, self.v))
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
            a = torch.softmax(s, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(B, S, H))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads, 4 * h) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)

    def forward(self, tokens, positions, targets):
        x = self.wte(tokens) + self.wpe(positions)
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 4), ("hidden", 128), ("heads", 4), ("vocab", 256), ("seq", 64),
                          ("batch", 16), ("warmup", 3), ("steps", 10), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = GPT(a.layers, a.hidden, a.heads, a.vocab, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
    targets = torch.randint(0, a.vocab, (a.batch, a.seq))
    positions = torch.arange(a.seq).expand(a.batch, a.seq)
    times = []
    for step in range(a.warmup + a.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, positions, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= a.warmup:
            times.append(elapsed)
    median = statistics.median(times)
    print(json.dumps({"torch_version": torch.__version__, "threads": torch.get_num_threads(),
                      "median_step_seconds": median, "tokens_per_second": a.batch * a.seq / median,
                      "final_loss": float(loss)}))


if __name__ == "__main__":
    sys.exit(main())
