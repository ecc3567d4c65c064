#!/usr/bin/env bash
# The full check CI runs: single header up to date, optimized build with assertions and
# every ctest test (unit, header, consumers, examples), then the unit tests again under
# AddressSanitizer + UndefinedBehaviorSanitizer, then the multi-threaded tests under
# ThreadSanitizer. Exits non-zero if any step fails.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs=$(nproc 2>/dev/null || echo 2)
# ccache's depend mode takes a compile's headers from its -MD output: on a fresh machine,
# where every compile misses, the default mode runs the preprocessor once more for each
# (28 s against 31 s for test_pipeline.cpp), and a warm cache hits the same.
export CCACHE_DEPEND=${CCACHE_DEPEND:-1}
start_all=$SECONDS
failed=0
summary=()

# step <name> <command...>: runs it, records PASS/FAIL and its duration.
step() {
  local name=$1 start=$SECONDS
  shift
  echo
  echo "==> ${name}: $*"
  if "$@"; then
    summary+=("PASS  $(printf '%4ss' $((SECONDS - start)))  ${name}")
    return 0
  fi
  summary+=("FAIL  $(printf '%4ss' $((SECONDS - start)))  ${name}")
  failed=1
  return 1
}

skip() {
  summary+=("SKIP         $1 (configure failed)")
}

step "install dependencies" bash tools/install_deps.sh || exit 1

step "single header up to date" python3 tools/amalgamate.py --check

# The folders of include/loom in data-flow order, printed so the log shows the graph.
step "folder dependencies without cycles" python3 tools/folder_deps.py

# Optimized, assertions kept: RelWithDebInfo without NDEBUG and without debug info, at -O1:
# it compiles a quarter faster than -O2 (test_pipeline: 51 s instead of 68 s), which keeps
# CI within its time on 2 cores, and the tests time nothing.
# A failed compile does not stop the build (-k 0) or the tests that did build, so one run
# reports every failure.
# Benchmarks are not built: no test runs them (build them with -DLOOM_BUILD_BENCHMARKS=ON).
if step "configure build/ci" cmake -S . -B build/ci -G Ninja \
     -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g0" \
     -DLOOM_BUILD_BENCHMARKS=OFF; then
  step "build build/ci" cmake --build build/ci --parallel "$jobs" -- -k 0
  step "ctest build/ci (all)" ctest --test-dir build/ci --output-on-failure -j "$jobs"
  # The property tests' counts and mix of plans, which ctest keeps to its log when they pass.
  grep -h "^plan language:\|^random plans:" build/ci/Testing/Temporary/LastTest.log || true
else
  skip "build and ctest build/ci"
fi

# UBSan's checks of alignment, null, object size and pointer overflow are left out: they
# doubled the compile time of src/compiled.cpp (411 s against 213 s on 2 cores, the longest
# step of CI), and ASan already stops at null dereferences and out-of-object accesses.
ubsan_skipped=alignment,null,object-size,pointer-overflow,nonnull-attribute,returns-nonnull-attribute,vptr
# Unit tests only, with sanitizers that stop at the first error. The plan-level tests are left
# out (the list below): they drive the same kernels, communicators and trainers as the unit
# tests kept here, only through more plans, and compiling them under ASan cost CI minutes.
# So are the calibration's (its kernels are the ones test_ops_* check; under ASan it ran
# 179 s, timing slowed code) and the search's threads (logic, run under TSan below). The CUDA backend is left
# out: its kernels run on no GPU here, and build/ci already compiles and links all of it. -g1 (line tables) is
# enough for symbolized reports and costs less than -g (about 15% CPU, 30% memory); -O1,
# because GCC 12 hits internal compiler errors at -O0 with sanitizers on [[gnu::target]]
# kernels and the tests run twice as slowly there.
if step "configure build/asan" cmake -S . -B build/asan -G Ninja \
     -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
     -DLOOM_SANITIZE=address,undefined -DLOOM_SANITIZE_SKIP="${ubsan_skipped}" -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_USE_CUDA=OFF \
     -DLOOM_BUILD_BENCHMARKS=OFF -DLOOM_HEADER_TEST=OFF -DLOOM_BUILD_MPI_TESTS=OFF \
     "-DLOOM_UNIT_TEST_EXCLUDE=test_plan_presets|test_plan_random|test_plan_combinators|test_explain|test_deadlock|test_graph|test_evoformer|test_schedule|test_schedule_checks|test_folding|test_search_cost|test_plan_search|test_order_search|test_workload_models|test_partition_traffic|test_folded_price|test_pipeline|test_pipeline_combinations|test_plan_vocabulary|test_plan_language|test_calibrate_host|test_search_threads"; then
  step "build build/asan" cmake --build build/asan --parallel "$jobs" -- -k 0
  step "ctest build/asan (unit, ASan+UBSan)" \
    ctest --test-dir build/asan --output-on-failure -j "$jobs" -L unit
else
  skip "build and ctest build/asan"
fi

# The tests whose code runs on several threads, under ThreadSanitizer (which cannot be
# combined with ASan, hence a build of its own). Only these targets are built.
tsan_targets=(test_comm test_search_threads)
tsan_regex="^($(IFS='|'; echo "${tsan_targets[*]}"))\$"
if step "configure build/tsan" cmake -S . -B build/tsan -G Ninja \
     -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
     -DLOOM_SANITIZE=thread -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_USE_CUDA=OFF \
     -DLOOM_BUILD_BENCHMARKS=OFF -DLOOM_HEADER_TEST=OFF; then
  step "build build/tsan" cmake --build build/tsan --parallel "$jobs" \
    --target "${tsan_targets[@]}" -- -k 0
  step "ctest build/tsan (${tsan_targets[*]}, TSan)" \
    ctest --test-dir build/tsan --output-on-failure -j "$jobs" -R "$tsan_regex"
else
  skip "build and ctest build/tsan"
fi

echo
echo "==> summary ($((SECONDS - start_all))s in all)"
printf '  %s\n' "${summary[@]}"
if (( failed )); then
  echo "tools/test.sh: FAILED"
  exit 1
fi
echo "tools/test.sh: all passed"
