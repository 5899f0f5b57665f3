"""The Python references: bit for bit the C++ reference (through the `sharpcheck softmax` program,
a separate path), and correctly rounded against mpmath, an independent computation."""

import math
import os
import subprocess

import mpmath
import numpy as np
import pytest
import torch

import sharpcheck

PROGRAM = os.environ.get("SHARPCHECK_PROGRAM", "build/sharpcheck")
FORMATS = ["fp64", "fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]


def program_table(logits, theta):
    """{format: (logsumexp text, softmax hex values)} as `sharpcheck softmax` prints them."""
    text = subprocess.run([PROGRAM, "softmax", "--logits", ",".join(float(x).hex() for x in logits),
                           "--theta", float(theta).hex()], check=True, capture_output=True, text=True).stdout
    table = {}
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in FORMATS:
            table[fields[0]] = [float.fromhex(h) for h in fields[3:]]
    return table


@pytest.mark.parametrize("seed", range(6))
def test_softmax_equals_the_programs_reference_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=int(rng.integers(1, 40)))
    theta = [1.0, 0.7, -2.5, 1e-3, 40.0, 0.3][seed]
    table = program_table(logits, theta)
    for fmt in FORMATS:
        ours = np.asarray(sharpcheck.softmax(logits, theta=theta, format=fmt), dtype=np.float64)
        assert ours.tolist() == table[fmt], fmt


def rounded(value, precision, min_exponent):
    """mpmath value rounded to nearest-even with `precision` bits (subnormals below 2^min_exponent)."""
    with mpmath.workprec(precision):
        if value != 0 and mpmath.floor(mpmath.log(abs(value), 2)) < min_exponent:
            quantum = mpmath.mpf(2) ** (min_exponent - precision + 1)
            with mpmath.workprec(400):
                return float(mpmath.nint(value / quantum) * quantum)
        return float(+value)


def mp_softmax(logits, theta):
    with mpmath.workdps(120):
        z = [mpmath.mpf(float(x)) / mpmath.mpf(float(theta)) for x in logits]
        top = max(z)
        e = [mpmath.exp(x - top) for x in z]
        total = mpmath.fsum(e)
        return [x / total for x in e], top + mpmath.log(total)


@pytest.mark.parametrize("fmt,precision,min_exponent", [("fp32", 24, -126), ("bf16", 8, -126), ("fp16", 11, -14)])
def test_softmax_and_log_softmax_are_correctly_rounded_against_mpmath(fmt, precision, min_exponent):
    rng = np.random.default_rng(7)
    logits = np.concatenate([rng.normal(0, 4, 200), [-30.0, 25.0, 25.0]]).astype(np.float32)
    probabilities, log_total = mp_softmax(logits, 1.0)
    ours = np.asarray(sharpcheck.softmax(logits, format=fmt), dtype=np.float64)
    assert ours.tolist() == [rounded(p, precision, min_exponent) for p in probabilities]
    with mpmath.workdps(120):
        expected_log = [rounded(mpmath.mpf(float(x)) - log_total, precision, min_exponent) for x in logits]
    ours_log = np.asarray(sharpcheck.log_softmax(logits, format=fmt), dtype=np.float64)
    assert ours_log.tolist() == expected_log


@pytest.mark.parametrize("fmt,precision,min_exponent", [("fp64", 53, -1022), ("fp32", 24, -126), ("bf16", 8, -126)])
def test_a_log_softmax_that_underflows_is_a_negative_zero(fmt, precision, min_exponent):
    """From issue 32's audit: log-softmax of a dominant logit is -log(1 + t) < 0 with t tiny, so it
    rounds to -0; the sum's enclosure lost t and the zero came out +0. Compared by sign and bits
    against mpmath (whose zeros carry no sign: the sign is the exact value's)."""
    rows = [[0.0, -200.0, -300.0], [0.0, -1e6], [3.0, -1e30, -5e3], [0.5, -900.0, 0.5 - 2e3]]
    for row in rows:
        ours = np.asarray(sharpcheck.log_softmax(np.array(row), format=fmt), dtype=np.float64)
        _, log_total = mp_softmax(row, 1.0)
        with mpmath.workdps(120):
            exact = [mpmath.mpf(x) - log_total for x in row]
        # Every value is below 0 (two or more logits: S > exp(z_j)), also where 120 digits
        # cannot see it (1 + e^-1e6), so each zero is -0.
        expected = [math.copysign(rounded(x, precision, min_exponent), -1.0) for x in exact]
        assert [float(x).hex() for x in ours] == [x.hex() for x in expected], (fmt, row)


def test_logsumexp_reduces_the_axis_and_matches_mpmath():
    logits = np.random.default_rng(3).normal(0, 2, (3, 5, 7))
    ours = sharpcheck.logsumexp(logits, dim=1, format="fp64")
    assert ours.shape == (3, 7)
    for i in range(3):
        for j in range(7):
            _, total = mp_softmax(logits[i, :, j], 1.0)
            assert ours[i, j] == rounded(total, 53, -1022)


def test_softmax_along_any_dim_equals_the_last_dim_of_the_transposed_array():
    x = torch.randn(4, 6, 5, dtype=torch.float64)
    along_1 = sharpcheck.softmax(x, dim=1, format="fp32")
    along_last = sharpcheck.softmax(x.transpose(1, 2).contiguous(), dim=-1, format="fp32")
    assert torch.equal(along_1, along_last.transpose(1, 2))


def test_results_come_back_in_the_callers_kind_and_format():
    x = torch.randn(2, 9)
    assert sharpcheck.softmax(x.bfloat16()).dtype == torch.bfloat16
    assert sharpcheck.softmax(x, format="fp16").dtype == torch.float16
    assert sharpcheck.softmax(x.numpy(), format="fp16").dtype == np.float16
    assert isinstance(sharpcheck.softmax(x.numpy()), np.ndarray)


def test_attention_reference_equals_mpmath_on_one_head():
    rng = np.random.default_rng(11)
    q, k, v = (rng.normal(0, 1, shape).astype(np.float32) for shape in [(5, 8), (7, 8), (7, 3)])
    ours = sharpcheck.attention(q, k, v, causal=True, format="fp32")
    with mpmath.workdps(120):
        scale = 1 / mpmath.sqrt(8)
        for i in range(5):
            logits = [mpmath.fsum(mpmath.mpf(float(q[i, t])) * mpmath.mpf(float(k[j, t])) for t in range(8)) * scale
                      for j in range(i + 1)]
            top = max(logits)
            weights = [mpmath.exp(x - top) for x in logits]
            total = mpmath.fsum(weights)
            for c in range(3):
                value = mpmath.fsum(w * mpmath.mpf(float(v[j, c])) for j, w in enumerate(weights)) / total
                assert float(ours[i, c]) == rounded(value, 24, -126), (i, c)


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("size", [1e14, 1e15])
def test_one_visible_key_of_a_huge_score_gives_its_value_exactly(fmt, size):
    """One key: P = 1, so the output is v exactly, whatever the score (here 1e28 to 1e30). The Ziv
    loop's first precision spans more than MPFR's exponent range there; its NaN ends must not be
    taken for an answer (the output came back NaN before)."""
    q, k = np.array([[size]]), np.array([[size]])
    v = np.array([[-2.0, 0.75]])
    out, lse = sharpcheck.attention(q, k, v, format=fmt, return_lse=True)
    assert out.ravel().tolist() == [-2.0, 0.75]
    assert np.isfinite(lse).all()


def test_a_caller_that_flushes_subnormals_gets_the_same_references_and_keeps_its_setting():
    # torch.set_flush_denormal(True) sets FTZ/DAZ for the thread: read under it, q = 1e-310 was 0
    # and every weight 1/2 (output 0.5 -> 1.0 once the keys' +-1e308 overflowed against it).
    q = np.array([1e-310]).reshape(1, 1, 1, 1)
    k = np.array([1e308, -1e308]).reshape(1, 1, 2, 1)
    v = np.array([1.0, 0.0]).reshape(1, 1, 2, 1)
    with mpmath.workprec(400):
        z = [mpmath.mpf(1e-310) * mpmath.mpf(x) * 100 for x in (1e308, -1e308)]
        expected = float(np.float32(float(mpmath.exp(z[0]) / (mpmath.exp(z[0]) + mpmath.exp(z[1])))))
    plain = sharpcheck.attention(q, k, v, scale=100.0, format="fp32")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    try:
        flushed = sharpcheck.attention(q, k, v, scale=100.0, format="fp32")
        logits = np.array([1e-310, 0.0, -1e-310]).reshape(1, 3)
        row_flushed = sharpcheck.softmax(logits, format="fp64")
        still_flushing = (torch.tensor([1e-310], dtype=torch.float64) * 1.0).item()
    finally:
        torch.set_flush_denormal(False)
    assert float(plain.ravel()[0]) == expected == float(flushed.ravel()[0])
    assert np.array_equal(row_flushed, sharpcheck.softmax(logits, format="fp64"))
    assert still_flushing == 0.0  # the caller's setting is its own again after the call


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_a_subnormal_reference_reaches_a_caller_that_flushes_subnormals(fmt):
    # The conversion to the result's dtype ran in Python, under the caller's FTZ: 1e-39 came back 0.
    q, k = torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 2, 4)
    v = torch.full((1, 1, 2, 4), 1e-39, dtype=torch.float64)
    row = torch.tensor([[0.0, -100.0]])
    expected = sharpcheck.attention(q, k, v, format=fmt), sharpcheck.softmax(row, format="fp32")
    assert float(expected[0].float().ravel()[0]) != 0.0 and float(expected[1][0, 1]) != 0.0
    torch.set_flush_denormal(True)
    try:
        flushed = sharpcheck.attention(q, k, v, format=fmt), sharpcheck.softmax(row, format="fp32")
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(flushed[0], expected[0]) and torch.equal(flushed[1], expected[1])


def test_attention_weights_are_returned_correctly_rounded_against_mpmath():
    """P, for an outside audit: GQA (2 query heads per KV head), causal bottom-right, a sink and a
    padded key length; unseen keys and padding are 0, and each seen weight is exp(z - L) rounded once."""
    rng = np.random.default_rng(12)
    q = rng.normal(0, 1, (1, 4, 3, 4)).astype(np.float32)
    k, v = (rng.normal(0, 1, (1, 2, 5, 4)).astype(np.float32) for _ in range(2))
    sinks = [0.5, -1.0, 0.25, 2.0]
    out, lse, p = sharpcheck.attention(q, k, v, causal=True, align="bottom-right", sinks=sinks, key_lengths=[4],
                                       return_lse=True, return_weights=True, format="fp32")
    assert p.shape == (1, 4, 3, 5) and out.shape == (1, 4, 3, 4) and lse.shape == (1, 4, 3)
    assert np.array_equal(out, sharpcheck.attention(q, k, v, causal=True, align="bottom-right", sinks=sinks,
                                                    key_lengths=[4], format="fp32"))
    with mpmath.workdps(120):
        for h in range(4):
            for i in range(3):
                seen = range(0, i + 2)  # 4 keys, 3 queries, bottom-right: query i sees keys 0..i+1
                z = [mpmath.fsum(mpmath.mpf(float(q[0, h, i, t])) * mpmath.mpf(float(k[0, h // 2, j, t]))
                                 for t in range(4)) / 2 for j in seen]
                total = mpmath.fsum(mpmath.exp(x) for x in z) + mpmath.exp(sinks[h])
                for j in range(5):
                    expected = rounded(mpmath.exp(z[j]) / total, 24, -126) if j in seen else 0.0
                    assert float(p[0, h, i, j]) == expected, (h, i, j)
    one_head, weights = sharpcheck.attention(q[0, 0], k[0, 0], v[0, 0], return_weights=True, format="fp32")
    assert weights.shape == (3, 5) and np.allclose(weights.sum(axis=1), 1, atol=1e-6)


BIG = float.fromhex("0x1.e42d130773b76p+1023")
EXTREME_ROWS = [
    ([BIG, -BIG], float.fromhex("0x1.1ccf385ebc8a0p+1023")),  # the differences overflow double
    ([1.7976931348623157e308, -1.7976931348623157e308, 1.0], 1e300),
    ([5e-324, -5e-324, 0.0], 1e-320),  # subnormal logits and theta
    ([1.0, 2.0, 3.0], -1e300),  # every probability near 1/3, theta negative
    ([1e-300, 2e-300, -3e-300], 1e-300),
    ([0.0, -1.0, -2.0], 1e-3),  # one-hot to within underflow
]


@pytest.mark.parametrize("row,theta", EXTREME_ROWS)
@pytest.mark.parametrize("fmt,precision,min_exponent", [("fp64", 53, -1022), ("fp32", 24, -126), ("bf16", 8, -126)])
def test_extreme_rows_are_correctly_rounded_against_mpmath(row, theta, fmt, precision, min_exponent):
    probabilities, _ = mp_softmax(row, theta)
    ours = np.asarray(sharpcheck.softmax(np.array(row), theta=theta, format=fmt), dtype=np.float64)
    assert ours.tolist() == [rounded(p, precision, min_exponent) for p in probabilities]


def test_e4m3_decides_finite_values_not_the_shared_nan_of_overflow():
    # The first enclosure reaches past -464 and +464; in e4m3 both ends round to NaN, which must not
    # count as a decision: the exact value is -0.99999999999999994515, which rounds to -1.
    out = sharpcheck.attention(np.array([[1.0]]), np.array([[0.0], [2e-20]]), np.array([[1e20], [-1e20]]),
                               scale=1.0, format="fp8_e4m3")
    assert float(out[0, 0]) == -1.0


def test_fp8_and_int8_inputs_reach_every_reference_through_input_format():
    """Bit patterns read as their format (fp8 e4m3 codes as uint8) and taken to an fp32 result: the
    same values as the decoded float inputs; int8 codes read on their grid."""
    codes = np.array([[0x38, 0x40, 0x30, 0xB8]], dtype=np.uint8)  # 1, 2, 0.5, -1 in e4m3
    values = np.array([[1.0, 2.0, 0.5, -1.0]])
    for function in (sharpcheck.softmax, sharpcheck.log_softmax, sharpcheck.logsumexp, sharpcheck.entropy):
        assert np.array_equal(function(codes, input_format="fp8_e4m3", format="fp32"),
                              function(values, format="fp32")), function.__name__
    dy = np.array([[0x38, 0x30, 0x38, 0x40]], dtype=np.uint8)
    dy_values = np.array([[1.0, 0.5, 1.0, 2.0]])
    for function in (sharpcheck.softmax_backward, sharpcheck.log_softmax_backward):
        assert np.array_equal(function(dy, codes, input_format="fp8_e4m3", format="fp32"),
                              function(dy_values, values, format="fp32")), function.__name__
    q = codes.reshape(2, 2)
    assert np.array_equal(sharpcheck.attention(q, q, q, input_format="fp8_e4m3", format="fp32"),
                          sharpcheck.attention(values.reshape(2, 2), values.reshape(2, 2), values.reshape(2, 2),
                                               format="fp32"))
    grads = sharpcheck.attention_backward(q, q, q, q, input_format="fp8_e4m3", format="fp32")
    expected = sharpcheck.attention_backward(*(values.reshape(2, 2),) * 4, format="fp32")
    for got, want in zip(grads[:3], expected[:3]):
        assert np.array_equal(got, want)
    integers = np.array([[1, -2, 3]], dtype=np.int8)  # TFLite's int8 grid: (code + 128) / 256
    assert np.array_equal(sharpcheck.softmax(integers, input_format="int8", format="fp32"),
                          sharpcheck.softmax(np.array([[129.0, 126.0, 131.0]]) / 256, format="fp32"))
    with pytest.raises(ValueError):
        sharpcheck.softmax(codes, input_format="fp9", format="fp32")


# ---- Refusals: a sweep that counts UndecidedRounding over random and extreme inputs ----
# Every reference on rows and heads of six families (normal; logits 1e30 apart; theta of 1e-17,
# -1e-17 and 2^-60; ties; a top group far above the rest with dy, values and logits on coarse grids,
# so that rational parts land on rounding boundaries; all zeros), in every format. The exact answer
# is decidable for all of them, so none may be refused. docs/reference.md lists the counts and the
# classes the sweep found before their rules (log-softmax of logits 1e30 apart in fp64: 6 of 432).
SWEEP_FORMATS = [None, "fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]
GRID = np.array([0.0, 0.5, 0.625, 0.75, 1.0, 1.125, 1.5, -0.75, -1.0, 1 + 2**-8, 1 + 2**-24, 0.1875])
ROW_FAMILIES = ["normal", "spread 1e30", "tiny theta", "ties", "far top, grid dy", "zeros"]
HEAD_FAMILIES = ["normal", "scores 1e6 apart", "ties", "far top, grid values", "zeros"]


def sweep_row(rng, family, n):
    """(logits, dy, theta) of one row of the family."""
    if family == "normal":
        return rng.normal(0, 3, n), rng.uniform(-1, 1, n), 1.0
    if family == "spread 1e30":
        return rng.normal(0, 1, n) * 1e30, rng.uniform(-1, 1, n), 1.0
    if family == "tiny theta":
        return rng.normal(0, 1, n), rng.uniform(-1, 1, n), float(rng.choice([1e-17, -1e-17, 2**-60]))
    if family == "ties":
        return rng.choice([0.0, 1.0, -2.0], n), rng.choice(GRID, n), float(rng.choice([1.0, 0.5, -1.0]))
    if family == "far top, grid dy":
        logits = -rng.choice([1e3, 1e6, 1e30, 1e300], n)
        logits[: rng.integers(1, n + 1)] = rng.choice(GRID)
        return logits, rng.choice(GRID, n), float(rng.choice([1.0, -1.0, 2.0]))
    return np.zeros(n), np.zeros(n), 1.0


def sweep_head(rng, family, m, n, d):
    """(q, k, v, dO, scale) of one head of the family."""
    if family in ("normal", "scores 1e6 apart"):
        q, k, v, d_out = (rng.normal(0, 1, (m if i in (0, 3) else n, d)) for i in range(4))
        return (q, k, v, d_out, None) if family == "normal" else (q * 1e3, k * 1e3, v, d_out, 1.0)
    if family == "ties":
        q = np.zeros((m, d)) if rng.random() < 0.5 else rng.choice([0.0, 1.0], (m, d))
        return q, rng.choice([0.0, 1.0], (n, d)), rng.choice(GRID, (n, d)), rng.choice(GRID, (m, d)), 1.0
    if family == "far top, grid values":
        k = np.zeros((n, d))
        k[1:] = -rng.choice([1e3, 1e6, 1e30], (n - 1, 1))
        return np.ones((m, d)), k, rng.choice(GRID, (n, d)), rng.choice(GRID, (m, d)), 1.0
    return np.zeros((m, d)), np.zeros((n, d)), np.zeros((n, d)), np.zeros((m, d)), 1.0


def refusal_sweep(seed=0, row_trials=12, head_trials=6):
    """{(reference, family): [calls, refusals, first message]}."""
    rng = np.random.default_rng(seed)
    counts = {}

    def run(name, family, call):
        entry = counts.setdefault((name, family), [0, 0, ""])
        entry[0] += 1
        try:
            call()
        except sharpcheck.UndecidedRounding as refused:
            entry[1] += 1
            entry[2] = entry[2] or str(refused)

    for family in ROW_FAMILIES:
        for _ in range(row_trials):
            x, dy, theta = sweep_row(rng, family, int(rng.integers(1, 9)))
            for fmt in SWEEP_FORMATS:
                kw = {"theta": theta, "format": fmt}
                for name, fn, args in (("softmax", sharpcheck.softmax, (x,)),
                                       ("log_softmax", sharpcheck.log_softmax, (x,)),
                                       ("logsumexp", sharpcheck.logsumexp, (x,)),
                                       ("entropy", sharpcheck.entropy, (x,)),
                                       ("softmax_backward", sharpcheck.softmax_backward, (dy, x)),
                                       ("log_softmax_backward", sharpcheck.log_softmax_backward, (dy, x))):
                    run(name, family, lambda: fn(*args, **kw))
    for family in HEAD_FAMILIES:
        for _ in range(head_trials):
            q, k, v, d_out, scale = sweep_head(rng, family, int(rng.integers(1, 4)), int(rng.integers(1, 6)),
                                               int(rng.integers(1, 4)))
            for fmt in SWEEP_FORMATS:
                run("attention", family, lambda: sharpcheck.attention(q, k, v, scale=scale, format=fmt))
                run("attention_backward", family,
                    lambda: sharpcheck.attention_backward(q, k, v, d_out, scale=scale, format=fmt))
    return counts


def test_no_reference_refuses_on_the_sweep_of_random_and_extreme_inputs():
    counts = refusal_sweep()
    refused = {key: entry for key, entry in counts.items() if entry[1]}
    assert sum(entry[0] for entry in counts.values()) == 2952
    assert not refused, refused
