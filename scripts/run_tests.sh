#!/usr/bin/env bash
# Every ctest entry, in two runs (docs/testing.md):
#   1. the default run: every test but the labels below (under 5 minutes on 2 cores after the build);
#   2. the labelled run: lint (formatting, function sizes), sanitized (the ASan/UBSan suites),
#      soak (training and fuzzing runs), exhaustive (sweeps over every float, a million inputs) and
#      packaging (pip install and pip wheel into fresh venvs: tests/packaging.sh).
# Both runs always happen, so one failure does not hide another; the exit status is 1 if either
# failed. Usage: scripts/run_tests.sh [build-dir] (default build), jobs from SHARPCHECK_TEST_JOBS (2).
set -uo pipefail
build=${1:-build}
jobs=${SHARPCHECK_TEST_JOBS:-2}
labelled='lint|sanitized|soak|exhaustive|packaging'
status=0

start=$(date +%s)
ctest --test-dir "$build" --output-on-failure -j"$jobs" -LE "$labelled" || status=1
middle=$(date +%s)
echo "run_tests: default run took $((middle - start)) s"
ctest --test-dir "$build" --output-on-failure -j"$jobs" -L "$labelled" || status=1
echo "run_tests: labelled run ($labelled) took $(($(date +%s) - middle)) s"
exit $status
