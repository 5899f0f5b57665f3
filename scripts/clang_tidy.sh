#!/usr/bin/env bash
# Runs clang-tidy over the project's compiled sources (build/compile_commands.json) and the headers of
# its own folders: the bug-finding and performance checks of .clang-tidy, and the size rules —
# no function over 80 lines or over 8 parameters (readability-function-size) — plus no .cpp over 500
# lines. Tests, benchmarks and examples are left out. Prints every finding; exit 1 when any is found.
# Usage: scripts/clang_tidy.sh [build-dir]
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
# Headers are checked too (inline functions and templates): -header-filter names the project's own
# folders, so a finding in a header is reported once, from any source including it.
folders='core|formats|tensor|reference|kernels|inputs|io|metrics|bounds|studies|proofs|gate|ops|cli|python'
checks="$(sed -n '/^Checks:/,/^[A-Z]/p' .clang-tidy | grep -v '^[A-Z]' | tr -d ' \n'),readability-function-size"
report=$(printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet \
  -header-filter="^$(pwd)/($folders)/" -checks="-*,$checks" \
  -config='{CheckOptions: [{key: readability-function-size.LineThreshold, value: 80},
                           {key: readability-function-size.ParameterThreshold, value: 8}]}' 2>/dev/null |
  grep -E "warning: .*\[[a-z-]+(,[a-z-]+)*\]$" | sort -u)
if [ -n "$report" ]; then echo "$report"; found=1; fi
[ $found = 0 ] && echo "clang-tidy: no finding (bug-finding and performance checks, function size and parameter count)"
exit $found
