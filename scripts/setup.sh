#!/usr/bin/env bash
# Installs every Debian 12 package sharpcheck needs (skipping those already installed; apt-get
# update runs only when something is missing), then configures and builds into ./build.
# Usage: bash scripts/setup.sh            (from the repository root; run as root or with sudo)
#        bash scripts/setup.sh --tests    also builds the sanitized (ASan/UBSan) copies of the core
#                                         suites that ctest runs (build/sanitized)
set -euo pipefail
cd "$(dirname "$0")/.."
build_tests=0
for arg in "$@"; do
  case "$arg" in
    --tests) build_tests=1 ;;
    *) echo "usage: scripts/setup.sh [--tests]" >&2; exit 2 ;;
  esac
done

# Every package CMakeLists.txt, a test or a CI step uses. Recommended packages are not installed
# (--no-install-recommends), so what a package only recommends but our build needs is listed too:
# Debian's dnnl-config.cmake calls find_package(OpenCL REQUIRED), which libdnnl-dev merely
# recommends (ocl-icd-opencl-dev), and clang's libFuzzer and sanitizer runtimes, which clang
# merely recommends (libclang-rt-14-dev). gnuplot-nox draws the studies' PNG copies (pngcairo).
packages=(
  g++ cmake make pkg-config git procps
  libboost-dev libmpfr-dev libgmp-dev
  librapidcheck-dev libz3-dev libgtest-dev libgmock-dev libbenchmark-dev
  libeigen3-dev libhwy-dev libflint-arb-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev zlib1g-dev
  libdnnl-dev ocl-icd-opencl-dev
  libtorch-dev libblas-dev libopenblas0-pthread python3-torch python3-numpy
  python3-dev pybind11-dev python3-pybind11 libdlpack-dev python3-pytest python3-pytest-xdist python3-mpmath
  python3-pip python3-venv python3-setuptools python3-wheel
  clang libclang-rt-14-dev clang-format clang-tidy
  gnuplot-nox
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]}"
  sudo_prefix=()
  if [ "$(id -u)" -ne 0 ]; then sudo_prefix=(sudo); fi
  "${sudo_prefix[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_prefix[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE="${SHARPCHECK_BUILD_TYPE:-RelWithDebInfo}" -DSHARPCHECK_WERROR=ON > build-configure.log 2>&1 ||
  { cat build-configure.log; exit 1; }
cmake --build build -j"$(nproc)"
if ((build_tests)); then
  echo "setup: building the sanitized core suites (build/sanitized)"
  cmake --build build --target sanitized_suites > build-sanitized.log 2>&1 || { tail -50 build-sanitized.log; exit 1; }
fi
