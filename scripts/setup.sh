#!/usr/bin/env bash
# Installs laga's Debian packages (Debian 12) and builds it into ./build. Safe to run again.
# clang, its runtimes (libFuzzer, sanitizers) and its OpenMP are for the sanitizer build (CMake preset
# `asan`, build-asan/: the tests under ASan + UBSan and the fuzz targets of scripts/fuzz.sh).
# libtorch-dev, libgloo-dev (the headers torch's ProcessGroupGloo.hpp includes), pybind11-dev and
# python3-pytest are for the Python package (python/, build/python).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev ocl-icd-opencl-dev opencl-headers libhwy-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  python3-torch python3-numpy python3-matplotlib
  libtorch-dev libgloo-dev pybind11-dev python3-pytest
  iproute2
  clang libclang-rt-14-dev libomp-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
