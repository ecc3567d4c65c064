#!/usr/bin/env bash
# Installs what loom needs to build, test and run its demo on Debian 12. Does nothing (and
# needs no network) when every package is already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache
  catch2 librange-v3-dev libboost-graph-dev nlohmann-json3-dev
  libopenblas-dev libopenmpi-dev openmpi-bin libbenchmark-dev libcli11-dev libmimalloc-dev
  python3 python3-torch python3-numpy
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$package")
done

if (( ${#missing[@]} == 0 )); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if (( EUID != 0 )); then
  sudo=(sudo)
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
