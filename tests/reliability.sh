#!/usr/bin/env bash
# The reliability suite: each attack of a hostile user, file system or plugin against the real
# program, one ctest entry per attack (tests/CMakeLists.txt). Each asserts the exit code, that the
# report parses (read back through `sharpcheck merge`, which checks every case record) and holds
# the finished cases, and that no process the run started is left behind.
# Usage: reliability.sh ATTACK SHARPCHECK PLUGIN_DIR WORK_DIR
set -u
attack=$1 sharpcheck=$2 plugins=$3 work=$4/reliability_$1
rm -rf "$work" && mkdir -p "$work"
cd "$work" || exit 1

fail() { echo "FAIL [$attack]: $*"; exit 1; }
plugin() { echo "$plugins/libtest_plugin_$1.so"; }

# Runs the program; sets $code and $out (stdout and stderr together).
run() {
  out=$(timeout 120 "$sharpcheck" "$@" 2>&1)
  code=$?
}
expect_code() { [ "$code" = "$1" ] || fail "exit $code, expected $1; output:\n$out"; }
expect_text() { grep -qE -- "$1" <<<"$out" || fail "output does not match '$1':\n$out"; }
# The report parses and holds at least $2 cases.
expect_report() {
  local merged
  merged=$("$sharpcheck" merge "$1" --json "$work/reparsed.json" 2>&1)
  grep -qE "merged 1 reports: [0-9]+ cases" <<<"$merged" || fail "report $1 does not read back: $merged"
  local cases
  cases=$(grep -oE "[0-9]+ cases" <<<"$merged" | head -1 | cut -d' ' -f1)
  [ "$cases" -ge "$2" ] || fail "report $1 holds $cases cases, expected at least $2"
}
expect_no_process() {
  command -v pgrep >/dev/null || fail "pgrep is missing (Debian: procps, installed by scripts/setup.sh)"
  ! pgrep -x "$1" >/dev/null || { pkill -9 -x "$1"; fail "processes named $1 outlived the run"; }
}
valid_utf8() { iconv -f UTF-8 -t UTF-8 "$1" >/dev/null 2>&1 || fail "$1 is not valid UTF-8"; }

case $attack in
  unwritable_reports)
    for target in "$work/missing/r.json" /proc/x.json "$work"; do
      run gate --kernel safe3 --sizes 16 --json "$target"
      expect_code 2; expect_text "I/O error: cannot write"
    done
    run gate --kernel safe3 --sizes 16 --junit "$work/missing/r.xml"
    expect_code 2; expect_text "I/O error"
    run prove --filter Lemma --json "$work/missing/p.json"
    expect_code 2; expect_text "I/O error"
    run study --out /proc/study
    expect_code 2; expect_text "I/O error"
    run bounds --json "$work/missing/b.json"
    expect_code 2; expect_text "I/O error"
    [ -z "$(find "$work" -name '*.partial')" ] || fail "a failed write left a temporary file" ;;
  small_file_systems)
    if [ "$(id -u)" != 0 ] || ! mkdir -p ro full || ! mount -t tmpfs -o ro,size=1m tmpfs ro 2>/dev/null; then
      echo "SKIPPED: needs root and tmpfs mounts"; exit 0
    fi
    mount -t tmpfs -o size=96k tmpfs full || { umount ro; echo "SKIPPED: no tmpfs"; exit 0; }
    trap 'umount ro full' EXIT
    run gate --kernel safe3 --sizes 16 --json ro/r.json
    expect_code 2; expect_text "I/O error: cannot write 'ro/r.json'"
    # The report outgrows 96 KiB mid-run: the run stops, says so, keeps the table of what finished.
    run gate --kernel safe3,online2 --json full/r.json
    expect_code 2; expect_text "I/O error: cannot write 'full/r.json'.*(No space|writing failed)|No space"
    expect_text "the sweep stopped after [0-9]+ of"
    [ -z "$(find full -name '*.partial')" ] || fail "a failed write left a temporary file" ;;
  malformed_budgets)
    echo '{"kernels": {"safe3": {"max_ulps": "8"}}}' > string.json
    run gate --kernel safe3 --sizes 16 --budget string.json
    expect_code 2; expect_text "entry 'safe3'.*max_ulps must be a non-negative integer"
    echo '{"kernels": {"safe3": {"max_ulps": -1}}}' > negative.json
    run gate --kernel safe3 --sizes 16 --budget negative.json
    expect_code 2; expect_text "max_ulps must be a non-negative integer"
    echo '{"cases": {"x": {"max_bound_ratio": -0.5}}}' > baseline.json
    run gate --kernel safe3 --sizes 16 --baseline baseline.json
    expect_code 2; expect_text "max_bound_ratio must be a number >= 0"
    # a directory or a FIFO as a file to read: refused by name (an internal error, or a hang, before)
    mkdir -p a_directory; mkfifo a_fifo
    run gate --kernel safe3 --sizes 16 --baseline a_directory
    expect_code 2; expect_text "a_directory' is not a regular file"
    out=$(timeout 20 "$sharpcheck" merge a_fifo --json merged.json 2>&1); code=$?
    expect_code 2; expect_text "a_fifo' is not a regular file" ;;
  numeric_options)
    for sizes in 0 "" -1 16,x 99999999999999999999999; do
      run gate --kernel safe3 --sizes "$sizes"
      expect_code 2; expect_text "sizes"
    done
    for shard in 1/-1 0/2x 2/2 0/0 /2; do
      run gate --kernel safe3 --sizes 16 --shard "$shard"
      expect_code 2; expect_text "shard"
    done
    for timeout in nan inf -1 0 1e9 ""; do
      run gate --plugin "$(plugin good)" --sizes 16 --plugin-timeout "$timeout"
      expect_code 2; expect_text "plugin-timeout"
    done
    for seed in -1 99999999999999999999999 1e3 ""; do  # never wrapped or saturated
      run gate --kernel safe3 --sizes 16 --seed "$seed"
      expect_code 2; expect_text "seed"
    done
    run gate --kernel safe3 --sizes 16 --threads 100000
    expect_code 2; expect_text "threads"
    # 1,000 threads under a 1.5 GB address-space limit: the system refuses most; the gate runs on
    # those it got.
    out=$(ulimit -v 1500000; timeout 120 "$sharpcheck" gate --kernel safe3 --sizes 16 --threads 1000 2>&1)
    code=$?
    expect_code 0; expect_text "8 cases in"
    run gate --plugin "" --sizes 16
    expect_code 2; expect_text "path is empty"
    run gate --kernel safe3 --sizes 16,16,32,16 --json sizes.json
    expect_code 0; expect_text "(^|[^0-9])16 cases in"
    [ "$(grep -c '"id": "safe3/uniform/n=16"' sizes.json)" = 1 ] || fail "a repeated size gave duplicate case ids" ;;
  plugins_failing_to_load)
    run gate --plugin "$(plugin info_segfault)" --sizes 16
    expect_code 3; expect_text "plugin crash: .*killed by Segmentation fault"
    SECONDS=0
    run gate --plugin "$(plugin info_hang)" --sizes 16 --plugin-timeout 1
    expect_code 3; expect_text "no answer within 1"
    [ $SECONDS -lt 20 ] || fail "a plugin hanging in its info function held the gate $SECONDS s"
    expect_no_process sc_info_hang
    run gate --plugin "$(plugin constructor_abort)" --sizes 16
    expect_code 3; expect_text "killed by Aborted"
    head -c 3000 "$(plugin good)" > truncated.so
    run gate --plugin "$work/truncated.so" --sizes 16
    { [ "$code" = 2 ] || [ "$code" = 3 ]; } || fail "a truncated plugin: exit $code\n$out"
    expect_text "plugin .*truncated.so"
    run gate --plugin "$(plugin no_formats)" --sizes 16
    expect_code 2; expect_text "declares no softmax or attention format" ;;
  plugin_that_forks)
    run gate --plugin "$(plugin forks)" --sizes 16 --json forks.json
    expect_code 0; expect_text "plugin:forks:fp32 .* pass"
    expect_report forks.json 14
    expect_no_process sc_grandchild
    expect_no_process sc_detached ;;
  plugin_memory_limit)
    run gate --plugin "$(plugin hoarder)" --sizes 16 --case plugin:hoarder:fp32/uniform/n=16 --plugin-memory 512M \
      --json hoarder.json --reproducers "$work/reproducers"
    expect_code 3; expect_text "ran out of memory: ran out of its memory limit of 512 MiB"
    expect_report hoarder.json 1
    run gate --plugin "$(plugin good)" --sizes 16 --plugin-memory 1K
    expect_code 2; expect_text "plugin-memory" ;;
  plugin_console_and_names)
    run gate --plugin "$(plugin chatty)" --sizes 16 --json chatty.json --junit chatty.xml
    expect_code 0
    ! grep -q "chatty plugin" <<<"$out" || fail "plugin output mixed into the table:\n$out"
    grep -q '"console": ".*chatty plugin: 1 rows of 16' chatty.json || fail "plugin output not in the report"
    grep -q "<system-out>chatty plugin" chatty.xml || fail "plugin output not in the JUnit report"
    run gate --plugin "$(plugin bad_utf8_name)" --sizes 16 --json utf8.json --junit utf8.xml
    expect_code 0
    expect_report utf8.json 14
    valid_utf8 utf8.json; valid_utf8 utf8.xml
    grep -q $'plugin:bad\xEF\xBF\xBD\xEF\xBF\xBD_name' utf8.json || fail "the invalid bytes were not replaced by U+FFFD" ;;
  signals_keep_the_report)
    # SIGTERM while a plugin child spins: exit 143, the child killed, the finished cases kept.
    "$sharpcheck" gate --plugin "$(plugin sigterm_spin)" --sizes 16,64 --plugin-timeout 100 --json term.json \
      --reproducers "$work/reproducers" >term.out 2>&1 &
    gate_pid=$!
    for _ in $(seq 100); do pgrep -x sc_sigterm_spin >/dev/null && break; sleep 0.1; done
    pgrep -x sc_sigterm_spin >/dev/null || fail "the spinning plugin never started:\n$(cat term.out)"
    kill -TERM $gate_pid; wait $gate_pid; code=$?
    out=$(cat term.out)
    expect_code 143; expect_text "interrupted by signal 15"
    expect_no_process sc_sigterm_spin
    expect_report term.json 1
    [ "$(grep -c '"id":' term.json)" = 1 ] || fail "the report does not hold exactly the one finished case"
    grep -q '"complete": false' term.json || fail "an interrupted report does not say it is incomplete"
    # Every other signal whose default ends the process quietly is a request to stop too: a closed
    # terminal's SIGHUP and SIGUSR1 (both left the plugin's child running and the report unfinished).
    for signal_name in HUP USR1; do
      "$sharpcheck" gate --plugin "$(plugin sigterm_spin)" --sizes 16,64 --plugin-timeout 100 \
        --json "$signal_name.json" >"$signal_name.out" 2>&1 &
      gate_pid=$!
      for _ in $(seq 100); do pgrep -x sc_sigterm_spin >/dev/null && break; sleep 0.1; done
      pgrep -x sc_sigterm_spin >/dev/null || fail "the spinning plugin never started:\n$(cat "$signal_name.out")"
      kill -"$signal_name" $gate_pid; wait $gate_pid; code=$?
      out=$(cat "$signal_name.out")
      expect_code $((128 + $(kill -l "$signal_name"))); expect_text "interrupted by signal"
      expect_no_process sc_sigterm_spin
      expect_report "$signal_name.json" 1
      grep -q '"complete": false' "$signal_name.json" || fail "the report after SIG$signal_name is not marked incomplete"
    done
    # A console whose reader went away (sharpcheck gate | head) is no reason to stop: the report is
    # written whole.
    set -o pipefail
    "$sharpcheck" gate --kernel safe3 --sizes 16,64 --json piped.json 2>&1 | head -c 1 >/dev/null
    set +o pipefail
    "$sharpcheck" gate --kernel safe3 --sizes 16,64 --json unpiped.json >/dev/null 2>&1
    ! grep -q '"complete": false' piped.json && [ "$(grep -c '"id":' piped.json)" = "$(grep -c '"id":' unpiped.json)" ] ||
      fail "a closed console pipe stopped the run:\n$(head -c 300 piped.json)"
    # SIGINT during a built-in sweep: exit 130 and the report holds what finished.
    "$sharpcheck" gate --threads 1 --json int.json --junit int.xml >int.out 2>&1 &
    gate_pid=$!
    # Interrupt once the first case is in the report (a fixed sleep races a loaded machine).
    for _ in $(seq 300); do grep -q '"id":' int.json 2>/dev/null && break; sleep 0.1; done
    kill -INT $gate_pid; wait $gate_pid; code=$?
    out=$(cat int.out)
    expect_code 130
    expect_report int.json 1
    [ "$(grep -c '<testcase' int.xml)" = "$(grep -c '"id":' int.json)" ] || fail "JSON and JUnit disagree"
    # SIGTERM during compare: exit 143 with a message and a report saying the run is incomplete
    # (compare died with neither).
    /usr/bin/python3 -c "
import numpy as np
r = np.random.default_rng(3)
for name in 'qkv': np.save(name + '_big.npy', r.normal(size=(1, 16, 1024, 64)).astype(np.float32))
np.save('out_big.npy', np.zeros((1, 16, 1024, 64), np.float32))
" || fail "could not write the arrays"
    "$sharpcheck" compare --q q_big.npy --k k_big.npy --v v_big.npy --out out_big.npy \
      --json compare_term.json >compare_term.out 2>&1 &
    compare_pid=$!
    sleep 1
    kill -TERM $compare_pid; wait $compare_pid; code=$?
    out=$(cat compare_term.out)
    expect_code 143; expect_text "interrupted by signal 15"
    grep -q '"complete": false' compare_term.json || fail "compare's interrupted report is missing or complete"
    # ... and it keeps the heads judged before the signal, saying how many (they were lost).
    grep -qE '"incomplete": "interrupted by signal 15 after [0-9]+ of 16 heads' compare_term.json ||
      fail "compare's interrupted report lost the heads judged:\n$(head -c 600 compare_term.json)" ;;
  vacuous_inputs)
    dict="{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }"
    printf '\x93NUMPY\x01\x00\x76\x00%s%*s\n' "$dict" $((128 - 10 - ${#dict} - 1)) '' > empty.npy
    run compare --logits empty.npy --probs empty.npy --format fp32
    expect_code 2; expect_text "holds no element"
    run gate --kernel none
    expect_code 2; expect_text "no cases"
    echo '{"seed": 1, "shard": "0/1", "cases": []}' > nothing.json
    run merge nothing.json --json merged.json
    expect_code 2; expect_text "hold no case"
    echo '{"seed": 1, "shard": "0/1", "cases": [{"id": "x"}]}' > partial.json
    run merge partial.json --json merged.json
    expect_code 2; expect_text "has no valid" ;;
  tiny_temperature)
    # An exactly correct one-hot output at theta = 1e-9: the zeros' allowance was NaN ("allowed
    # -nan"), a false failure.
    dict="{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"
    printf '\x93NUMPY\x01\x00\x76\x00%s%*s\n' "$dict" $((128 - 10 - ${#dict} - 1)) '' > header.bin
    { cat header.bin; printf '\x00\x00\x80\x3f\x00\x00\x00\x00\x00\x00\x00\x00'; } > one_hot.npy
    run compare --logits one_hot.npy --probs one_hot.npy --format fp32 --theta 1e-9
    # A one-hot row cannot discriminate: it is inconclusive (exit 0), not a plain pass.
    expect_code 0; expect_text "max 0 ulp"; expect_text "^inconclusive: only 0 of 3"
    ! grep -q "nan" <<<"$out" || fail "a NaN allowance is reported:\n$out" ;;
  merge_verdicts)
    run gate --plugin "$(plugin segfault)" --sizes 16,64 --json crash.json --reproducers "$work/reproducers"
    expect_code 3
    run merge crash.json --json merged.json
    expect_code 3; expect_text "crashed"
    run merge crash.json crash.json --json twice.json
    expect_code 3; expect_text "duplicate cases dropped"
    [ "$(grep -c '"id":' twice.json)" = "$(grep -c '"id":' crash.json)" ] || fail "merge kept duplicate cases"
    run gate --plugin "$(plugin segfault)" --sizes 16,64 --reproducers /proc/no/reproducers --json noreproducer.json
    expect_code 3; expect_text "no reproducer"
    grep -q '"status": "crash"' noreproducer.json || fail "the crash case was dropped from the report" ;;
  round_three_refusals)
    # An unknown status in a report to merge is refused, not counted as a pass.
    run gate --kernel safe3 --sizes 16 --json one.json
    expect_code 0
    # Reports of different sweeps (other kernels) are not shards of one: refused, in either order,
    # rather than one run's cases dropped as "duplicates" of the other's.
    run gate --kernel naive --sizes 16 --json other.json
    for pair in "one.json other.json" "other.json one.json"; do
      run merge $pair --json mixed.json
      expect_code 2; expect_text "not shards of one sweep"
    done
    # A report nested 100,000 deep (merge once crashed on it) is refused while parsing.
    /usr/bin/python3 -c "
text = open('one.json').read()
open('deep.json', 'w').write(text.replace('\"seed\":', '\"extra\": ' + '[' * 100000 + ']' * 100000 + ', \"seed\":', 1))
" || fail "could not write the nested report"
    run merge deep.json --json deep_merged.json
    expect_code 2; expect_text "nests deeper than 64 levels"
    sed 's/"status": "pass"/"status": "FAIL"/' one.json > unknown.json
    run merge unknown.json --json merged.json
    expect_code 2; expect_text "unknown status"
    # Wrongly typed fields are refused naming the field (a ratio "abc" and a seed -1 were copied).
    sed '0,/"max_bound_ratio": [0-9.e-]*/s//"max_bound_ratio": "abc"/' one.json > ratio.json
    run merge ratio.json --json merged.json
    expect_code 2; expect_text '"max_bound_ratio" is "abc"'
    sed '0,/"max_bound_ratio": [0-9.e-]*/s//"max_bound_ratio": -1/' one.json > negative.json
    run merge negative.json --json merged.json
    expect_code 2; expect_text '"max_bound_ratio" is -1, not a number >= 0'
    /usr/bin/python3 -c "
import json
report = json.load(open('one.json'))
report['cases'][0]['n'] = -1
json.dump(report, open('count.json', 'w'))
report['cases'][0]['n'] = 16
report['cases'][0]['tiers'] = 3
json.dump(report, open('tiers.json', 'w'))
" || fail "could not write the mistyped reports"
    run merge count.json --json merged.json
    expect_code 2; expect_text '"n" is -1, not a count'
    run merge tiers.json --json merged.json
    expect_code 2; expect_text '"tiers" is 3, not an object'
    # The same case with another verdict in a second report is refused in either order (the first
    # given used to be kept, the other dropped as a duplicate).
    sed '0,/"status": "pass"/s//"status": "fail"/' one.json > conflicting.json
    for pair in "one.json conflicting.json" "conflicting.json one.json"; do
      run merge $pair --json merged.json
      expect_code 2; expect_text "merge the reports of one run"
    done
    sed 's/"seed": 20241008/"seed": -1/' one.json > seed.json
    run merge seed.json --json merged.json
    expect_code 2; expect_text "has the seed -1"
    # An empty report path is refused, on every command that writes one.
    for command in "gate --kernel safe3 --sizes 16" "bounds" "prove --filter Lemma"; do
      run $command --json ""
      expect_code 2; expect_text "report path is empty"
    done
    # An .npz zip bomb: a 2 MB member whose header promises 2 GiB is refused by its header's shape
    # before it is inflated (it cost 17 s and 2.1 GB, and under a memory limit named no file).
    /usr/bin/python3 - <<'PY' || fail "could not write the bomb"
import io, zipfile, numpy as np
with zipfile.ZipFile("bomb.npz", "w", compression=zipfile.ZIP_DEFLATED) as z:
    b = io.BytesIO(); np.save(b, np.zeros((4, 16), np.float32)); z.writestr("logits.npy", b.getvalue())
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (131072, 4096)})
    with z.open("probs.npy", "w", force_zip64=True) as f:
        f.write(header.getvalue())
        for _ in range(128): f.write(bytes(1 << 24))
PY
    out=$(ulimit -v 1000000; timeout 120 "$sharpcheck" compare --bundle bomb.npz 2>&1)
    code=$?
    expect_code 2; expect_text "does not match"
    # A NaN in q is named by its file and full index (compare named neither file nor index).
    /usr/bin/python3 - <<'PY' || fail "could not write the tensors"
import numpy as np
r = np.random.default_rng(3)
for name in "qkv": np.save(name + "_nan.npy", r.normal(size=(1, 2, 4, 8)).astype(np.float32))
q = np.load("q_nan.npy"); q[0, 1, 2, 3] = np.nan; np.save("q_nan.npy", q)
np.save("out_nan.npy", np.zeros((1, 2, 4, 8), np.float32))
PY
    run compare --q q_nan.npy --k k_nan.npy --v v_nan.npy --out out_nan.npy
    expect_code 2; expect_text "q_nan.npy\[0, 1, 2, 3\] is NaN"
    # A plugin limit with a bad value is refused even without a plugin (nan was accepted).
    for limit in "--plugin-timeout nan" "--plugin-timeout -1" "--plugin-memory abc"; do
      run gate --kernel safe3 --sizes 16 $limit
      expect_code 2; expect_text "${limit%% *}"
    done
    # A filter that matches no proof obligation is a usage error, not a failed proof.
    run prove --filter no_such_obligation
    expect_code 2; expect_text "matches no proof obligation"
    # An .npz with two members of one name (NumPy reads the last, a first match the first).
    /usr/bin/python3 - <<'PY' || fail "could not write the archive"
import io, zipfile, numpy as np
def member(a):
    b = io.BytesIO(); np.save(b, a); return b.getvalue()
with zipfile.ZipFile("twice.npz", "w") as z:
    z.writestr("logits.npy", member(np.zeros((2, 4), np.float32)))
    z.writestr("probs.npy", member(np.full((2, 4), 0.25, np.float32)))
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        z.writestr("probs.npy", member(np.zeros((2, 4), np.float32)))
PY
    run compare --bundle twice.npz --format fp32
    expect_code 2; expect_text "two members named 'probs'"
    # A shard that is not i/N with i < N is refused.
    sed 's|"shard": "0/1"|"shard": "5/2"|' one.json > shard.json
    run merge shard.json --json merged.json
    expect_code 2; expect_text "is not i/N"
    # compare in backward mode judges a forward output handed over too (7.0 everywhere fails).
    /usr/bin/python3 - <<'PY' || fail "could not write the arrays"
import numpy as np, torch
r = np.random.default_rng(0)
q, k, v, do = (r.standard_normal((1, 1, 8, 4)).astype(np.float32) for _ in range(4))
Q, K, V = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
o = torch.softmax(Q @ K.transpose(-1, -2) / 2.0, -1) @ V
o.backward(torch.tensor(do, dtype=torch.float64))
arrays = dict(q=q, k=k, v=v, dout=do, dq=Q.grad.float().numpy(), dk=K.grad.float().numpy(),
              dv=V.grad.float().numpy(), out=np.full((1, 1, 8, 4), 7, np.float32))
for name, x in arrays.items():
    np.save(name + ".npy", x)
PY
    run compare --q q.npy --k k.npy --v v.npy --dout dout.npy --dq dq.npy --dk dk.npy --dv dv.npy --out out.npy --format fp32
    expect_code 1; expect_text "forward:"
    run compare --q q.npy --k k.npy --v v.npy --dout dout.npy --dq dq.npy --dk dk.npy --dv dv.npy --format fp32
    expect_code 0 ;;
  verdict_agreement)
    run gate --kernel naive --sizes 16 --junit naive.xml
    expect_code 1
    grep -q 'testsuite name="sharpcheck.naive" tests="[0-9]*" failures="[1-9]' naive.xml ||
      fail "JUnit shows no failure where the exit code is 1: $(grep testsuite naive.xml)"
    for shard in 0/2 1/2; do
      run gate --sizes 16 --shard "$shard" --json "shard${shard%/2}.json"
      expect_code 0
      ! grep -q "UNEXPECTED PASS" <<<"$out" || fail "shard $shard calls an expected failure an unexpected pass"
    done
    run merge shard0.json shard1.json --json merged.json --junit merged.xml
    expect_code 0
    run merge shard0.json --json half.json
    expect_code 0; expect_text "not every shard given" ;;
  compare_reruns)
    data=$(dirname "$0")/data/npy
    run compare --logits "$data/logits_f4_v1.npy" --probs "$data/logits_f4_v1.npy" --format fp32 --json compare.json
    expect_code 1
    rerun=$(grep -oE '"rerun": "[^"]*"' compare.json | cut -d'"' -f4)
    [[ $rerun == "sharpcheck compare "* ]] || fail "compare's rerun is not a compare command: $rerun"
    run ${rerun#sharpcheck }
    expect_code 1; expect_text "FAIL tolerance table"
    # Baselines keyed by --name, not by file name: a copy of the outputs under another file name
    # is judged against the same baseline; a worse output under that name is a regression.
    good=$data/probs_f4_v1.npy
    run compare --logits "$data/logits_f8_fortran_v2.npy" --probs "$good" --format fp32 --name my_kernel \
      --baseline base.json --update-baseline
    expect_code 0; expect_text "baseline written"
    grep -q '"my_kernel/npy/n=' base.json || fail "the baseline is not keyed by --name: $(cat base.json)"
    cp "$good" renamed.npy
    run compare --logits "$data/logits_f8_fortran_v2.npy" --probs renamed.npy --format fp32 --name my_kernel \
      --baseline base.json
    expect_code 0
    run compare --logits "$data/logits_f8_fortran_v2.npy" --probs "$data/logits_f4_v1.npy" --format fp32 \
      --name my_kernel --baseline base.json
    expect_code 1; expect_text "baseline regression" ;;
  concurrent_reports)
    "$sharpcheck" gate --kernel safe3 --sizes 16,64 --json same.json >a.out 2>&1 & first=$!
    "$sharpcheck" gate --kernel safe3 --sizes 16,64 --json same.json >b.out 2>&1 & second=$!
    wait $first || fail "first gate: $(cat a.out)"
    wait $second || fail "second gate: $(cat b.out)"
    expect_report same.json 14
    [ -z "$(ls | grep partial)" ] || fail "temporaries left behind" ;;
  report_targets)
    # A report path naming a FIFO, a symbolic link or a device is written through, never replaced.
    mkfifo fifo
    (cat fifo > from_fifo.json &)
    sleep 0.2
    run bounds --json fifo
    expect_code 0
    sleep 0.2
    [ -p fifo ] || fail "the FIFO was replaced by a regular file"
    grep -q adaptive_temperature_active_interval from_fifo.json || fail "the FIFO's reader got no report"
    echo old > target.json
    ln -s target.json link.json
    run bounds --json link.json
    expect_code 0
    [ -L link.json ] || fail "the symbolic link was replaced by a regular file"
    grep -q adaptive_temperature_active_interval target.json || fail "the link's target was not updated"
    # A dangling link (its target not written yet) keeps the link and creates the target.
    mkdir -p reports
    ln -s reports/new.json dangling.json
    run bounds --json dangling.json
    expect_code 0
    [ -L dangling.json ] || fail "the dangling symbolic link was replaced by a regular file"
    grep -q adaptive_temperature_active_interval reports/new.json || fail "the dangling link's target was not created"
    # A report named with 250 characters (the file system allows 255): the temporary beside it
    # must fit too.
    long_name=$(printf 'r%.0s' $(seq 250)).json
    run bounds --json "$long_name"
    expect_code 0
    grep -q adaptive_temperature_active_interval "$long_name" || fail "the report with a 250-character name was not written"
    ln -s loop_b.json loop_a.json; ln -s loop_a.json loop_b.json
    run bounds --json loop_a.json
    expect_code 2; expect_text "too many levels of symbolic links"
    run bounds --json /dev/null
    expect_code 0
    [ -c /dev/null ] || fail "/dev/null is no longer a character device"
    # A FIFO nobody reads is an I/O error, not a hang.
    mkfifo unread
    run bounds --json unread
    expect_code 2; expect_text "FIFO with no reader"
    # compare refuses an unwritable report path before judging anything.
    data=$(cd "$(dirname "$0")" && pwd)/data/npy
    run compare --logits "$data/logits_f4_v1.npy" --probs "$data/probs_f4_v1.npy" --json "$work/missing/r.json"
    expect_code 2; expect_text "directory is missing or not writable"
    [ -z "$(grep -E '^(pass|FAIL)' <<<"$out")" ] || fail "compare judged before refusing the report path" ;;
  *) fail "no attack named $attack" ;;
esac
echo "passed: $attack"
