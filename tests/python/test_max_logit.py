"""attention's max_logit output (QK-Clip's input): each head's largest scaled score scale q.k over
the pairs it sees, judged against the correctly rounded maximum. The expected value is checked
against an independent oracle (exact rationals and mpmath's square root, rounded by mpmath to 24
bits); an honest fp32 max passes, and the wrong maxima kernels have returned fail by head."""

import math
import re
from fractions import Fraction

import mpmath
import pytest
import torch

import sharpcheck

B, H, S, D = 2, 4, 48, 96  # d = 96: the scale 1/sqrt(96) is irrational


def problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, generator=g).bfloat16() for _ in range(3))
    scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(D)
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    masked = scores.masked_fill(~causal, -float("inf"))
    out = (torch.softmax(masked, -1) @ v.float()).bfloat16()
    return q, k, v, out, scores, masked


def oracle(q, k, head):
    """The exact max over batch and causal pairs, rounded to fp32 by mpmath (round half even)."""
    best = None
    for b in range(B):
        qs = q[b, head].double().tolist()
        ks = k[b, head].double().tolist()
        for i in range(S):
            for j in range(i + 1):
                dot = sum(Fraction(x) * Fraction(y) for x, y in zip(qs[i], ks[j]))
                if best is None or dot > best:
                    best = dot
    with mpmath.workprec(400):
        exact = mpmath.mpf(best.numerator) / best.denominator / mpmath.sqrt(D)
    with mpmath.workprec(24):
        return float(+exact)


def judge(max_logit, **kwargs):
    q, k, v, out, _, _ = problem()
    return sharpcheck.judge("attention", q=q, k=k, v=v, out=out, causal=True, max_logit=max_logit, **kwargs)


def test_an_honest_fp32_max_passes_per_head_and_per_batch():
    _, _, _, _, _, masked = problem()
    report = judge(masked.amax(dim=(0, 2, 3)))
    (verdict,) = [t for t in report.record["tensors"] if t["name"] == "max_logit"]
    assert verdict["proven_ratio"] < 0.05 and verdict["violations"] == 0
    judge(masked.amax(dim=(2, 3)))  # [B, H]


def test_the_expected_value_is_the_correctly_rounded_maximum():
    q, k, _, _, _, masked = problem()
    wrong = masked.amax(dim=(0, 2, 3)) * 2  # every head fails, naming its expected value
    with pytest.raises(AssertionError) as failure:
        judge(wrong)
    found = re.search(r"max_logit of head (\d+): expected (\S+) got", str(failure.value))
    head, expected = int(found.group(1)), float.fromhex(found.group(2))
    assert expected == oracle(q, k, head)


@pytest.mark.parametrize("name", ["over masked keys", "before the scale", "rounded to bf16", "first batch only",
                                  "in log2 units"])
def test_wrong_maxima_fail(name):
    _, _, _, _, scores, masked = problem()
    wrong = {"over masked keys": scores.amax(dim=(0, 2, 3)),
             "before the scale": (masked * math.sqrt(D)).amax(dim=(0, 2, 3)),
             "rounded to bf16": masked.amax(dim=(0, 2, 3)).bfloat16().float(),
             "first batch only": masked[0].amax(dim=(1, 2)),
             "in log2 units": masked.amax(dim=(0, 2, 3)) * math.log2(math.e)}[name]
    with pytest.raises(AssertionError, match="max_logit of head"):
        judge(wrong)


def test_a_max_logit_of_another_shape_is_refused():
    _, _, _, _, _, masked = problem()
    with pytest.raises(ValueError, match=r"max_logit must be \[H\] = \[4\]"):
        judge(masked.amax(dim=(0, 2, 3))[:3])
