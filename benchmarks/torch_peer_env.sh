#!/usr/bin/env bash
# Creates (when missing) a virtual environment with the newest PyTorch from the Python package
# index, the peer that benchmarks/host_train compares against, and prints its interpreter.
# For the benchmark only: never CI or the tests (the wheel is hundreds of megabytes).
#
#   benchmarks/torch_peer_env.sh [venv-dir]        default: build/torch-venv
#
# The index's Linux wheel declares the NVIDIA CUDA runtime packages (gigabytes) as
# dependencies. A CPU run does not need them when the machine's own CUDA libraries satisfy
# torch's import, so torch is first installed without dependencies plus its pure-Python
# ones; if `import torch` then fails, the full dependency set is installed. (On the machine
# of benchmarks/RESULTS.md, whose CUDA is older than the wheel's, the fallback was needed:
# the environment takes 5.4 GB.)
set -euo pipefail
venv="${1:-build/torch-venv}"
python="$venv/bin/python"
works() { "$python" -c 'import torch; torch.ones(2, requires_grad=True).sum().backward()' >/dev/null 2>&1; }
if [[ -x "$python" ]] && works; then
    echo "$python"
    exit 0
fi
base="${LOOM_TORCH_PEER_BASE_PYTHON:-/usr/bin/python3}"
"$base" -m venv "$venv" >&2
"$python" -m pip install --quiet --upgrade pip >&2
"$python" -m pip install --quiet --no-deps torch >&2
# torch's pure-Python requirements (and what torch.compile's inductor imports).
"$python" -m pip install --quiet filelock typing-extensions sympy networkx jinja2 fsspec setuptools numpy >&2
if ! works; then
    echo "torch_peer_env: import torch failed without the CUDA runtime packages; installing torch with all its dependencies" >&2
    "$python" -m pip install --quiet torch >&2
fi
if ! works; then
    echo "torch_peer_env: $python cannot import torch; delete $venv and rerun, or pass --python to host_train" >&2
    exit 1
fi
echo "$python"
