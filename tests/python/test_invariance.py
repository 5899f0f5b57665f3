"""sharpcheck.batch_invariance (issue 35): a kernel that computes each request on its own is
invariant and deterministic; one whose split count depends on the batch size is reported with the
requests that changed, and is still judged for accuracy."""

import math

import pytest
import torch

import sharpcheck


def per_request(q, k, v, scale, splits=1):
    """Attention one request at a time, keys in `splits` chunks merged by their LSEs (split-KV)."""
    outs = []
    for b in range(q.shape[0]):
        qb, kb, vb = (t[b:b + 1].float() for t in (q, k, v))
        group = qb.shape[1] // kb.shape[1]
        kb, vb = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
        s = (qb @ kb.transpose(-1, -2)) * scale
        chunks = s.split(math.ceil(s.shape[-1] / splits), -1)
        values = vb.split(math.ceil(s.shape[-1] / splits), -2)
        lses = [torch.logsumexp(c, -1, keepdim=True) for c in chunks]
        partial = [torch.softmax(c, -1) @ w for c, w in zip(chunks, values)]
        total = torch.logsumexp(torch.cat(lses, -1), -1, keepdim=True)
        out = sum(torch.exp(l - total) * o for l, o in zip(lses, partial))
        outs.append(out.to(q.dtype))
    return torch.cat(outs)


def splits_from_batch(q, k, v, scale):
    """The split count taken from the whole batch (a scheduler heuristic): batch-variant."""
    return per_request(q, k, v, scale, splits=1 + q.shape[0] % 5)


def test_a_per_request_kernel_is_invariant_deterministic_and_accurate():
    report = sharpcheck.batch_invariance(per_request, format="fp32")
    assert report.passed, str(report)
    assert report.check() is report


def test_a_split_count_from_the_batch_size_is_reported_with_the_requests_that_changed():
    report = sharpcheck.batch_invariance(splits_from_batch, format="fp32")
    assert not report.invariant and report.deterministic and report.accurate
    assert {d.batch_size for d in report.differences} == {15, 17}  # 16 % 5 == 1 % 5: the alone run's split
    assert all(d.elements > 0 and d.max_abs < 1e-5 for d in report.differences)  # last bits only
    with pytest.raises(AssertionError, match="batch of 15: request"):
        report.check()


def test_a_nondeterministic_kernel_is_named():
    calls = []

    def flaky(q, k, v, scale):
        calls.append(1)
        out = per_request(q, k, v, scale)
        return out + (len(calls) % 2) * 2.0 ** -20 if q.shape[0] == 1 else out

    report = sharpcheck.batch_invariance(flaky, format="fp32", requests=3, batch_sizes=(1,))
    assert not report.deterministic and report.nondeterministic


def test_a_kernel_that_drops_batch_members_or_returns_another_type_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        sharpcheck.batch_invariance(lambda q, k, v, scale: per_request(q[:1], k[:1], v[:1], scale), format="fp32")
    with pytest.raises(TypeError, match="tuple"):
        sharpcheck.batch_invariance(lambda q, k, v, scale: (per_request(q, k, v, scale),), format="fp32")


def test_misuse_is_refused():
    with pytest.raises(ValueError, match="op must be"):
        sharpcheck.batch_invariance(per_request, "softmax")
    with pytest.raises(ValueError, match="format"):
        sharpcheck.batch_invariance(per_request, format="fp8_e4m3")
    with pytest.raises(ValueError, match="kv_heads"):
        sharpcheck.batch_invariance(per_request, kv_heads=3)
    with pytest.raises(ValueError, match="batch size"):
        sharpcheck.batch_invariance(per_request, batch_sizes=(2.5,))
