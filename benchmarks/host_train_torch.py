#!/usr/bin/env python3
"""The PyTorch side of benchmarks/host_train: the same GPT (pre-norm, tied embeddings,
tanh GELU, causal attention), the same AdamW step with global-norm clipping, timed the
same way (median over the timed steps, after warm-up).

Runs under any PyTorch: Debian's 1.13 (/usr/bin/python3) or the newest from the package
index (benchmarks/torch_peer_env.sh makes that environment). --compile wraps the model in
torch.compile (PyTorch 2 and later; the optimizer step stays eager, as users write it).

Without --serve: warm-up, timed steps, one JSON object. With --serve (what host_train
uses, so that loom and PyTorch take turns in one run): warm-up (compilation included),
then a JSON line {"ready": ...}; every line "run" on stdin then times --steps steps and
answers one JSON line; end of input ends the process."""
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
        self.init_like_loom(layers)

    def init_like_loom(self, layers, std=0.02):
        # loom's GPT (models/gpt.hpp) starts as GPT-2 does: every weight N(0, 0.02), the two
        # projections back into the residual stream N(0, 0.02 / sqrt(2 * layers)), biases 0.
        # PyTorch's own defaults (N(0, 1) embeddings, tied to the LM head) start at a loss near
        # 100 with logits far apart, whose softmax underflows into denormals: on CPUs that
        # trap them (Intel) every step then took 4 to 6x longer, a peer slowed by its
        # numbers rather than its kernels.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith(("proj.weight", "mlp_proj.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * layers))
            elif "ln_" not in name:
                nn.init.normal_(p, 0.0, std)

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
    p.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch >= 2)")
    p.add_argument("--serve", action="store_true", help="time --steps steps per line 'run' on stdin")
    a = p.parse_args()
    about = {"torch_version": torch.__version__, "mode": "compile" if a.compile else "eager"}
    if a.compile and not hasattr(torch, "compile"):
        print(json.dumps({**about, "error": "torch.compile needs PyTorch 2 or later"}), flush=True)
        return 1
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = GPT(a.layers, a.hidden, a.heads, a.vocab, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    run_model = torch.compile(model) if a.compile else model
    # The tokens and targets that benchmarks/host_train feeds loom.
    index = torch.arange(a.batch * a.seq, dtype=torch.int64)
    tokens = ((index * 37 + 11) % a.vocab).view(a.batch, a.seq)
    targets = ((index * 53 + 5) % a.vocab).view(a.batch, a.seq)
    positions = torch.arange(a.seq).expand(a.batch, a.seq)

    first_loss = []  # the first step's loss: the model's starting point, which loom's must match

    def step():
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = run_model(tokens, positions, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - start
        if not first_loss:
            first_loss.append(loss.detach().item())
        return elapsed, loss.detach().item()

    def timed(steps):
        results = [step() for _ in range(steps)]
        median = statistics.median(t for t, _ in results)
        return {**about, "threads": torch.get_num_threads(), "median_step_seconds": median,
                "tokens_per_second": a.batch * a.seq / median, "first_loss": first_loss[0],
                "final_loss": results[-1][1]}

    start = time.perf_counter()
    for _ in range(a.warmup):
        step()
    warmup_seconds = time.perf_counter() - start
    if not a.serve:
        print(json.dumps({**timed(a.steps), "warmup_seconds": warmup_seconds}))
        return 0
    print(json.dumps({**about, "ready": True, "warmup_seconds": warmup_seconds}), flush=True)
    for line in sys.stdin:
        if line.strip() == "run":
            print(json.dumps(timed(a.steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
