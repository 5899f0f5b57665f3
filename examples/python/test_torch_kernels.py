"""Judging PyTorch's CPU softmax, log_softmax and attention against the correctly rounded reference,
as a kernel engineer would write the test. Run from the repository root after building:

    PYTHONPATH=build/python python3 -m pytest examples/python -p sharpcheck.pytest_plugin \
        --sharpcheck-report sharpcheck-report.json --sharpcheck-junit sharpcheck-junit.xml
"""

import pytest
import torch

import sharpcheck

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(1234)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 1024, 16384])
def test_softmax(dtype, n):
    x = (3 * torch.randn(8, n)).to(dtype)
    sharpcheck.assert_softmax_close(torch.softmax(x, dim=-1), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_softmax(dtype):
    x = (3 * torch.randn(8, 4096)).to(dtype)
    sharpcheck.assert_log_softmax_close(torch.log_softmax(x, dim=-1), x)


def attention(q, k, v, causal):
    """matmul + softmax with fp32 scores and probabilities, output in the inputs' dtype (what
    FlashAttention-style kernels keep in fp32); GQA by repeat_interleave, causal by a mask."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q.float() @ k.float().transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gqa(dtype, causal):
    q = torch.randn(2, 8, 128, 64).to(dtype)
    k, v = torch.randn(2, 2, 128, 64).to(dtype), torch.randn(2, 2, 128, 64).to(dtype)
    out = attention(q, k, v, causal)
    # causal=True is SDPA's is_causal (top-left); FlashAttention's is align="bottom-right".
    sharpcheck.assert_attention_close(out, q, k, v, causal=causal)
