#!/usr/bin/env bash
# pip's two ways in (issue 34), as a user takes them, offline:
#   1. a fresh venv (--system-site-packages: Debian's numpy and torch), pip install
#      --no-build-isolation . into it, then the README's Python example run from outside the
#      source tree with that venv's python and no PYTHONPATH;
#   2. pip wheel, a second fresh venv, the wheel installed with --no-index, the example again.
# Each run must import sharpcheck from its venv, not from the source or build tree.
# Usage: tests/packaging.sh SOURCE_DIR WORK_DIR [PYTHON]
set -euo pipefail
source_dir=$(cd "$1" && pwd)
work=$2
python=${3:-/usr/bin/python3}
mkdir -p "$work"
work=$(cd "$work" && pwd)
export SHARPCHECK_CMAKE_BUILD_DIR="$work/cmake"  # kept between runs: a second run is incremental
export SHARPCHECK_BUILD_JOBS=${SHARPCHECK_BUILD_JOBS:-2}
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH

# The README's first ```python block, as a user copies it.
example="$work/readme_example.py"
awk '/^```python$/ {inside = 1; next} inside && /^```$/ {exit} inside {print}' "$source_dir/README.md" > "$example"
grep -q "import sharpcheck" "$example" || { echo "packaging: README.md has no Python example"; exit 1; }
echo 'import sharpcheck, sys; print("imported from", sharpcheck.__file__, file=sys.stderr)' >> "$example"

run_example() {  # venv: runs the example in an empty folder and checks where sharpcheck came from
  local venv=$1 outside
  outside=$(mktemp -d "$work/outside.XXXX")
  (cd "$outside" && "$venv/bin/python" "$example") 2> "$outside/stderr" || { cat "$outside/stderr"; return 1; }
  grep -q "imported from $venv/" "$outside/stderr" || {
    echo "packaging: sharpcheck was not imported from $venv:"; cat "$outside/stderr"; return 1; }
  echo "packaging: the README example passed with $venv ($(grep 'imported from' "$outside/stderr"))"
}

rm -rf "$work/venv_install" "$work/venv_wheel" "$work/wheels" "$work"/outside.*
"$python" -m venv --system-site-packages "$work/venv_install"
start=$(date +%s)
"$work/venv_install/bin/pip" install --no-build-isolation "$source_dir" > "$work/pip_install.log" 2>&1 ||
  { tail -40 "$work/pip_install.log"; exit 1; }
echo "packaging: pip install took $(($(date +%s) - start)) s"
run_example "$work/venv_install"

"$python" -m venv --system-site-packages "$work/venv_wheel"
"$work/venv_wheel/bin/pip" wheel --no-build-isolation --no-deps -w "$work/wheels" "$source_dir" \
  > "$work/pip_wheel.log" 2>&1 || { tail -40 "$work/pip_wheel.log"; exit 1; }
wheel=$(ls "$work"/wheels/sharpcheck-*.whl)
"$work/venv_wheel/bin/pip" install "$wheel" > "$work/pip_wheel_install.log" 2>&1 ||
  { tail -40 "$work/pip_wheel_install.log"; exit 1; }
echo "packaging: installed $(basename "$wheel")"
run_example "$work/venv_wheel"
