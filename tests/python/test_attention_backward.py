"""The attention backward through Python (issue 17): sharpcheck.attention_backward against mpmath
(correctly rounded, with a soft-cap, a sink and a gradient through the log-sum-exp), and against
torch autograd; assert_attention_backward_close passes torch's fp32 gradients and fails a
FlashAttention-style backward whose D comes from a partial tile, naming the gradient and index;
bad input refused."""

import math

import mpmath
import numpy as np
import pytest
import torch

import sharpcheck
from test_references import rounded


def mp_gradients(q, k, v, dout, scale, softcap=0.0, sink=None, d_lse=None):
    """The definitions of reference/attention_backward.hpp at 120 digits."""
    m, d = q.shape
    n, dv = v.shape
    with mpmath.workdps(120):
        mp = lambda x: mpmath.mpf(float(x))  # noqa: E731
        dq = [[mpmath.mpf(0)] * d for _ in range(m)]
        dk = [[mpmath.mpf(0)] * d for _ in range(n)]
        dvv = [[mpmath.mpf(0)] * dv for _ in range(n)]
        d_sink = mpmath.mpf(0)
        for i in range(m):
            z, slope = [], []
            for j in range(n):
                s = mp(scale) * mpmath.fsum(mp(q[i, t]) * mp(k[j, t]) for t in range(d))
                ds = mp(scale)
                if softcap:
                    t = mpmath.tanh(s / mp(softcap))
                    s, ds = mp(softcap) * t, mp(scale) * (1 - t * t)
                z.append(s)
                slope.append(ds)
            total = mpmath.fsum(mpmath.exp(x) for x in z) + (mpmath.exp(mp(sink)) if sink is not None else 0)
            p = [mpmath.exp(x) / total for x in z]
            dp = [mpmath.fsum(mp(dout[i, c]) * mp(v[j, c]) for c in range(dv)) for j in range(n)]
            big_d = mpmath.fsum(a * b for a, b in zip(p, dp))
            g = mp(d_lse[i]) if d_lse is not None else mpmath.mpf(0)
            for j in range(n):
                dr = p[j] * (dp[j] - big_d + g) * slope[j]
                for t in range(d):
                    dq[i][t] += dr * mp(k[j, t])
                    dk[j][t] += dr * mp(q[i, t])
                for c in range(dv):
                    dvv[j][c] += p[j] * mp(dout[i, c])
            if sink is not None:
                d_sink += mpmath.exp(mp(sink)) / total * (g - big_d)
        return dq, dk, dvv, d_sink


@pytest.mark.parametrize("variant", ["plain", "softcap", "sink_and_lse"])
def test_gradients_are_correctly_rounded_against_mpmath(variant):
    rng = np.random.default_rng(3)
    q, k = rng.normal(0, 1.5, (3, 4)).astype(np.float32), rng.normal(0, 1.5, (6, 4)).astype(np.float32)
    v, dout = rng.normal(0, 1, (6, 3)).astype(np.float32), rng.normal(0, 1, (3, 3)).astype(np.float32)
    d_lse = rng.normal(0, 1, 3).astype(np.float32) if variant == "sink_and_lse" else None
    softcap = 1.5 if variant == "softcap" else 0.0
    sinks = [0.75] if variant == "sink_and_lse" else None
    dq, dk, dv, d_sinks = sharpcheck.attention_backward(q, k, v, dout, d_lse=d_lse, softcap=softcap, sinks=sinks,
                                                        format="fp32")
    exact = mp_gradients(q, k, v, dout, 1 / math.sqrt(4), softcap, sinks[0] if sinks else None, d_lse)
    for got, want in zip((dq, dk, dv), exact[:3]):
        for row_got, row_want in zip(got, want):
            for a, b in zip(row_got, row_want):
                assert float(a) == rounded(b, 24, -126), (variant, float(a), b)
    if sinks:
        assert float(d_sinks[0]) == rounded(exact[3], 24, -126)
    else:
        assert d_sinks is None


def torch_attention(q, k, v, *, causal=False):
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n = scores.shape[-1]
        mask = torch.ones(scores.shape[-2], n, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def torch_grads(q, k, v, dout, causal=False):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    torch_attention(q, k, v, causal=causal).backward(dout)
    return q.grad, k.grad, v.grad


def test_torch_fp32_autograd_passes_and_fp64_agrees():
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(2, 2, 24, 16) for _ in range(4))  # bhsd, batch 2, 2 heads
    grads = torch_grads(q, k, v, dout, causal=True)
    report = sharpcheck.assert_attention_backward_close(*grads, q, k, v, dout, causal=True,
                                                        tolerance="attention_backward_plain")
    assert report.bound_ratio < 1
    exact = sharpcheck.attention_backward(*(x.double() for x in (q, k, v, dout)), causal=True)
    grads64 = torch_grads(*(x.double() for x in (q, k, v, dout)), causal=True)
    for ours, theirs in zip(exact[:3], grads64):
        assert torch.allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_grouped_query_attention_gradients_from_torch_pass():
    """GQA: 4 query heads over 2 KV heads; torch's dK and dV sum over the heads sharing them."""
    torch.manual_seed(2)
    q, dout = torch.randn(1, 4, 20, 16), torch.randn(1, 4, 20, 16)
    k, v = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    expanded = [x.repeat_interleave(2, dim=1) for x in leaves[1:]]
    torch_attention(leaves[0], *expanded, causal=True).backward(dout)
    grads = [x.grad for x in leaves]
    sharpcheck.assert_attention_backward_close(*grads, q, k, v, dout, causal=True, tolerance="attention_backward_plain")
    dq, dk, dv, _ = sharpcheck.attention_backward(q.double(), k.double(), v.double(), dout.double(), causal=True)
    assert torch.allclose(dk, grads[1].double(), rtol=1e-4, atol=1e-5)
    wrong = grads[1].clone()
    wrong[:, 1] = grads[1][:, 0]  # KV head 1 given head 0's gradient
    with pytest.raises(AssertionError, match="dk"):
        sharpcheck.assert_attention_backward_close(grads[0], wrong, grads[2], q, k, v, dout, causal=True)


def alibi_bias(slopes, queries, keys):
    """-slope_h |i + keys - queries - j| (bottom-right aligned), [heads, queries, keys]."""
    i = torch.arange(queries, dtype=torch.float64)[:, None] + (keys - queries)
    j = torch.arange(keys, dtype=torch.float64)[None, :]
    return -torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (i - j).abs()


def test_alibi_bias_padding_and_gqa_gradients_from_torch_pass():
    """Torch autograd of scores + ALiBi + an additive bias (with -inf), keys padded per batch
    element and queries padded (dO zero there: a padded query contributes nothing), 4 heads over
    2 KV heads: torch's fp32 gradients pass, its fp64 ones agree with the fp64 reference, and a
    kernel that forgets the bias fails."""
    torch.manual_seed(5)
    b, h, kvh, m, n, d = 2, 4, 2, 9, 11, 16
    q, dout = torch.randn(b, h, m, d), torch.randn(b, h, m, d)
    k, v = torch.randn(b, kvh, n, d), torch.randn(b, kvh, n, d)
    slopes = [0.5, 0.25, 0.125, 0.0625]
    bias = torch.randn(1, h, m, n).double()
    bias[0, 1, 2, 3] = float("-inf")
    query_lengths, key_lengths = [9, 6], [11, 8]
    for batch, (ql, kl) in enumerate(zip(query_lengths, key_lengths)):
        dout[batch, :, ql:] = 0

    def torch_grads(dtype, with_bias=True):
        leaves = [x.to(dtype).clone().requires_grad_(True) for x in (q, k, v)]
        kk, vv = (x.repeat_interleave(h // kvh, dim=1) for x in leaves[1:])
        scores = leaves[0] @ kk.transpose(-1, -2) / math.sqrt(d) + alibi_bias(slopes, m, n).to(dtype)
        if with_bias:
            scores = scores + bias.to(dtype)
        for batch, kl in enumerate(key_lengths):
            scores[batch, :, :, kl:] = float("-inf")
        (torch.softmax(scores, -1) @ vv).backward(dout.to(dtype))
        return [x.grad for x in leaves]

    options = dict(alibi_slopes=slopes, attn_mask=bias, query_lengths=query_lengths, key_lengths=key_lengths,
                   align="bottom-right")
    grads = torch_grads(torch.float32)
    report = sharpcheck.assert_attention_backward_close(*grads, q, k, v, dout, tolerance="attention_backward_plain",
                                                        **options)
    assert report.bound_ratio < 1
    exact = sharpcheck.attention_backward(*(x.double() for x in (q, k, v, dout)), **options)
    grads64 = torch_grads(torch.float64)
    for batch, (ql, kl) in enumerate(zip(query_lengths, key_lengths)):
        assert torch.allclose(exact[0][batch, :, :ql], grads64[0][batch, :, :ql], rtol=1e-9, atol=1e-11)
        assert torch.all(exact[0][batch, :, ql:] == 0) and torch.all(exact[1][batch, :, kl:] == 0)
        for ours, theirs in zip(exact[1:3], grads64[1:3]):
            assert torch.allclose(ours[batch, :, :kl], theirs[batch, :, :kl], rtol=1e-9, atol=1e-11)
    with pytest.raises(AssertionError, match="Attention gradients"):
        sharpcheck.assert_attention_backward_close(*torch_grads(torch.float32, with_bias=False), q, k, v, dout,
                                                   tolerance="attention_backward_plain", **options)


def test_packed_variable_length_gradients_from_torch_pass():
    """flash_attn_varlen's layout: two sequences of 5 and 9 queries (7 and 9 keys) packed into
    [total, heads, dim], causal bottom-right; torch computes each sequence alone."""
    torch.manual_seed(6)
    heads, d, lengths_q, lengths_k = 2, 8, [5, 9], [7, 9]
    q, dout = torch.randn(sum(lengths_q), heads, d), torch.randn(sum(lengths_q), heads, d)
    k, v = torch.randn(sum(lengths_k), heads, d), torch.randn(sum(lengths_k), heads, d)
    cu_q, cu_k = [0, 5, 14], [0, 7, 16]
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    for s in range(2):
        part = lambda x, cu: x[cu[s]:cu[s + 1]].transpose(0, 1)  # noqa: E731
        qs, ks, vs = part(leaves[0], cu_q), part(leaves[1], cu_k), part(leaves[2], cu_k)
        scores = qs @ ks.transpose(-1, -2) / math.sqrt(d)
        keep = torch.ones(lengths_q[s], lengths_k[s], dtype=torch.bool).tril(lengths_k[s] - lengths_q[s])
        out = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ vs
        out.backward(part(dout, cu_q))
    grads = [x.grad for x in leaves]
    options = dict(layout="packed", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, align="bottom-right")
    sharpcheck.assert_attention_backward_close(*grads, q, k, v, dout, tolerance="attention_backward_plain",
                                               **options)
    wrong = grads[1].clone()
    wrong[7:] = grads[1][7:].roll(1, dims=0)  # the second sequence's dK shifted by one key
    with pytest.raises(AssertionError, match="dk"):
        sharpcheck.assert_attention_backward_close(grads[0], wrong, grads[2], q, k, v, dout, **options)


def test_a_partial_tile_d_fails_naming_the_gradient():
    torch.manual_seed(1)
    q, k, v, dout = (torch.randn(32, 16) for _ in range(4))
    scale = 1 / math.sqrt(16)
    p = torch.softmax((q @ k.T) * scale, dim=-1)
    out = p @ v
    dp = dout @ v.T
    for columns, passes in ((16, True), (8, False)):  # D = rowsum(dO * O) over all or half the columns
        d = (dout[:, :columns] * out[:, :columns]).sum(-1, keepdim=True)
        ds = p * (dp - d) * scale
        dq, dk, dv = ds @ k, ds.T @ q, p.T @ dout
        if passes:
            sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout, d=d[:, 0])
            # The same gradients with the partial-tile D exposed: D itself fails.
            half = (dout[:, :8] * out[:, :8]).sum(-1)
            with pytest.raises(AssertionError, match="D row"):
                sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout, d=half)
        else:
            with pytest.raises(AssertionError) as failure:
                sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout)
            text = str(failure.value)
            assert "Attention gradients" in text and "attention_backward_flash" in text, text
            assert "dQ" in text or "dK" in text, text


def test_bad_input_is_refused():
    q, k, v, dout = (np.zeros((4, 8), np.float32) for _ in range(4))
    with pytest.raises(ValueError):
        sharpcheck.attention_backward(np.zeros((1, 3, 3, 8), np.float32), np.zeros((1, 2, 3, 8), np.float32),
                                      np.zeros((1, 2, 3, 8), np.float32), np.zeros((1, 3, 3, 8), np.float32))
    with pytest.raises(ValueError, match="dout"):
        sharpcheck.attention_backward(q, k, v, np.zeros((5, 8), np.float32))
    with pytest.raises(ValueError, match="tolerance entry"):
        sharpcheck.assert_attention_backward_close(q, k, v, q, k, v, dout, tolerance="attention_flash")


def test_a_wrong_sink_gradient_is_named_as_such():
    """The worst element of a wrong d_sinks is d_sinks[head], not dq at (0, 0, 0, 0)."""
    g = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(4))
    sinks = torch.tensor([0.5, -0.25], dtype=torch.float64)
    dq, dk, dv, d_sinks = sharpcheck.attention_backward(q, k, v, dout, sinks=sinks, format="fp64")
    wrong = torch.as_tensor(d_sinks).clone()
    wrong[1] = wrong[1] * 1.5 + 1e-3
    with pytest.raises(AssertionError, match=r"d_sinks at index \(1,\)"):
        sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout, sinks=sinks, d_sinks=wrong,
                                                   format="fp64")


def test_an_fp64_d_is_read_in_fp64_as_the_reference_rounds_it():
    # D was read as fp32 whatever the format: a correctly rounded fp64 D was refused as "not a fp32
    # value" (reference/attention_backward.hpp: D is rounded to the target when it is fp32 or wider).
    rng = np.random.default_rng(1)
    q, k, v, dout = rng.normal(size=(3, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), rng.normal(size=(3, 2))
    dq, dk, dv = sharpcheck.attention_backward(q, k, v, dout, format="fp64")[:3]
    out = sharpcheck.attention(q, k, v, format="fp64")
    d = np.sum(dout * out, axis=-1)  # within a few fp64 ulps of the exact D
    report = sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout, format="fp64", d=d)
    assert report.status == "pass"
    with pytest.raises(AssertionError):
        sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout, format="fp64", d=d * 1.5)


def test_the_judgement_returns_the_reference_it_used():
    """return_reference=True keeps the correctly rounded gradients the verdict used on the report (and
    on a failure's AssertionError): the same values sharpcheck.attention_backward returns, so a caller
    that wants both computes the reference once."""
    torch.manual_seed(5)
    q, dout = torch.randn(1, 4, 12, 8), torch.randn(1, 4, 12, 8)
    k, v = torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)  # GQA: 2 query heads per KV head
    sinks = torch.tensor([0.5, -0.25, 0.0, 1.0])
    exact = sharpcheck.attention_backward(q, k, v, dout, causal=True, sinks=sinks, format="fp32")
    report = sharpcheck.assert_attention_backward_close(*exact[:3], q, k, v, dout, causal=True, sinks=sinks,
                                                        d_sinks=exact[3], return_reference=True)
    assert report.reference is not None
    for ours, theirs in zip(report.reference, exact):
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))
    assert sharpcheck.assert_attention_backward_close(*exact[:3], q, k, v, dout, causal=True,
                                                      sinks=sinks).reference is None
    wrong = torch.as_tensor(exact[0]).clone() * 1.25
    with pytest.raises(AssertionError) as failure:
        sharpcheck.assert_attention_backward_close(wrong, *exact[1:3], q, k, v, dout, causal=True, sinks=sinks,
                                                   return_reference=True)
    assert failure.value.report.status == "fail"
    assert np.array_equal(np.asarray(failure.value.report.reference[0]), np.asarray(exact[0]))


def test_a_first_block_that_sees_no_key_under_a_math_recipe():
    """From an audit: the geometry's blocks of query rows once read an empty buffer when the first
    block saw no key and the recipe rounds the scores (a segfault); now judged as before: fully masked
    rows are inconclusive, and 600 queries over 37 keys bottom-right, whose first rows see no key, pass."""
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 1, 8, 16).bfloat16() for _ in range(4))
    hidden = torch.zeros(8, 8, dtype=torch.bool)
    dq, dk, dv, _ = sharpcheck.attention_backward(q, k, v, do, attn_mask=hidden)
    with pytest.warns(UserWarning, match="inconclusive"):
        report = sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, do, attn_mask=hidden,
                                                            tolerance="backward_math_bf16")
    assert report.status == "inconclusive"
    q, do = torch.randn(1, 1, 600, 8).bfloat16(), torch.randn(1, 1, 600, 8).bfloat16()
    k, v = torch.randn(1, 1, 37, 8).bfloat16(), torch.randn(1, 1, 37, 8).bfloat16()
    dq, dk, dv, _ = sharpcheck.attention_backward(q, k, v, do, causal=True, align="bottom-right")
    report = sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, do, causal=True, align="bottom-right",
                                                        tolerance="backward_math_bf16")
    assert report.passed


@pytest.mark.parametrize("scales", [(1.0, 1.0, 1e200, 1e150), (1.0, 1e-300, 1.0, 1e300)])
def test_the_reference_fits_itself_where_the_statistical_sums_overflow(scales):
    """Products of values near 1e300 overflow the statistical tests' sums (0 x inf gave a NaN
    allowance, and the reference itself failed "row scale nan"): those tests then stand aside and the
    elements' own verdicts stand."""
    rng = np.random.default_rng(5)
    q, k, v, do = (rng.standard_normal((1, 1, 16, 8)) * s for s in scales)
    dq, dk, dv, _ = sharpcheck.attention_backward(q, k, v, do, format="fp64")
    assert sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, do, format="fp64").passed


def test_a_head_of_equal_keys_is_exact_against_fractions():
    """Every key equal: each row's probabilities are exactly 1/n, dQ is exactly 0 (a tie of every
    element, which no precision decides) and dK and dV are rational: the exact stage computes them
    (BackwardExactCases::d_products, each row's dS formed once). Checked against Python's Fractions,
    every element within half a bf16 ulp of the exact value (the result's format is the inputs')."""
    from fractions import Fraction
    n, d = 24, 16
    g = torch.Generator().manual_seed(3)
    q, v, dout = (torch.randn(1, 1, n, d, generator=g).bfloat16() for _ in range(3))
    k = torch.randn(1, 1, 1, d, generator=g).bfloat16().expand(1, 1, n, d).contiguous()
    dq, dk, dv = sharpcheck.attention_backward(q, k, v, dout, scale=0.25)[:3]
    Q, K, V, DO = ([[Fraction(x) for x in row] for row in t[0, 0].double().tolist()] for t in (q, k, v, dout))
    exact_dq = [[Fraction(0)] * d for _ in range(n)]
    exact_dk = [[Fraction(0)] * d for _ in range(n)]
    for i in range(n):
        dp = [sum(DO[i][c] * V[j][c] for c in range(d)) for j in range(n)]
        big_d = sum(dp) / n
        for j in range(n):
            ds = (dp[j] - big_d) / n / 4
            for c in range(d):
                exact_dq[i][c] += ds * K[j][c]
                exact_dk[j][c] += ds * Q[i][c]
    for ours, exact in ((dq, exact_dq), (dk, exact_dk)):
        ours = ours[0, 0].double().tolist()
        for i in range(n):
            for c in range(d):
                e = exact[i][c]
                half_ulp = Fraction(2.0 ** (math.floor(math.log2(abs(e))) - 8)) if e != 0 else Fraction(0)
                assert abs(Fraction(ours[i][c]) - e) <= half_ulp, (i, c, ours[i][c], float(e))
