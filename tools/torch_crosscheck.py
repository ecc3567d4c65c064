#!/usr/bin/env python3
"""Cross-checks loom's GPT against PyTorch, an implementation loom's authors did not write.

loom's exporter (tests/crosscheck/gpt_export.cpp) writes one training step as safetensors:
the initial weights, one batch, loom's loss and every parameter gradient. This script
rebuilds the same GPT from PyTorch primitives (F.embedding, F.layer_norm, F.linear, an
explicit causal softmax attention, F.gelu(approximate='tanh'), F.cross_entropy), runs
forward and backward in the same precision and compares:

    |loss_loom - loss_torch| <= tol * |loss_torch|
    max|g_loom - g_torch|    <= tol * max|g_torch|      for every parameter (normwise)
    max|g_loom|              <= tol * (largest gradient)  where PyTorch's is zero to rounding

with tol = 1e-9 for float64 and 1e-4 for float32.

Usage: torch_crosscheck.py --exporter PATH [--f32] [--untied] [--workdir DIR] [exporter args]
Exit codes: 0 pass, 1 mismatch, 77 PyTorch is not installed for this interpreter (use
Debian's /usr/bin/python3 with python3-torch).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_crosscheck: PyTorch is not importable by " + sys.executable +
          "; install python3-torch and run with /usr/bin/python3", file=sys.stderr)
    sys.exit(77)

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64}


def read_safetensors(path):
    """A safetensors reader written from the format description (8-byte header length,
    JSON header, raw little-endian data); loom's writer is what is under test."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[info["dtype"]])
        tensors[name] = t.reshape(info["shape"]) if info["shape"] else t.reshape(())
    return meta, tensors


def gpt_loss(W, tokens, positions, targets, cfg):
    B, S, H, nh = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"]
    hd = H // nh
    eps = cfg["layer_norm_eps"]
    x = F.embedding(tokens, W["wte"]) + F.embedding(positions, W["wpe"])
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for i in range(cfg["layers"]):
        p = f"blocks.{i}."
        h = F.layer_norm(x, (H,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)

        def heads(name):
            y = F.linear(h, W[p + f"attn.{name}.weight"], W[p + f"attn.{name}.bias"])
            return y.view(B, S, nh, hd).transpose(1, 2)

        q, k, v = heads("q"), heads("k"), heads("v")
        scores = (q @ k.transpose(-2, -1)) / (hd ** 0.5)
        scores = scores.masked_fill(~causal, float("-inf"))
        a = torch.softmax(scores, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, S, H)
        x = x + F.linear(a, W[p + "attn.proj.weight"], W[p + "attn.proj.bias"])
        h = F.layer_norm(x, (H,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        f = F.gelu(F.linear(h, W[p + "mlp.fc.weight"], W[p + "mlp.fc.bias"]), approximate="tanh")
        x = x + F.linear(f, W[p + "mlp.proj.weight"], W[p + "mlp.proj.bias"])
    x = F.layer_norm(x, (H,), W["ln_f.weight"], W["ln_f.bias"], eps)
    head = W["wte"] if cfg["tie_embeddings"] else W["lm_head"]
    logits = F.linear(x, head)
    return F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.view(-1).long())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exporter", required=True, help="path of loom's gpt_export program")
    parser.add_argument("--f32", action="store_true", help="compare in float32 (default float64)")
    parser.add_argument("--workdir", default=None)
    args, exporter_args = parser.parse_known_args()

    torch.set_num_threads(1)
    # A directory of its own, so that several checks can run at once.
    workdir = tempfile.mkdtemp(prefix="loom_crosscheck_", dir=args.workdir)
    out = os.path.join(workdir, "step_%s.safetensors" % ("f32" if args.f32 else "f64"))
    cmd = [args.exporter, "--out", out] + (["--f32"] if args.f32 else []) + exporter_args
    subprocess.run(cmd, check=True)

    meta, t = read_safetensors(out)
    cfg = {k: int(v) for k, v in meta.items() if k not in ("layer_norm_eps", "precision")}
    cfg["layer_norm_eps"] = float(meta["layer_norm_eps"])
    cfg["tie_embeddings"] = bool(cfg["tie_embeddings"])
    dtype = torch.float32 if args.f32 else torch.float64
    tol = 1e-4 if args.f32 else 1e-9

    W = {}
    for name, value in t.items():
        if name.startswith("param/"):
            W[name[len("param/"):]] = value.to(dtype).clone().requires_grad_(True)
    loss = gpt_loss(W, t["input/tokens"].long(), t["input/positions"].long(), t["input/targets"], cfg)
    loss.backward()

    failures = []
    loom_loss = float(t["loss"][0])
    torch_loss = float(loss)
    loss_err = abs(loom_loss - torch_loss) / abs(torch_loss)
    print(f"loss: loom {loom_loss:.17g} torch {torch_loss:.17g} relative error {loss_err:.2e}")
    if not loss_err <= tol:
        failures.append(f"loss differs by {loss_err:.2e} (tolerance {tol:.0e})")

    # Some gradients are zero in exact arithmetic (a key bias shifts every score of a row by
    # the same amount, which softmax ignores); both sides then hold rounding noise, and a
    # relative error means nothing. Such a tensor must be zero to `tol` of the largest
    # gradient of the model instead.
    global_scale = max(float(w.grad.abs().max()) for w in W.values())
    worst = 0.0
    for name, w in sorted(W.items()):
        mine = t["grad/" + name].to(dtype)
        ref = w.grad
        scale = float(ref.abs().max())
        if scale <= tol * global_scale:
            err = float(mine.abs().max()) / global_scale
            status = "ok (zero in exact arithmetic)" if err <= tol else "MISMATCH (should be zero)"
        else:
            err = float((mine - ref).abs().max()) / scale
            status = "ok" if err <= tol else "MISMATCH"
            worst = max(worst, err)
        print(f"  grad {name:28s} max|g| {scale:.3e}  relative error {err:.2e}  {status}")
        if not err <= tol:
            failures.append(f"gradient of {name} differs by {err:.2e} (tolerance {tol:.0e})")
    nonzero = sum(1 for w in W.values() if float(w.grad.abs().max()) > tol * global_scale)
    if nonzero < len(W) - 2 * cfg["layers"]:
        failures.append(f"only {nonzero} of {len(W)} gradients are non-zero: the check would prove little")
    print(f"{len(W)} gradients compared ({nonzero} non-zero), worst relative error {worst:.2e}, tolerance {tol:.0e}")
    if failures:
        print("torch_crosscheck: FAILED\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("torch_crosscheck: loom matches PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
