#!/usr/bin/env bash
# Everything GPU-side in one call: build the CUDA tests and benchmarks, run the tests (every
# kernel against its host twin, GPU training against the host loss curve), run them again
# under compute-sanitizer memcheck, then run the benchmarks beside their PyTorch peers on the
# same GPU, profile one step of each by op kind, and write the results down.
#
#   bash scripts/gpu/run_all.sh            # build here if the toolchain and loom's
#                                          # dependencies are installed, else use the bundle;
#                                          # run if a GPU is present
#   bash scripts/gpu/run_all.sh build      # build and bundle only (on a machine without a GPU)
#   bash scripts/gpu/run_all.sh run        # run only, from the bundle
#
# The bundle (build/gpu-bundle: stripped binaries, the benchmark scripts, and the shared
# libraries a bare CUDA machine may lack, such as MPI's) lets a GPU machine that has the
# CUDA runtime and PyTorch but not loom's build dependencies run everything: build it where
# the dependencies are, carry the folder, run there. It is built with loom's portable host
# GEMM instead of OpenBLAS (whose 36 MB library would not fit a 64 MiB transfer); the host
# twins only check. `build` also writes build/gpu-bundle.tar.xz (about 13 MB; the folder is
# about 70 MB), which `run` unpacks where the folder is missing. With the device tool of a
# development session:
#   bash scripts/gpu/run_all.sh build                                   # here, ~3 min
#   run(command="bash scripts/gpu/run_all.sh run", carry=["build/gpu-bundle.tar.xz"])
#
# MEMCHECK=0 skips the compute-sanitizer pass (it is the slow part of a run).
#
# Results: $RESULTS_DIR (default: $OUT when set, else benchmarks/results/gpu) gets
# gpu_results.md (the table and every test's verdict), gpu_profile.json and the raw logs
# (under $OUT: packed into logs.tar.gz).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
mode=${1:-all}
build_dir=${BUILD_DIR:-build/gpu}
bundle=${BUNDLE_DIR:-build/gpu-bundle}
results=${RESULTS_DIR:-${OUT:-benchmarks/results/gpu}}
mkdir -p "$results"
report="$results/gpu_results.md"

tests=(cuda_test_elementwise cuda_test_layout cuda_test_optimizer cuda_test_norms cuda_test_softmax
       cuda_test_cross_entropy cuda_test_embedding cuda_test_gemm cuda_test_attention cuda_test_region_copy
       cuda_test_partition_ops cuda_test_fusion cuda_test_train cuda_test_distributed_train)
benchmarks=(gpu_train gpu_attention)
programs=(calibrate_gpu)

can_build() {
  command -v nvcc >/dev/null && command -v cmake >/dev/null && command -v g++ >/dev/null &&
    [[ -d /usr/include/boost && -f /usr/include/catch2/catch.hpp ]]
}

build() {
  echo "==> building the CUDA tests and benchmarks in $build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_BUILD_BENCHMARKS=ON \
    -DLOOM_HEADER_TEST=OFF -DLOOM_BUILD_EXAMPLES=ON -DLOOM_USE_CBLAS=OFF || return 1
  local targets=()
  for t in "${tests[@]}" "${benchmarks[@]}" "${programs[@]}"; do targets+=("$t"); done
  cmake --build "$build_dir" --parallel "$(nproc)" --target "${targets[@]}" || return 1
  # The NCCL tests exist where MPI and NCCL were found.
  for t in cuda_nccl_test cuda_nccl_test_train; do
    cmake --build "$build_dir" --target "$t" 2>/dev/null || echo "($t not built: no MPI or NCCL here)"
  done

  echo "==> bundling into $bundle"
  rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/scripts"
  for t in "${tests[@]}" cuda_nccl_test cuda_nccl_test_train; do
    [[ -f "$build_dir/tests/$t" ]] && cp "$build_dir/tests/$t" "$bundle/bin/"
  done
  for b in "${benchmarks[@]}"; do cp "$build_dir/benchmarks/$b" "$bundle/bin/"; done
  for p in "${programs[@]}"; do cp "$build_dir/examples/$p" "$bundle/bin/"; done
  strip "$bundle"/bin/* 2>/dev/null || true
  cp benchmarks/cuda/*.py benchmarks/host_train_torch.py "$bundle/scripts/"
  # Shared libraries outside the C runtime and the CUDA toolkit (which the GPU machine has).
  for f in "$bundle"/bin/*; do
    ldd "$f" | awk '/=> \// {print $3}'
  done | sort -u | while read -r lib; do
    case "$lib" in
      */libc.so*|*/libm.so*|*/libpthread.so*|*/libdl.so*|*/librt.so*|*/ld-linux*|*/libstdc++*|*/libgcc_s*) ;;
      */cuda*|*/libcud*|*/libcublas*|*/libnccl*|*/libnvidia*) ;;
      *) cp -L "$lib" "$bundle/lib/" ;;
    esac
  done
  git rev-parse --short HEAD >"$bundle/COMMIT" 2>/dev/null || true
  du -sh "$bundle"
  # Compressed, the bundle travels in one transfer (about 13 MB against 70 MB).
  tar -C "$(dirname "$bundle")" -cf - "$(basename "$bundle")" | xz -T0 -6 >"$bundle.tar.xz"
  du -sh "$bundle.tar.xz"
}

run() {
  if [[ ! -d "$bundle" && -f "$bundle.tar.xz" ]]; then
    tar -C "$(dirname "$bundle")" -xJf "$bundle.tar.xz" || return 1
  fi
  local bin=$bundle/bin
  if can_build && [[ -d "$build_dir/tests" ]]; then bin=""; fi
  export LD_LIBRARY_PATH="$root/$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  local nvidia_libs
  nvidia_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib"))))' 2>/dev/null || true)
  [[ -n "$nvidia_libs" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nvidia_libs"
  path_of() { if [[ -z "$bin" ]]; then
      local d; for d in tests benchmarks examples; do
        [[ -f "$build_dir/$d/$1" ]] && { echo "$build_dir/$d/$1"; return; }
      done; echo "$build_dir/tests/$1"
    else echo "$bin/$1"; fi; }

  local gpu
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  if [[ -z "$gpu" ]]; then
    echo "no GPU here: nothing to run (the bundle is in $bundle; carry it to a GPU machine)"
    return 0
  fi
  {
    echo "# GPU results"
    echo
    echo "- GPU: $gpu"
    echo "- date: $(date -u +%Y-%m-%d)"
    # The bundle's commit where its binaries run: a copied working tree's git may be older.
    local commit
    if [[ -n "$bin" && -f "$bundle/COMMIT" ]]; then commit=$(cat "$bundle/COMMIT")
    else commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown); fi
    echo "- commit: $commit"
    echo
    echo "## Tests (kernels against host twins; training against the host loss curve)"
    echo
    echo "| test | result | memcheck |"
    echo "|---|---|---|"
  } >"$report"
  local failed=0
  for t in "${tests[@]}"; do
    local exe; exe=$(path_of "$t")
    local verdict memcheck="not run"
    if [[ ! -x "$exe" ]]; then verdict="missing"; failed=1
    else
      "$exe" >"$results/$t.log" 2>&1
      case $? in 0) verdict="passed" ;; 77) verdict="SKIPPED (no GPU seen)"; failed=1 ;; *) verdict="FAILED"; failed=1 ;; esac
      # The training tests run the kernels the others check, many steps over: too slow
      # under memcheck for one call.
      if [[ "${MEMCHECK:-1}" != 0 ]] && command -v compute-sanitizer >/dev/null && [[ "$t" != cuda_test_train && "$t" != cuda_test_distributed_train ]]; then
        # Its own verdict, apart from the test's: the summary line, not the exit status.
        compute-sanitizer --tool memcheck "$exe" >"$results/$t.memcheck.log" 2>&1
        if grep -q "ERROR SUMMARY: 0 errors" "$results/$t.memcheck.log"; then memcheck="clean"
        else memcheck="ERRORS"; failed=1; fi
      fi
    fi
    echo "| $t | $verdict | $memcheck |" >>"$report"
    echo "$t: $verdict (memcheck: $memcheck)"
  done
  # One rank: under mpiexec where there is one, else as an MPI singleton (the program alone).
  for t in cuda_nccl_test cuda_nccl_test_train; do
    local exe; exe=$(path_of "$t")
    if [[ ! -x "$exe" ]]; then echo "| $t | missing | |" >>"$report"; failed=1; continue; fi
    local launch=("$exe") how="1 rank, singleton"
    if command -v mpiexec >/dev/null; then launch=(mpiexec --allow-run-as-root -np 1 "$exe"); how="1 rank"; fi
    "${launch[@]}" >"$results/$t.log" 2>&1
    case $? in
      0) echo "| $t ($how) | passed | |" >>"$report" ;;
      77) echo "| $t ($how) | SKIPPED (no GPU seen) | |" >>"$report"; failed=1 ;;
      *) echo "| $t ($how) | FAILED (see $t.log) | |" >>"$report"; failed=1 ;;
    esac
  done

  {
    echo
    echo "## Calibration (the profile the searcher reads: $results/gpu_profile.json)"
    echo
    echo '```'
  } >>"$report"
  "$(path_of calibrate_gpu)" --out "$results/gpu_profile.json" 2>&1 | tee -a "$report" || failed=1
  echo '```' >>"$report"
  {
    echo
    echo "## GPT-2 124M training (seq 1024, vocab 50304), same GPU, same script"
    echo
    echo '```'
  } >>"$report"
  "$(path_of gpu_train)" --precision bf16 2>&1 | tee -a "$report" "$results/gpu_train.log"
  "$(path_of gpu_train)" --precision bf16 --fuse-backward 2>&1 | tee -a "$report" "$results/gpu_train.log"
  "$(path_of gpu_train)" --precision bf16 --no-fuse 2>&1 | tee -a "$report" "$results/gpu_train.log"
  "$(path_of gpu_train)" --precision f32 --batch 8 2>&1 | tee -a "$report" "$results/gpu_train.log"
  local torch_script=benchmarks/cuda/gpu_train_torch.py
  [[ -f "$torch_script" ]] || torch_script=$bundle/scripts/gpu_train_torch.py
  PYTHONUNBUFFERED=1 python3 "$torch_script" --mode all 2>&1 | tee -a "$report" "$results/torch.log"
  "$(path_of gpu_attention)" 2>&1 | tee -a "$report" "$results/gpu_attention.log"
  echo '```' >>"$report"
  {
    echo
    echo "## Where one bf16 step's GPU time goes: loom by op kind, PyTorch eager by kernel"
    echo
    echo '```'
  } >>"$report"
  "$(path_of gpu_train)" --precision bf16 --warmup 3 --steps 3 --profile 2>&1 | tee -a "$report" "$results/profile.log"
  PYTHONUNBUFFERED=1 python3 "$torch_script" --mode profile 2>&1 | tee -a "$report" "$results/profile.log"
  echo '```' >>"$report"
  # The device tool returns at most 8 files from $OUT: the report and the profile stay
  # apart, every log travels in one archive.
  if [[ -n "${OUT:-}" && "$results" == "$OUT" ]]; then
    (cd "$results" && tar -czf logs.tar.gz ./*.log && rm -f ./*.log)
  fi
  echo "results: $report"
  return $failed
}

case "$mode" in
  build) build ;;
  run) run ;;
  all)
    if can_build; then build || exit 1; fi
    run ;;
  *) echo "usage: $0 [all|build|run]"; exit 2 ;;
esac
