"""Strided arrays are read in place, with the same verdicts as their contiguous copies (issue 34):
transposes, negative and zero strides, bshd views of a packed QKV tensor, autograd's dK. Each
equality is paired with a case that can fail: the same memory judged with the wrong shape fails."""

import numpy as np
import pytest
import torch

import sharpcheck


def _same_verdict(a: sharpcheck.Report, b: sharpcheck.Report) -> None:
    assert a.record["status"] == b.record["status"]
    assert a.record["tiers"] == b.record["tiers"]
    assert a.record["elements"] == b.record["elements"]


def test_a_transposed_softmax_is_judged_as_its_contiguous_copy():
    g = torch.Generator().manual_seed(41)
    x = torch.randn(6, 9, generator=g, dtype=torch.float64).t()  # [9, 6], strides (1, 9)
    assert not x.is_contiguous()
    y = torch.softmax(x.float(), dim=0).float()
    strided = sharpcheck.assert_softmax_close(y, x.float(), dim=0)
    copied = sharpcheck.assert_softmax_close(y.contiguous(), x.float().contiguous(), dim=0)
    _same_verdict(strided, copied)
    assert strided.record["status"] == "pass"


def test_the_strided_memory_is_read_by_index_not_by_address():
    # softmax along dim 0 of a transposed view: read as raw memory (the old contiguous reading) the
    # rows would be the columns, and the verdict would fail.
    g = torch.Generator().manual_seed(42)
    x = torch.randn(5, 7, generator=g).t()
    y = torch.softmax(x, dim=-1)
    with pytest.raises(AssertionError):
        sharpcheck.assert_softmax_close(y.contiguous().view(5, 7).t(), x)  # right memory, wrong rows


@pytest.mark.parametrize("view", ["reversed", "every_other", "broadcast"])
def test_numpy_negative_step_and_zero_strides_are_read(view):
    rng = np.random.default_rng(43)
    base = rng.standard_normal((4, 16)).astype(np.float32)
    x = {"reversed": base[:, ::-1], "every_other": base[:, ::2],
         "broadcast": np.broadcast_to(base[1], (4, 16))}[view]
    y = sharpcheck.softmax(np.ascontiguousarray(x), format="fp32")
    strided = sharpcheck.assert_softmax_close(y, x)
    copied = sharpcheck.assert_softmax_close(y, np.ascontiguousarray(x))
    _same_verdict(strided, copied)
    wrong = np.ascontiguousarray(y[::-1]) if view != "broadcast" else y * np.float32(1.01)
    with pytest.raises(AssertionError):
        sharpcheck.assert_softmax_close(wrong, x)


def test_bshd_views_of_a_packed_qkv_tensor_are_judged_without_copies():
    g = torch.Generator().manual_seed(44)
    qkv = torch.randn(2, 12, 3, 2, 8, generator=g)  # [batch, seq, 3, heads, dim] as flash_attn_qkvpacked
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous()
    scores = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2) / np.sqrt(8.0)
    out = (torch.softmax(scores, dim=-1) @ v.transpose(1, 2)).transpose(1, 2)  # a bshd view of bhsd
    strided = sharpcheck.assert_attention_close(out, q, k, v, layout="bshd")
    copied = sharpcheck.assert_attention_close(out.contiguous(), q.contiguous(), k.contiguous(),
                                               v.contiguous(), layout="bshd")
    _same_verdict(strided, copied)
    with pytest.raises(AssertionError):
        sharpcheck.assert_attention_close(out, q, v, k, layout="bshd")  # k and v swapped


def test_autograd_gradients_that_come_back_as_views_are_judged():
    g = torch.Generator().manual_seed(45)
    q, v, dout = (torch.randn(1, 2, 10, 8, generator=g).requires_grad_() for _ in range(3))
    # K is kept as K^T (a leaf [.., d, n]): autograd's dK is then the transpose of a contiguous buffer.
    kt = torch.randn(1, 2, 8, 10, generator=g).requires_grad_()
    scores = (q @ kt) / np.sqrt(8.0)
    out = torch.softmax(scores, dim=-1) @ v
    out.backward(dout)
    dk = kt.grad.transpose(-1, -2)
    assert not dk.is_contiguous()
    strided = sharpcheck.assert_attention_backward_close(q.grad, dk, v.grad, q, kt.detach().transpose(-1, -2),
                                                         v, dout)
    copied = sharpcheck.assert_attention_backward_close(q.grad, dk.contiguous(), v.grad, q,
                                                        kt.detach().transpose(-1, -2).contiguous(), v, dout)
    _same_verdict(strided, copied)
    with pytest.raises(AssertionError):
        sharpcheck.assert_attention_backward_close(q.grad, kt.grad.reshape(dk.shape), v.grad, q,
                                                   kt.detach().transpose(-1, -2), v, dout)
