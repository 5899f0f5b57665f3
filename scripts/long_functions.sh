#!/usr/bin/env bash
# Lists the project's functions longer than 80 lines (clang-tidy's readability-function-size,
# counted on the compiled sources of build/compile_commands.json and the headers they include) and
# its .cpp files over 500 lines. Tests are left out. Exit 1 when any is found.
# Usage: scripts/long_functions.sh [build-dir]
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/compile_commands.json" ] || { echo "no $build/compile_commands.json: run scripts/setup.sh" >&2; exit 2; }
mapfile -t sources < <(git ls-files '*.cpp' | grep -vE '^(tests|bench|examples)/|_fuzz|corpus_main')
found=0
for file in "${sources[@]}"; do
  lines=$(wc -l < "$file")
  if [ "$lines" -gt 500 ]; then echo "$file: $lines lines (over 500)"; found=1; fi
done
# Headers are measured too (inline functions and templates): -header-filter names the project's
# own folders, so a function defined in a header is reported once, from any source including it.
folders='core|formats|tensor|reference|kernels|inputs|io|metrics|bounds|studies|proofs|gate|ops|cli|python'
report=$(printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet \
  -header-filter="^$(pwd)/($folders)/" -checks='-*,readability-function-size' \
  -config='{CheckOptions: [{key: readability-function-size.LineThreshold, value: 80}]}' 2>/dev/null |
  grep -E "warning: function .* exceeds recommended size" | sort -u)
if [ -n "$report" ]; then echo "$report"; found=1; fi
[ $found = 0 ] && echo "no function over 80 lines, no .cpp over 500 lines"
exit $found
