"""sharpcheck.ops() and sharpcheck.judge(): the registry the CLI lists (`sharpcheck ops --json`),
and every operation judged from torch tensors by name, each passing a correct kernel written as
users write it and failing a broken variant; the schema refuses unknown keywords and bad values."""

import json
import os
import subprocess

import numpy as np
import pytest
import torch

import sharpcheck

torch.manual_seed(0)


def test_ops_lists_what_the_program_lists():
    program = os.environ.get("SHARPCHECK_PROGRAM")
    if program is None:
        pytest.skip("SHARPCHECK_PROGRAM not set")
    listed = json.loads(subprocess.run([program, "ops", "--json"], check=True, capture_output=True,
                                       text=True).stdout)
    assert listed == sharpcheck.ops()
    names = {o["name"] for o in listed}
    assert {"softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "attention",
            "attention_backward", "linear_attention", "selective_attention", "differential_attention"} <= names


def test_softmax_backward_of_autograd_passes_and_a_one_percent_error_fails():
    x = torch.randn(4, 64, dtype=torch.float64).float().requires_grad_()
    dy = torch.randn(4, 64)
    torch.softmax(x, -1).backward(dy)
    report = sharpcheck.judge("softmax_backward", logits=x, dy=dy, dx=x.grad)
    assert report.passed
    wrong = x.grad.clone()
    wrong[1, 5] *= 1.01
    with pytest.raises(AssertionError, match="softmax_backward results"):
        sharpcheck.judge("softmax_backward", logits=x, dy=dy, dx=wrong)


def test_log_softmax_backward_along_dim_0():
    x = torch.randn(32, 3).requires_grad_()
    dy = torch.randn(32, 3)
    torch.log_softmax(x, 0).backward(dy)
    assert sharpcheck.judge("log_softmax_backward", logits=x, dy=dy, dx=x.grad, dim=0).passed
    with pytest.raises(AssertionError):
        sharpcheck.judge("log_softmax_backward", logits=x, dy=dy, dx=x.grad, dim=1)


def linear_attention(q, k, v, causal):
    """Linear attention as users write it: phi = elu + 1, in fp32."""
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    s = fq @ fk.T
    if causal:
        s = s.tril()
    return (s / s.sum(-1, keepdim=True)) @ v


def test_linear_attention_causal_or_not_must_match_the_option():
    q, k, v = torch.randn(12, 16), torch.randn(12, 16), torch.randn(12, 8)
    out = linear_attention(q, k, v, causal=True)
    assert sharpcheck.judge("linear_attention", q=q, k=k, v=v, out=out, causal=True).passed
    with pytest.raises(AssertionError):
        sharpcheck.judge("linear_attention", q=q, k=k, v=v, out=out, causal=False)


def test_differential_attention_with_lambda():
    a, b = torch.randn(6, 9, dtype=torch.float64), torch.randn(6, 9, dtype=torch.float64)
    weights = (torch.softmax(a, -1) - 0.5 * torch.softmax(b, -1)).float()
    assert sharpcheck.judge("differential_attention", logits=a, logits2=b, weights=weights, **{"lambda": 0.5}).passed
    with pytest.raises(AssertionError):
        sharpcheck.judge("differential_attention", logits=a, logits2=b, weights=weights, **{"lambda": 0.75})


def test_attention_from_sdpa_in_bf16():
    q, k, v = (torch.randn(1, 2, 33, 16).bfloat16() for _ in range(3))
    scores = (q.float() @ k.float().transpose(-1, -2)) / 4
    scores = scores.masked_fill(~torch.ones(33, 33, dtype=torch.bool).tril(), float("-inf"))
    out = (torch.softmax(scores, -1) @ v.float()).bfloat16()
    assert sharpcheck.judge("attention", q=q, k=k, v=v, out=out, causal=True).passed
    with pytest.raises(AssertionError):
        sharpcheck.judge("attention", q=q, k=k, v=v, out=out, causal=True, align="bottom-right",
                         tolerance="attention_fp32", key_lengths=[20])


def test_unknown_keywords_and_bad_values_are_refused_by_name():
    x = torch.randn(2, 8)
    y = torch.softmax(x, -1)
    with pytest.raises(ValueError, match="colour is neither a tensor nor an option"):
        sharpcheck.judge("softmax", logits=x, probs=y, colour="red")
    with pytest.raises(ValueError, match="dim: expected an integer"):
        sharpcheck.judge("softmax", logits=x, probs=y, dim="last")
    with pytest.raises(ValueError, match="no operation named 'softmaxx'"):
        sharpcheck.judge("softmaxx", logits=x, probs=y)
    with pytest.raises(ValueError, match="probs"):
        sharpcheck.judge("softmax", logits=x)
    with pytest.raises(ValueError, match="does not match"):
        sharpcheck.judge("softmax_backward", logits=x, dy=x, dx=np.zeros((2, 7), dtype=np.float32))
