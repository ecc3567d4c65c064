#!/usr/bin/env python3
"""GPT-2 interop: loom reads a Hugging Face GPT-2 checkpoint and computes GPT-2's logits.

This script writes a small GPT-2 checkpoint with PyTorch, in the layout and names of the
Hugging Face GPT-2 state dict (wte.weight, h.0.attn.c_attn.weight as Conv1D [in, out],
the causal-mask buffer h.i.attn.bias, wpe with more positions than loom's sequence), and
the logits of fixed tokens from GPT-2's forward pass written in plain torch (Conv1D
x @ W + b, c_attn split into q, k, v, gelu_new). loom's gpt2_logits
(tests/crosscheck/gpt2_logits.cpp) imports the file, computes the logits and exports the
weights back to the GPT-2 layout. Checks:

    max|logits_loom - logits_torch| <= tol * max|logits_torch|   (1e-9 float64, 1e-5 float32)
    every exported tensor equals the written one bit for bit (wpe: its first seq rows)

Usage: gpt2_crosscheck.py --program PATH [--f32] [--workdir DIR]
Exit codes: 0 pass, 1 mismatch, 77 PyTorch is not importable (use /usr/bin/python3).
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("gpt2_crosscheck: PyTorch is not importable by " + sys.executable +
          "; install python3-torch and run with /usr/bin/python3", file=sys.stderr)
    sys.exit(77)

NAMES = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}
DTYPES = {v: k for k, v in NAMES.items()}


def write_safetensors(path, tensors):
    """The safetensors layout, written by hand: loom's reader is what is under test."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:e]), dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_logits(W, tokens, layers, heads, eps=1e-5):
    B, S = tokens.shape
    H = W["wte.weight"].shape[1]
    hd = H // heads
    ln = torch.nn.functional.layer_norm
    x = W["wte.weight"][tokens] + W["wpe.weight"][torch.arange(S)]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(layers):
        p = f"h.{i}."
        h = ln(x, (H,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]   # Conv1D: [in, out]
        q, k, v = qkv.split(H, dim=2)
        q, k, v = (t.view(B, S, heads, hd).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        a = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, S, H)
        x = x + a @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = ln(x, (H,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        f = gelu_new(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + f @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = ln(x, (H,), W["ln_f.weight"], W["ln_f.bias"], eps)
    return x @ W["wte.weight"].T


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--program", required=True, help="path of loom's gpt2_logits")
    parser.add_argument("--f32", action="store_true")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = torch.float32 if args.f32 else torch.float64
    tol = 1e-5 if args.f32 else 1e-9
    layers, H, heads, V, P, B, S = 2, 32, 4, 64, 24, 2, 16

    g = torch.Generator().manual_seed(20240520)
    def rand(*shape, std=0.2):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).to(dtype)
    W = {"wte.weight": rand(V, H), "wpe.weight": rand(P, H), "ln_f.weight": 1 + rand(H), "ln_f.bias": rand(H)}
    for i in range(layers):
        p = f"h.{i}."
        W.update({p + "ln_1.weight": 1 + rand(H), p + "ln_1.bias": rand(H),
                  p + "attn.c_attn.weight": rand(H, 3 * H), p + "attn.c_attn.bias": rand(3 * H),
                  p + "attn.c_proj.weight": rand(H, H), p + "attn.c_proj.bias": rand(H),
                  p + "ln_2.weight": 1 + rand(H), p + "ln_2.bias": rand(H),
                  p + "mlp.c_fc.weight": rand(H, 4 * H), p + "mlp.c_fc.bias": rand(4 * H),
                  p + "mlp.c_proj.weight": rand(4 * H, H), p + "mlp.c_proj.bias": rand(H)})
    tokens = torch.randint(0, V, (B, S), generator=g, dtype=torch.int32)
    with torch.no_grad():
        reference = gpt2_logits(W, tokens.long(), layers, heads)

    workdir = tempfile.mkdtemp(prefix="loom_gpt2_", dir=args.workdir)
    weights = os.path.join(workdir, "gpt2.safetensors")
    on_disk = dict(W)
    for i in range(layers):  # the causal-mask buffer GPT-2 files carry; not a weight
        on_disk[f"h.{i}.attn.bias"] = torch.ones(1, 1, P, P, dtype=torch.float32).tril()
    write_safetensors(weights, on_disk)
    write_safetensors(os.path.join(workdir, "tokens.safetensors"), {"tokens": tokens})
    out, exported = os.path.join(workdir, "logits.safetensors"), os.path.join(workdir, "roundtrip.safetensors")
    subprocess.run([args.program, "--weights", weights, "--tokens", os.path.join(workdir, "tokens.safetensors"),
                    "--out", out, "--export", exported, "--layers", str(layers), "--hidden", str(H),
                    "--heads", str(heads), "--vocab", str(V)] + (["--f32"] if args.f32 else []), check=True)

    failures = []
    mine = read_safetensors(out)["logits"]
    err = float((mine - reference).abs().max()) / float(reference.abs().max())
    print(f"logits: {mine.numel()} values, max |logit| {float(reference.abs().max()):.3f}, relative error {err:.2e}"
          f" (tolerance {tol:.0e})")
    if not err <= tol:
        failures.append(f"logits differ by {err:.2e}")
    back = read_safetensors(exported)
    round_trip = []
    for name, t in W.items():
        want = t[:S] if name == "wpe.weight" else t
        if name not in back or back[name].dtype != want.dtype or not torch.equal(back[name], want):
            round_trip.append(f"exported {name} differs from the file loom imported")
    extra = set(back) - set(W)
    if extra:
        round_trip.append(f"export wrote tensors GPT-2 does not have: {sorted(extra)}")
    print(f"round trip: {len(W)} tensors exported back in GPT-2's names and layouts: "
          + ("equal bit for bit" if not round_trip else "MISMATCH"))
    failures += round_trip
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
