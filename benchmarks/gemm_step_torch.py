#!/usr/bin/env python3
"""PyTorch's side of benchmarks/gemm_step: torch.mm on the GEMMs of one GPT training step in
the three forms the step uses (forward x w^T, input gradient dy w, weight gradient dy^T x),
float32, timed the same way (rounds of a warm-up call and timed repeats; the median of all
timed calls). Run it with the interpreter of the peer environment
(benchmarks/torch_peer_env.sh) and OMP_WAIT_POLICY=PASSIVE, as host_train runs its peers.

    python gemm_step_torch.py [--threads 2] [--tokens 1024] [--hidden 768] [--vocab 50304]
                              [--rounds 3] [--repeats 5] [--out PATH]"""
import argparse
import datetime
import json
import os
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/gemm_step_torch.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(7)
    t, h = args.tokens, args.hidden
    layers = [("attention (H x H)", h, h), ("mlp up (4H x H)", 4 * h, h), ("mlp down (H x 4H)", h, 4 * h),
              ("logits (V x H)", args.vocab, h)]
    results = []
    all_flops = all_seconds = 0.0
    with torch.no_grad():
        for name, out, inp in layers:
            x = torch.rand(t, inp) * 2 - 1
            dy = torch.rand(t, out) * 2 - 1
            w = torch.rand(out, inp) * 2 - 1
            forms = {
                "forward": (lambda: torch.mm(x, w.t()), (t, out, inp)),
                "grad_input": (lambda: torch.mm(dy, w), (t, inp, out)),
                "grad_weight": (lambda: torch.mm(dy.t(), x), (out, inp, t)),
            }
            for form, (call, (m, n, k)) in forms.items():
                times = []
                for _ in range(args.rounds):
                    call()
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        call()
                        times.append(time.perf_counter() - start)
                seconds = statistics.median(times)
                flops = 2.0 * m * n * k
                all_flops += flops
                all_seconds += seconds
                print(f"{name:20s} {form:12s} m {m:6d} n {n:6d} k {k:6d}  {flops / seconds / 1e9:7.1f} GFLOP/s",
                      flush=True)
                results.append({"layer": name, "form": form, "m": m, "n": n, "k": k, "median_ms": seconds * 1e3,
                                "gflops": flops / seconds / 1e9})
    print(f"all shapes once: {all_flops / all_seconds / 1e9:.1f} GFLOP/s")
    report = {"benchmark": "gemm_step_torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
              "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "load_average": os.getloadavg()[0], "method": {"rounds": args.rounds, "repeats_per_round": args.repeats},
              "results": results, "all_shapes_gflops": all_flops / all_seconds / 1e9}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
