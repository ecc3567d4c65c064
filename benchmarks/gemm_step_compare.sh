#!/usr/bin/env bash
# GEMM on one GPT training step's shapes, side by side on this machine: loom's GEMM in this
# tree, loom's GEMM as it was at an older commit (that commit's gemm.hpp, the rest of this
# tree), and torch.mm in the newest PyTorch (benchmarks/torch_peer_env.sh makes its
# environment). The three take turns, one round each, so a change in the machine's load
# hits all three; per shape the median over rounds counts. Writes
# benchmarks/results/gemm_step.json and prints the table.
#
#   benchmarks/gemm_step_compare.sh [previous-commit] [rounds] [-- gemm_step options]
#
# Defaults: the commit before the GEMM changes of issue 19's third round (d9215ff; the second
# round's started from 862c35b), 5 rounds,
# GPT-2 small at 1024 tokens. Both loom programs are compiled the same way (g++ -O3, no
# OpenBLAS), from benchmarks/gemm_step.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
previous="${1:-d9215ff}"
rounds="${2:-5}"
shift $(( $# > 2 ? 2 : $# ))
[[ "${1:-}" == "--" ]] && shift
extra=("$@")
work=build/gemm-step
mkdir -p "$work/previous/include/loom/runtime/host" "$work/runs"
if ! git show "$previous:include/loom/runtime/host/gemm.hpp" > "$work/previous/include/loom/runtime/host/gemm.hpp"; then
    echo "gemm_step_compare: no gemm.hpp at '$previous'; pass a commit of this repository" >&2
    exit 1
fi
flags=(-std=c++20 -O3 -DNDEBUG -pthread -Ibenchmarks)
g++ "${flags[@]}" -Iinclude benchmarks/gemm_step.cpp -o "$work/gemm_step_current"
g++ "${flags[@]}" -I"$work/previous/include" -Iinclude benchmarks/gemm_step.cpp -o "$work/gemm_step_previous"
python="$(benchmarks/torch_peer_env.sh)"
export LOOM_NUM_THREADS="${LOOM_NUM_THREADS:-2}" OMP_WAIT_POLICY=PASSIVE
for round in $(seq "$rounds"); do
    "$work/gemm_step_current" --rounds 1 --label current --out "$work/runs/current-$round.json" "${extra[@]}"
    "$work/gemm_step_previous" --rounds 1 --label "previous ($previous)" --out "$work/runs/previous-$round.json" "${extra[@]}"
    "$python" benchmarks/gemm_step_torch.py --threads "$LOOM_NUM_THREADS" --rounds 1 --out "$work/runs/torch-$round.json" \
        "${extra[@]}"
done
python3 - "$work/runs" "$rounds" "$previous" <<'PY'
import json, statistics, sys
runs, rounds, previous = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda name, r: json.load(open(f"{runs}/{name}-{r}.json"))
sets = {name: [load(name, r) for r in range(1, rounds + 1)] for name in ("current", "previous", "torch")}
first = sets["current"][0]
rows, totals = [], {name: [0.0, 0.0] for name in sets}
peak = max(run["fma_peak_gflops"] for name in ("current", "previous") for run in sets[name])
for i, shape in enumerate(first["results"]):
    row = {key: shape[key] for key in ("layer", "form", "m", "n", "k")}
    flops = 2.0 * shape["m"] * shape["n"] * shape["k"]
    for name, runs_of in sets.items():
        ms = statistics.median(run["results"][i]["median_ms"] for run in runs_of)
        row[f"{name}_gflops"] = flops / ms / 1e6
        totals[name][0] += flops
        totals[name][1] += ms
    row["current_over_previous"] = row["current_gflops"] / row["previous_gflops"]
    row["current_over_torch"] = row["current_gflops"] / row["torch_gflops"]
    row["current_fraction_of_peak"] = row["current_gflops"] / peak
    rows.append(row)
report = {"benchmark": "gemm_step_compare", "date_utc": first["date_utc"], "git_revision": first["git_revision"],
          "previous_commit": previous, "machine": first["machine"], "threads": first["threads"],
          "torch": sets["torch"][0]["torch"], "rounds": rounds, "fma_peak_gflops_highest": peak,
          "load_average": [run["machine"]["load_average_at_start"] for run in sets["current"]],
          "statistic": "per shape, the median over rounds of each round's median call",
          "results": rows,
          "all_shapes_gflops": {name: f / ms / 1e6 for name, (f, ms) in totals.items()}}
json.dump(report, open("benchmarks/results/gemm_step.json", "w"), indent=2)
print(f"\npeak {peak:.1f} GFLOP/s; GFLOP/s, median of {rounds} rounds")
print(f"{'layer':20s} {'form':12s} {'current':>8s} {'previous':>8s} {'torch':>8s} {'cur/prev':>8s} {'cur/torch':>9s} {'of peak':>7s}")
for r in rows:
    print(f"{r['layer']:20s} {r['form']:12s} {r['current_gflops']:8.1f} {r['previous_gflops']:8.1f} {r['torch_gflops']:8.1f}"
          f" {r['current_over_previous']:8.2f} {r['current_over_torch']:9.2f} {100 * r['current_fraction_of_peak']:6.1f}%")
a = report["all_shapes_gflops"]
print(f"all shapes once: current {a['current']:.1f}, previous {a['previous']:.1f}, torch {a['torch']:.1f} GFLOP/s")
print("wrote benchmarks/results/gemm_step.json")
PY
