"""Python options misused as users misuse them: each is a TypeError or ValueError naming the option
(before, pybind11's "Unable to cast Python instance" named none, and some passed silently)."""

import os

import numpy as np
import pytest
import torch

import sharpcheck

Q = torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(3))
OUT = sharpcheck.attention(Q, Q, Q, causal=True)


@pytest.mark.parametrize("options, names", [
    ({"window": 5}, "window"),
    ({"window": (1.5, 2)}, "window"),
    ({"window": (-5, -5)}, "window"),
    ({"window": "1,2"}, "window"),
    ({"sinks": [[0.5, 0.5]]}, "sinks"),
    ({"key_lengths": [4.5]}, "key_lengths"),
    ({"causal": "no"}, "causal"),
    ({"theta": "1"}, "theta"),
    ({"scale": object()}, "scale"),
])
def test_a_misused_attention_option_is_refused_by_name(options, names):
    with pytest.raises((TypeError, ValueError), match=names):
        sharpcheck.assert_attention_close(OUT, Q, Q, Q, **{"causal": True, **options})


@pytest.mark.parametrize("options, names", [
    ({"dim": 2 ** 70}, "dim"),
    ({"threads": 2 ** 64}, "threads"),
    ({"name": "\udcff"}, "name"),
])
def test_a_misused_softmax_option_is_refused_by_name(options, names):
    x = torch.randn(2, 8)
    with pytest.raises((TypeError, ValueError), match=names):
        sharpcheck.assert_softmax_close(torch.softmax(x, -1), x, **options)


@pytest.mark.parametrize("options, names", [
    ({"theta": "1"}, "theta"),
    ({"proven_only": "true"}, "proven_only"),
    ({"causal": 1}, "causal"),
    ({"key_lengths": [8.0]}, "key_lengths"),
    ({"threads": 2.0}, "threads"),
    ({"scale": True}, "scale"),
    ({"tolerance": 3}, "tolerance"),
])
def test_judge_refuses_a_value_of_another_type_than_its_options_kind(options, names):
    """From issue 33's round: judge() passed every option to the schema as text, so theta="1",
    proven_only="true" and key_lengths=[8.0] were read as 1, true and 8 where assert_attention_close
    refuses them. Each is now a ValueError naming the option and the type its kind takes."""
    with pytest.raises(ValueError, match=rf"{names}: expected"):
        sharpcheck.judge("attention", q=Q, k=Q, v=Q, out=OUT, **{"causal": True, **options})


def test_judge_takes_the_right_forms_of_each_kind():
    report = sharpcheck.judge("attention", q=Q, k=Q, v=Q, out=OUT, causal=np.bool_(True), theta=np.float64(1.0),
                              scale=torch.tensor(0.25), key_lengths=np.array([8]), threads=1, tolerance="attention_fp32")
    assert report.passed
    assert sharpcheck.judge("attention", q=Q, k=Q, v=Q, out=OUT, causal=True, key_lengths=8).passed


def test_the_right_forms_still_work():
    assert sharpcheck.assert_attention_close(OUT, Q, Q, Q, causal=True, window=(None, 0)).passed
    assert sharpcheck.assert_attention_close(OUT, Q, Q, Q, causal=np.bool_(True), window=(-1, 0)).passed
    assert sharpcheck.assert_attention_close(OUT, Q, Q, Q, causal=True, theta=np.float64(1.0)).passed


def test_a_nan_input_is_named_by_its_array_and_full_position():
    x = np.random.default_rng(0).standard_normal((40, 8))
    x[37, 5] = np.nan
    with pytest.raises(ValueError, match=r"logits\[37, 5\] is NaN"):
        sharpcheck.assert_softmax_close(np.zeros_like(x), x)
    q = torch.randn(1, 2, 12, 4)
    q[0, 1, 9, 3] = float("nan")
    with pytest.raises(ValueError, match=r"q\[0, 1, 9, 3\] is NaN"):
        sharpcheck.assert_attention_close(q, q, q, q)
    # The reference names the element at its index in the caller's layout (it gave a flat index).
    with pytest.raises(ValueError, match=r"Q\[0, 1, 9, 3\] \(bhsd\) is NaN"):
        sharpcheck.attention(q, q, q)
    with pytest.raises(ValueError, match=r"Q\[0, 9, 1, 3\] \(bshd\) is NaN"):
        sharpcheck.attention(q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), layout="bshd")
    v = torch.zeros(1, 2, 12, 4)
    v[0, 0, 11, 2] = float("inf")
    with pytest.raises(ValueError, match=r"V\[0, 0, 11, 2\] \(bhsd\) is infinite"):
        sharpcheck.attention(torch.zeros(1, 2, 12, 4), torch.zeros(1, 2, 12, 4), v)


def test_a_negative_view_is_read_as_what_it_means():
    """x._neg_view() keeps y's memory and a bit meaning -y: read raw, a negated output passed."""
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(5))
    y = torch.softmax(x, -1)
    assert sharpcheck.assert_softmax_close((-y)._neg_view(), x).passed
    with pytest.raises(AssertionError):
        sharpcheck.assert_softmax_close(y._neg_view(), x)


def test_a_non_finite_dy_is_named_in_dy_at_its_full_index():
    # It read "logits, lane 1 (starting at element 2): softmax_backward: dy 1 is not finite".
    dy = np.array([[0.1, 0.2], [0.3, np.inf]])
    with pytest.raises(ValueError, match=r"dy\[1, 1\] is not finite \(inf\)"):
        sharpcheck.softmax_backward(dy, np.array([[0.0, 1.0], [1.0, 2.0]]))


def test_a_truncated_memory_map_is_refused_by_name_not_a_bus_error(tmp_path):
    """A np.memmap whose file was truncated after mapping: reading its lost pages raises SIGBUS,
    which killed the interpreter (exit 135). Run in a child so that a regression fails this test
    instead of killing pytest."""
    import subprocess
    import sys
    script = f"""
import numpy as np, os, sharpcheck
path = {str(tmp_path / 'x.bin')!r}
np.zeros((4096, 64), dtype=np.float32).tofile(path)
mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(4096, 64))
os.truncate(path, 4096)
try:
    sharpcheck.softmax(mapped)
except ValueError as error:
    print(error)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "logits: its memory cannot be read" in done.stdout and "byte 4096" in done.stdout, done.stdout


def test_a_memory_map_truncated_while_the_judge_runs_cannot_kill_it(tmp_path):
    """The kernel's output is a np.memmap, and another process truncates its file while the judge
    runs (it reads the output head by head, after each head's reference). Read in place, the lost
    pages raised SIGBUS and killed the interpreter (exit 135): a file-backed array is now copied
    when taken, so the judgement finishes on the values it was given (here the exact output
    passes). In a child, so that a regression fails this test instead of killing pytest."""
    import subprocess
    import sys
    script = f"""
import numpy as np, os, subprocess, time, sharpcheck
rng = np.random.default_rng(1)
q, k, v = (rng.standard_normal((1, 8, 512, 64)).astype(np.float32) for _ in range(3))
out = sharpcheck.attention(q, k, v, format="fp32").astype(np.float32)
path = {str(tmp_path / 'out.bin')!r}
out.tofile(path)
mapped = np.memmap(path, dtype=np.float32, mode="r", shape=out.shape)
cutter = subprocess.Popen(["sh", "-c", "sleep 0.2; truncate -s 0 " + path])
start = time.time()
try:
    sharpcheck.assert_attention_close(mapped, q, k, v, tolerance="attention_fp32")
    print("judged in", round(time.time() - start, 2), "s")
except ValueError as error:  # a machine so loaded that the cut came before the copy
    print(error)
cutter.wait()
print("the file now holds", os.path.getsize(path), "bytes")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "the file now holds 0 bytes" in done.stdout, done.stdout
    assert "judged in" in done.stdout or "out: its memory cannot be read" in done.stdout, done.stdout


def test_ctrl_c_stops_a_long_call_promptly_and_python_handles_the_next_one():
    """SIGINT while the backward reference runs without the GIL: the call stops within a row and
    raises KeyboardInterrupt (it used to wait for the whole call); Python's own handler is back
    afterwards, and a later call works. In a child, so that a regression cannot stop pytest."""
    import subprocess
    import sys
    script = """
import numpy as np, os, signal, threading, time, sharpcheck
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((1, 4, 2048, 64)).astype(np.float32) for _ in range(4))
start = time.time()
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    sharpcheck.attention_backward(q, k, v, do, format="bf16")
    print("finished", time.time() - start)
except KeyboardInterrupt:
    print("interrupted after", time.time() - start)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1)
    print("signal lost")
except KeyboardInterrupt:
    print("python handler back")
sharpcheck.attention_backward(q[:, :, :8], k[:, :, :8], v[:, :, :8], do[:, :, :8], format="bf16")
print("later call works")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("interrupted after"), done.stdout
    # The whole call takes several seconds on 2 cores (at [1, 2, 1024, 64] it had grown fast enough,
    # 0.48 s, to finish before the 0.5 s timer on a quiet machine).
    assert float(lines[0].split()[-1]) < 5, done.stdout
    assert lines[1:] == ["python handler back", "later call works"], done.stdout


def test_a_large_softmax_costs_its_result_once():
    """50 M fp32 elements grew the process by about 4x the input (+765 MiB): the result was held as
    doubles, copied into a float64 array, then cast. It is now written once, into a float32 array
    (193 MiB at that size). 10 M elements here (a 38 MiB result), in a child for a clean peak."""
    import subprocess
    import sys
    script = """
import numpy as np, resource, sharpcheck
x = np.random.default_rng(0).standard_normal((10_000, 1000), dtype=np.float32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
y = sharpcheck.softmax(x, threads=2)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, y.dtype)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    growth, dtype = done.stdout.split()
    assert dtype == "float32" and float(growth) < 2 * 38, done.stdout


def test_sparse_tensors_and_big_endian_arrays_are_refused_with_the_fix():
    """A sparse torch tensor raised torch's RuntimeError ("Can't export tensors with layout other
    than torch.strided"); a big-endian array without format= missed the astype hint."""
    sparse = torch.tensor([[1.0, 2.0]]).to_sparse()
    with pytest.raises(TypeError, match=r"logits: a sparse_coo tensor is not read; pass logits.to_dense\(\)"):
        sharpcheck.softmax(sparse)
    with pytest.raises(TypeError, match=r"actual: a sparse_coo tensor"):
        sharpcheck.assert_softmax_close(sparse, sparse.to_dense())
    big = np.array([[1.0, 2.0]], dtype=">f4")
    for call in (lambda: sharpcheck.softmax(big), lambda: sharpcheck.softmax(big, format="fp32")):
        with pytest.raises(TypeError, match=r"big-endian arrays are not read; convert with \.astype\('<f4'\)"):
            call()
    assert np.array_equal(sharpcheck.softmax(big.astype("<f4")), sharpcheck.softmax(np.array([[1.0, 2.0]], "f4")))


def test_ctrl_c_reaches_only_main_thread_calls_under_pythons_default_handler():
    """A call in another thread is never stopped by Ctrl-C (Python raises KeyboardInterrupt in the
    main thread alone), and a program that ignores SIGINT (multiprocessing's workers) keeps its
    call running: both raised KeyboardInterrupt once the work polled one process-wide flag."""
    import subprocess
    import sys
    script = """
import numpy as np, os, signal, threading, time, sharpcheck
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((1, 4, 256, 64)) for _ in range(4))
result = {}
def background():
    try:
        sharpcheck.attention_backward(q, k, v, do, format="fp64", threads=2)
        result["background"] = "completed"
    except BaseException as error:
        result["background"] = type(error).__name__
thread = threading.Thread(target=background)
thread.start()
time.sleep(0.2)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    sharpcheck.attention_backward(q, k, v, do, format="fp64", threads=2)
    print("main completed")
except KeyboardInterrupt:
    print("main interrupted")
thread.join()
print("background", result["background"])
signal.signal(signal.SIGINT, signal.SIG_IGN)
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
sharpcheck.attention_backward(q[:, :2], k[:, :2], v[:, :2], do[:, :2], format="fp64", threads=2)
print("ignored")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["main interrupted", "background completed", "ignored"], done.stdout


def test_counts_given_as_numpy_or_torch_integers_are_read_as_counts():
    """flash-attn takes cu_seqlens as int32 tensors; NumPy integer scalars come out of any index
    arithmetic. Both are counts; a float array is still refused by name."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(8, 2, 16, generator=g).bfloat16() for _ in range(3))
    outs = []
    for lo, hi in ((0, 5), (5, 8)):
        s = (q[lo:hi].float().transpose(0, 1) @ k[lo:hi].float().transpose(0, 1).transpose(-1, -2)) / 4
        outs.append((torch.softmax(s, -1) @ v[lo:hi].float().transpose(0, 1)).transpose(0, 1))
    out = torch.cat(outs).bfloat16()
    for cu in ([0, np.int64(5), 8], np.array([0, 5, 8]), torch.tensor([0, 5, 8], dtype=torch.int32)):
        sharpcheck.judge("attention", q=q, k=k, v=v, out=out, layout="packed", cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match="cu_seqlens_q is an array but not a tensor"):
        sharpcheck.judge("attention", q=q, k=k, v=v, out=out, layout="packed", cu_seqlens_q=np.array([0.0, 5.0, 8.0]),
                         cu_seqlens_k=[0, 5, 8])
