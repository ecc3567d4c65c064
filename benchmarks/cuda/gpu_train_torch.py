#!/usr/bin/env python3
"""The PyTorch side of benchmarks/cuda/gpu_train: the same GPT-2 (host_train_torch.py's model:
pre-norm, tied embeddings, tanh GELU, causal attention, separate q/k/v projections as loom's
model has them; autocast computes its cross-entropy in float), the same
AdamW step with global-norm clipping, on the same GPU, in PyTorch eager and torch.compile.
bf16 autocast with float master weights, fused AdamW: the configuration a careful PyTorch
user trains GPT-2 with. Timed as loom's side is: median step time over the timed steps after
warm-up, synchronised. Also times F.scaled_dot_product_attention forward + backward at the
benchmark's shape, the peer of loom's attention kernel. Prints one JSON object per mode."""
import argparse
import json
import statistics
import sys
import time

import os

import torch
import torch.nn.functional as F

# The model is the host benchmark's (benchmarks/host_train_torch.py, beside this folder or,
# in the GPU bundle, beside this file): one definition for both peers.
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]
from host_train_torch import GPT  # noqa: E402


def training(a, compiled):
    """The model and one training step of it (returns the loss), as both modes run it."""
    torch.manual_seed(0)
    model = GPT(a.layers, a.hidden, a.heads, a.vocab, a.seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if compiled else model
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
    targets = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
    positions = torch.arange(a.seq, device="cuda").expand(a.batch, a.seq)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(tokens, positions, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    return model, step


def train_mode(a, compiled):
    model, step = training(a, compiled)
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    tokens_per_step = a.batch * a.seq
    params = sum(p.numel() for p in model.parameters())
    # 6 N per token for the GEMMs plus causal attention (6 * layers * seq * hidden per token).
    flops_per_token = 6 * params + 6 * a.layers * a.seq * a.hidden
    return {"peer": "torch.compile" if compiled else "torch eager", "torch_version": torch.__version__,
            "device": torch.cuda.get_device_name(), "median_step_seconds": median,
            "tokens_per_second": tokens_per_step / median,
            "model_tflops_per_second": flops_per_token * tokens_per_step / median / 1e12,
            "parameters": params, "final_loss": loss.item()}


def profile_mode(a):
    """GPU time of one eager bf16 step by kernel, the peer of gpu_train --profile: the 15
    kernels with the most device time, one JSON object each."""
    from torch.profiler import ProfilerActivity, profile
    _, step = training(a, False)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in kernels)
    for e in sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:15]:
        print(json.dumps({"profile": "torch eager bf16", "op": e.key[:90], "count": e.count,
                          "ms": e.self_device_time_total / 1e3, "share": e.self_device_time_total / total}),
              flush=True)
    return {"profile": "torch eager bf16", "total_kernel_ms": total / 1e3}


def attention_mode(a):
    hd = a.hidden // a.heads
    q, k, v = (torch.randn(a.batch, a.heads, a.seq, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    times = []
    for step in range(a.warmup + 20):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(dout)
        torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    # Causal: half of the 4 * b * h * s^2 * d forward FLOPs; backward 2.5x forward.
    flops = 3.5 * 2 * a.batch * a.heads * a.seq * a.seq * hd
    return {"peer": "F.scaled_dot_product_attention (fwd+bwd, bf16)", "median_seconds": median,
            "tflops_per_second": flops / median / 1e12}


def main():
    p = argparse.ArgumentParser()
    for name, default in [("layers", 12), ("hidden", 768), ("heads", 12), ("vocab", 50304), ("seq", 1024),
                          ("batch", 16), ("warmup", 5), ("steps", 20)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--mode", choices=["eager", "compile", "attention", "profile", "all"], default="all")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    modes = ["eager", "compile", "attention"] if a.mode == "all" else [a.mode]
    for m in modes:
        if m == "profile":
            result = profile_mode(a)
        else:
            result = attention_mode(a) if m == "attention" else train_mode(a, m == "compile")
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
