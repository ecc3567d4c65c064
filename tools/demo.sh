#!/usr/bin/env bash
# Builds the GPT training example (optimized) and runs it; arguments go to the program,
# e.g. `bash tools/demo.sh --steps 20`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/install_deps.sh

if [[ ! -d examples/train_gpt ]]; then
  echo "demo.sh: examples/train_gpt/ does not exist" >&2
  exit 1
fi

cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" \
  -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_EXAMPLES=ON -DLOOM_BUILD_BENCHMARKS=OFF
cmake --build build/release --target train_gpt --parallel "$(nproc 2>/dev/null || echo 2)"
exec build/release/examples/train_gpt "$@"
