"""The backward references (issue 17, first part): softmax_backward and log_softmax_backward
correctly rounded against mpmath, exact zeros where the gradient is exactly zero, rational cases
exact, bad input refused."""

import mpmath
import numpy as np
import pytest
import torch

import sharpcheck
from test_references import rounded

FORMATS = [("fp64", 53, -1022), ("fp32", 24, -126), ("bf16", 8, -126)]


def mp_backward(logits, dy, theta, log):
    with mpmath.workdps(150):
        z = [mpmath.mpf(float(x)) / mpmath.mpf(float(theta)) for x in logits]
        top = max(z)
        w = [mpmath.exp(x - top) for x in z]
        total = mpmath.fsum(w)
        y = [x / total for x in w]
        d = [mpmath.mpf(float(g)) for g in dy]
        if log:
            s = mpmath.fsum(d)
            return [(d[j] - y[j] * s) / mpmath.mpf(float(theta)) for j in range(len(d))]
        dot = mpmath.fsum(a * b for a, b in zip(y, d))
        return [y[j] * (d[j] - dot) / mpmath.mpf(float(theta)) for j in range(len(d))]


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("fmt,precision,min_exponent", FORMATS)
@pytest.mark.parametrize("seed", range(4))
def test_backward_is_correctly_rounded_against_mpmath(log, fmt, precision, min_exponent, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    logits = rng.normal(0, 3, n)
    dy = rng.normal(0, 1, n)
    theta = [1.0, 0.5, -2.0, 7.0][seed]
    operation = sharpcheck.log_softmax_backward if log else sharpcheck.softmax_backward
    ours = np.asarray(operation(dy, logits, theta=theta, format=fmt), dtype=np.float64)
    exact = mp_backward(logits, dy, theta, log)
    assert ours.tolist() == [rounded(v, precision, min_exponent) for v in exact]


def test_exact_zeros_and_rational_cases():
    # dy constant on a row: every softmax gradient is exactly 0.
    x = np.array([0.3, -1.0, 2.5, 2.5])
    assert sharpcheck.softmax_backward(np.full(4, 3.25), x, format="fp32").tolist() == [0.0] * 4
    # Group means all equal (logit 1: dy 0 and 2; logit 2: dy 1): zero exactly where dy is that mean.
    grad = sharpcheck.softmax_backward(np.array([0.0, 2.0, 1.0]), np.array([1.0, 1.0, 2.0]), format="fp64")
    assert grad[2] == 0.0 and grad[0] < 0 < grad[1]
    # One distinct logit: y = 1/3, rational results, exact.
    grad = sharpcheck.softmax_backward(np.array([1.0, 2.0, 4.0]), np.zeros(3), format="fp64")
    assert grad.tolist() == [(3 * 1 - 7) / 9, (3 * 2 - 7) / 9, (3 * 4 - 7) / 9]
    # log_softmax_backward with sum(dy) = 0: exactly dy / theta.
    dy = np.array([0.1, -0.3, 0.2, 0.0])
    dy[3] = -dy[:3].sum()
    if dy.sum() == 0:
        assert sharpcheck.log_softmax_backward(dy, x, theta=4.0, format="fp64").tolist() == (dy / 4).tolist()
    # Masked entries get 0 and their dy is not read.
    masked = sharpcheck.softmax_backward(np.array([1.0, np.nan, 2.0]), np.array([0.0, -np.inf, 1.0]), format="fp64")
    assert masked[1] == 0.0 and np.isfinite(masked).all()


def test_a_torch_autograd_gradient_is_close_to_the_reference():
    x = torch.randn(4, 64, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(4, 64, dtype=torch.float64)
    torch.softmax(x, -1).backward(dy)
    ours = sharpcheck.softmax_backward(dy, x.detach(), format="fp64")
    assert torch.allclose(ours, x.grad, rtol=0, atol=1e-15)


@pytest.mark.parametrize("call,words", [
    (lambda: sharpcheck.softmax_backward(np.ones(3), np.ones(4)), "shape"),
    (lambda: sharpcheck.softmax_backward(np.array([1.0, np.inf]), np.zeros(2)), r"dy\[1\] is not finite"),
    (lambda: sharpcheck.log_softmax_backward(np.ones(2), np.zeros(2), theta=0.0), "theta"),
])
def test_bad_input_is_refused(call, words):
    with pytest.raises(ValueError, match=words):
        call()
