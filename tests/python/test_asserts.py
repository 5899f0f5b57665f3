"""The asserts: each passes on the correctly rounded output and fails, with the documented
message, on a 2-ulp edit in bf16, on a bf16-accumulating softmax and on a wrong causal alignment;
DLPack and buffer-protocol inputs agree; bad input raises ValueError/TypeError naming what and
where."""

import json
import re

import numpy as np
import pytest
import torch

import sharpcheck

torch.manual_seed(0)


def two_ulps_up(tensor, index):
    edited = tensor.clone()
    bits = edited.view(torch.int16)
    bits[index] += 2  # a positive bf16 value two ulps up
    return edited


def bf16_accumulating_softmax(x):
    """exp in fp32, the running sum kept in bf16 (the denominator stall), the quotient rounded."""
    e = torch.exp(x.float() - x.float().max(dim=-1, keepdim=True).values)
    total = torch.zeros(x.shape[:-1], dtype=torch.bfloat16)
    for j in range(x.shape[-1]):
        total = (total.float() + e[..., j].bfloat16().float()).bfloat16()
    return (e / total.float().unsqueeze(-1)).bfloat16()


MESSAGE_LINES = [r"are not close to the correctly rounded reference!", r"Mismatched elements: \d+ / \d+ \(",
                 r"Greatest absolute difference: ", r"Greatest relative difference: ",
                 r"Worst element: \w+ at index \([0-9, ]+\): expected -?0x[0-9a-f.]+p[-+]\d+, got ",
                 r"Bound ratio: proven tier [0-9.e+-]+, statistical tier ",
                 r"Format \w+, (recipe|precision model \(tolerance entry\)) \w+"]


def assert_documented_message(error, index=None):
    text = str(error.value)
    for line in MESSAGE_LINES:
        assert re.search(line, text), f"missing {line!r} in:\n{text}"
    if index is not None:
        assert f"at index {tuple(index)}" in text, text


def test_softmax_passes_exact_bf16_and_fails_a_two_ulp_edit_naming_its_index():
    x = torch.randn(8, 512).bfloat16()
    exact = sharpcheck.softmax(x)
    report = sharpcheck.assert_softmax_close(exact, x)
    assert report.max_ulp == 0 and report.bound_ratio == 0 and report.passed
    edited = two_ulps_up(exact, (5, 300))
    with pytest.raises(AssertionError) as error:
        sharpcheck.assert_softmax_close(edited, x)
    assert_documented_message(error, (5, 300))
    assert "2 ulp" in str(error.value)


def test_softmax_passes_torchs_own_softmax_and_fails_a_bf16_accumulating_one():
    x = torch.randn(4, 2048)
    assert sharpcheck.assert_softmax_close(torch.softmax(x, -1), x).passed
    xb = x.bfloat16()
    assert sharpcheck.assert_softmax_close(torch.softmax(xb.float(), -1).bfloat16(), xb).passed
    with pytest.raises(AssertionError) as error:
        sharpcheck.assert_softmax_close(bf16_accumulating_softmax(xb), xb)
    assert_documented_message(error)


def test_a_subnormal_result_flushed_to_zero_passes_where_fp32_arithmetic_flushes_it():
    """A kernel in a flush-to-zero mode (a GPU's -ftz, oneDNN's denormals) returns 0 for a result
    below the normal range: allowed in fp32 (and bf16), whose range that mode works in; a normal
    value set to 0, or an fp16 subnormal flushed, still fails."""
    logits = torch.tensor([[0.0, -95.0, -1.0, -2.0]])
    honest = torch.softmax(logits, -1)
    assert 0 < honest[0, 1] < 2.0**-126  # subnormal in fp32
    flushed = honest.clone()
    flushed[0, 1] = 0.0
    sharpcheck.assert_softmax_close(flushed, logits)
    normal_zeroed = torch.softmax(torch.tensor([[0.0, -60.0, -1.0, -2.0]]), -1)
    normal_zeroed[0, 1] = 0.0  # 6e-27, a normal fp32 number
    with pytest.raises(AssertionError):
        sharpcheck.assert_softmax_close(normal_zeroed, torch.tensor([[0.0, -60.0, -1.0, -2.0]]))
    half_logits = torch.tensor([[0.0, -12.0, -1.0, -2.0]])
    half = torch.softmax(half_logits, -1).half()
    assert 0 < half[0, 1] < 2.0**-14  # subnormal in fp16
    half[0, 1] = 0.0
    with pytest.raises(AssertionError):
        sharpcheck.assert_softmax_close(half, half_logits.half())


def test_log_softmax_passes_torch_and_fails_a_two_ulp_edit():
    # Its own draw: whether 2 bf16 ulps exceed the allowance 2 u |log p| + ... depends on where
    # |log p| falls in its binade (for some draws of element [2, 7] it is 0.8 of it), so the test must
    # not depend on how many numbers earlier tests drew.
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(1))
    y = torch.log_softmax(x, -1)
    assert sharpcheck.assert_log_softmax_close(y, x).passed
    exact = sharpcheck.log_softmax(x.bfloat16())
    bits = exact.clone()
    bits.view(torch.int16)[2, 7] += 2
    with pytest.raises(AssertionError) as error:
        sharpcheck.assert_log_softmax_close(bits, x.bfloat16())
    assert_documented_message(error, (2, 7))


def sdpa_math(q, k, v, causal_offset=None):
    """Attention as users write it: matmul + softmax, causal by an explicit mask, GQA by repeat_interleave."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal_offset is not None:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(diagonal=causal_offset)
        scores = scores.masked_fill(~keep, float("-inf"))
    return (torch.softmax(scores, -1) @ v.float()).to(q.dtype), torch.logsumexp(scores, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_passes_and_fails_on_a_wrong_causal_alignment(dtype):
    q = torch.randn(2, 4, 24, 32).to(dtype)
    k, v = torch.randn(2, 2, 40, 32).to(dtype), torch.randn(2, 2, 40, 32).to(dtype)
    out, lse = sdpa_math(q, k, v, causal_offset=40 - 24)  # bottom-right, as FlashAttention aligns
    report = sharpcheck.assert_attention_close(out, q, k, v, lse=lse, causal=True, align="bottom-right")
    assert report.passed and report.bound_ratio < 1
    with pytest.raises(AssertionError) as error:
        sharpcheck.assert_attention_close(out, q, k, v, causal=True, align="top-left")
    assert_documented_message(error)
    assert "causal top-left" in str(error.value)


def test_a_bf16_log_sum_exp_is_judged_in_bf16_and_a_shifted_one_fails():
    q = torch.randn(1, 2, 24, 32).bfloat16()
    k, v = torch.randn(1, 2, 300, 32).bfloat16(), torch.randn(1, 2, 300, 32).bfloat16()
    out, lse = sdpa_math(q, k, v)
    report = sharpcheck.assert_attention_close(out, q, k, v, lse=lse.bfloat16())
    assert report.passed and any("judged in bf16" in note for note in report.notes)
    # The same values read as fp32 LSE: a bf16 rounding (up to 2^-9 |L|) is far beyond fp32's allowance.
    with pytest.raises(AssertionError):
        sharpcheck.assert_attention_close(out, q, k, v, lse=lse.bfloat16().float())
    # Four bf16 ulps at |L| about 6 (0.0625 each... 2^-5): a bias a bf16 LSE must not hide.
    with pytest.raises(AssertionError):
        sharpcheck.assert_attention_close(out, q, k, v, lse=(lse + 0.125).bfloat16())


def test_attention_exact_output_passes_and_a_two_ulp_bf16_edit_fails_at_its_full_index():
    # Seeded: with 2 u_out |e| for the output's rounding, an edit at the top of a binade passed (7
    # of 200 seeds, seed 0 among them); the reachable codes' allowance (rounded_reach) fails it.
    # Left open: at an e that is a power of two, 2 codes toward zero are as far as the 1 code
    # reachable away from it, which a symmetric |a - e| cannot tell apart (1 seed of 200).
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8).bfloat16() for _ in range(3))
    exact = sharpcheck.attention(q, k, v, causal=True)
    assert sharpcheck.assert_attention_close(exact, q, k, v, causal=True).max_ulp == 0
    edited = exact.clone()
    # The largest output: there 2 ulp are largest against the row's magnitude sum_j p_j |v_j|.
    flat = int(exact.float().abs().argmax())
    index = tuple(int(i) for i in torch.tensor(divmod_all(flat, exact.shape)))
    bits = edited.view(torch.int16)
    bits[index] += 2 if float(edited[index]) > 0 else -2
    # Under the fp32 recipe (S and P in fp32): with no recipe named, 2 bf16 ulp on one element is
    # what rounding P to bf16 can do, and the edit passes as flash_bf16.
    with pytest.raises(AssertionError) as error:
        sharpcheck.assert_attention_close(edited, q, k, v, causal=True, tolerance="attention_fp32")
    assert_documented_message(error, index)


def divmod_all(flat, shape):
    index = []
    for extent in reversed(shape):
        flat, position = divmod(flat, extent)
        index.insert(0, position)
    return index


class DLPackOnly:
    """What a JAX or CuPy array looks like to sharpcheck: __dlpack__ and nothing else."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_and_buffer_protocol_inputs_agree():
    x = torch.randn(5, 77)
    y = torch.softmax(x, -1)
    through_dlpack = sharpcheck.assert_softmax_close(y, x).record
    through_buffer = sharpcheck.assert_softmax_close(y.numpy(), x.numpy()).record
    numpy_through_dlpack = sharpcheck.assert_softmax_close(DLPackOnly(y.numpy()), DLPackOnly(x.numpy()),
                                                           format="fp32").record
    memoryviews = sharpcheck.assert_softmax_close(memoryview(y.numpy()), memoryview(x.numpy()), format="fp32").record
    for other in (through_buffer, numpy_through_dlpack, memoryviews):
        for key in ("max_ulps", "max_bound_ratio", "tiers", "elements", "worst"):
            assert other[key] == through_dlpack[key], key
    reference = sharpcheck.softmax(DLPackOnly(x.numpy()), format="fp32")
    assert np.array_equal(reference, sharpcheck.softmax(x).numpy())
    # bf16 through DLPack equals bf16 bit patterns through the buffer protocol (int16, as torch saves them).
    xb = x.bfloat16()
    yb = sharpcheck.softmax(xb)
    a = sharpcheck.assert_softmax_close(yb, xb).record
    b = sharpcheck.assert_softmax_close(yb.view(torch.int16).numpy(), xb.view(torch.int16).numpy(),
                                        format="bf16").record
    assert a["tiers"] == b["tiers"] and a["elements"] == b["elements"]


@pytest.mark.parametrize("call,kind,words", [
    (lambda: sharpcheck.softmax(torch.tensor([1.0, float("nan"), 2.0])), ValueError, "logit 1 is NaN"),
    (lambda: sharpcheck.softmax(torch.tensor([[1.0, 2.0], [float("inf"), 0.0]])), ValueError, "lane 1"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(4), torch.ones(4, dtype=torch.int64)), TypeError, "logits"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(4, dtype=torch.int32), torch.ones(4)), TypeError, "actual"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(3) / 3, torch.ones(4)), ValueError, "does not match"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(0), torch.ones(0)), ValueError, "holds no element"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(2) / 2, torch.ones(2), theta=0.0), ValueError, "theta"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(2) / 2, torch.ones(2), dim=3), ValueError, "dim"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(2) / 2, torch.ones(2), format="fp7"), ValueError, "fp7"),
    (lambda: sharpcheck.assert_softmax_close(torch.ones(2) / 2, torch.ones(2), tolerance="nope"), ValueError, "nope"),
    (lambda: sharpcheck.assert_softmax_close(np.array([0.1, 0.9]), "text"), TypeError, "logits"),
    (lambda: sharpcheck.assert_attention_close(torch.ones(1, 1, 4, 8), torch.ones(1, 1, 4, 8),
                                               torch.ones(1, 1, 5, 8), torch.ones(1, 1, 4, 8)), ValueError, "disagree"),
    (lambda: sharpcheck.assert_attention_close(torch.ones(1, 3, 4, 8), torch.ones(1, 3, 4, 8),
                                               torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8)), ValueError, "heads"),
    (lambda: sharpcheck.attention(torch.ones(4, 8), torch.ones(4, 8), torch.ones(4, 8), window=(1, 2, 3)),
     ValueError, "window"),
    (lambda: sharpcheck.softmax(np.ones(3), dim=1.0), TypeError, "dim: must be an integer"),
    (lambda: sharpcheck.softmax(np.ones(3), theta=True), TypeError, "theta"),
])
def test_bad_input_raises_naming_what_and_where(call, kind, words):
    with pytest.raises(kind) as error:
        call()
    assert words in str(error.value), str(error.value)


def test_a_report_carries_the_figures_and_the_gates_record():
    x = torch.randn(3, 100)
    report = sharpcheck.assert_softmax_close(torch.softmax(x, -1), x, name="torch_softmax")
    record = json.loads(report.to_json())
    assert record["kernel"] == "torch_softmax" and record["status"] == "pass"
    assert report.max_ulp == record["max_ulps"] and report.elements == 300
    assert 0 < report.bound_ratio < 1 and report.statistical_ratio >= report.bound_ratio


def test_a_one_hot_output_is_inconclusive_not_a_plain_pass():
    x = torch.tensor([[0.0, -200.0, -300.0]] * 4)
    report = sharpcheck.assert_softmax_close(sharpcheck.softmax(x), x)
    assert report.inconclusive and report.status == "inconclusive"


class OnAnotherDevice:
    """A CuPy-like array on device 2 (CUDA): sharpcheck copies it to the host once and says so."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        raise AssertionError("device memory must not be read in place")

    def __dlpack_device__(self):
        return (2, 0)

    def get(self):
        return self.array


def test_a_device_array_is_copied_to_the_host_and_the_report_says_so():
    x = np.random.default_rng(5).normal(0, 1, (3, 50)).astype(np.float32)
    y = sharpcheck.softmax(x)
    report = sharpcheck.assert_softmax_close(OnAnotherDevice(y), OnAnotherDevice(x), format="fp32")
    assert report.passed
    assert report.notes == ["actual was copied from DLPack device 2 to the host",
                            "logits was copied from DLPack device 2 to the host"]
    assert json.loads(report.to_json())["notes"] == report.notes


def test_a_correct_nan_in_e4m3_is_a_value_and_a_finite_output_in_its_place_fails():
    """e4m3 has no infinity: a result past 448 rounds to its NaN, which a kernel must return too."""
    q, k, v = np.array([[3.0]]), np.array([[1.0], [0.0]]), np.array([[1000.0], [2000.0]])
    out = sharpcheck.attention(q, k, v, scale=1.0, format="fp8_e4m3")
    assert np.isnan(out).all()
    assert sharpcheck.assert_attention_close(out, q, k, v, scale=1.0, format="fp8_e4m3").passed
    with pytest.raises(AssertionError):
        sharpcheck.assert_attention_close(np.array([[448.0]]), q, k, v, scale=1.0, format="fp8_e4m3")
    x = np.array([[0.0, -600.0, 1.0]])
    y = sharpcheck.log_softmax(x, format="fp8_e4m3")
    assert np.isnan(y[0, 1]) and sharpcheck.assert_log_softmax_close(y, x, format="fp8_e4m3").status == "pass"
    wrong = y.copy()
    wrong[0, 1] = -448.0
    with pytest.raises(AssertionError):
        sharpcheck.assert_log_softmax_close(wrong, x, format="fp8_e4m3")


def test_scores_that_overflow_double_are_inconclusive_not_a_false_fail():
    """q.k near 1e320 at theta 1e308: the allowances are not finite, so the judge says it cannot tell
    (inconclusive, with a warning) instead of failing the exact output moved by one ulp."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((4, 8)) * 1e160, rng.standard_normal((6, 8)) * 1e160, rng.standard_normal((6, 8))
    out = sharpcheck.attention(q, k, v, theta=1e308, format="fp64")
    for judged in (out, np.nextafter(out, np.inf)):
        with pytest.warns(UserWarning, match="inconclusive"):
            report = sharpcheck.assert_attention_close(judged, q, k, v, theta=1e308, format="fp64")
        assert report.inconclusive


def test_a_backward_failure_lists_every_gradients_verdict():
    g = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(1, 2, 32, 16, generator=g) for _ in range(4))
    dq, dk, dv, _ = sharpcheck.attention_backward(q, k, v, dout)
    dk = dk.clone()
    dk[0, 1, 3, :] *= 1.05  # one key's gradient 5% off
    with pytest.raises(AssertionError) as failure:
        sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout)
    line = next(l for l in str(failure.value).splitlines() if l.startswith("Per tensor:"))
    assert "dq passes" in line and "dk fails" in line and "dv passes" in line


def test_under_proven_only_a_gradient_with_statistical_findings_alone_passes_in_the_per_tensor_line():
    """The line said "dv fails" for findings of the statistical tier, which proven_only does not
    judge (the verdict passed it). The report's tensors now count the proven tier's findings apart."""
    from sharpcheck._asserts import _tensor_verdict
    dv = {"name": "dv", "proven_ratio": 0.5, "statistical_ratio": 1.3, "violations": 4, "proven_violations": 0,
          "non_finite": 0}
    assert _tensor_verdict(dv).startswith("dv fails") and "4 findings" in _tensor_verdict(dv)
    assert _tensor_verdict(dv, proven_only=True) == "dv passes (proven 0.5, statistical 1.3)"
    assert _tensor_verdict(dict(dv, proven_violations=2), proven_only=True).startswith("dv fails")
    g = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(1, 1, 8, 4, generator=g) for _ in range(4))
    dq, dk, dv_exact, _ = sharpcheck.attention_backward(q, k, v, dout)
    report = sharpcheck.assert_attention_backward_close(dq, dk, dv_exact, q, k, v, dout, proven_only=True)
    assert all("proven_violations" in t for t in report.record["tensors"]) and report.record["proven_only"]


def test_a_nan_failure_says_the_differences_are_over_finite_elements():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 1, 8, 16, generator=g) for _ in range(3))
    out = sharpcheck.attention(q, k, v).clone()
    out[0, 0, 2, 3] = float("nan")
    with pytest.raises(AssertionError, match=r"1 NaN or Inf where the result is finite"):
        sharpcheck.assert_attention_close(out, q, k, v)


def test_a_passing_report_leads_with_the_bound_ratio():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    assert repr(sharpcheck.assert_softmax_close(torch.softmax(x, -1), x)).startswith("Report(status='pass', bound_ratio=")


def test_an_attention_output_of_the_right_count_in_another_shape_is_refused():
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g) for _ in range(3))
    out = sharpcheck.attention(q, k, v)
    with pytest.raises(ValueError, match=r"has shape \[256\]; expected \[1, 2, 8, 16\]"):
        sharpcheck.assert_attention_close(out.reshape(-1), q, k, v)


def test_a_flattened_output_of_one_head_is_refused_and_bshd_heads_may_merge():
    """From issue 33's round: with B = H = 1 (bhsd) an output flattened to [S * D] passed, because the
    last two axes were merged as vLLM merges [heads, dim]; in bhsd they are the positions and the
    dimension. bshd's heads and dimension may still merge ([B, S, H * D])."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 1, 8, 16, generator=g) for _ in range(3))
    out = sharpcheck.attention(q, k, v)
    with pytest.raises(ValueError, match=r"has shape \[128\]; expected \[1, 1, 8, 16\]"):
        sharpcheck.assert_attention_close(out.reshape(-1), q, k, v)
    with pytest.raises(ValueError, match=r"has shape \[1, 128\]"):
        sharpcheck.assert_attention_close(out.reshape(1, 128), q, k, v)
    qs, ks, vs = (x.reshape(1, 8, 2, 8) for x in (q, k, v))  # bshd, two heads
    outs = sharpcheck.attention(qs, ks, vs, layout="bshd")
    assert sharpcheck.assert_attention_close(outs.reshape(1, 8, 16), qs, ks, vs, layout="bshd").passed


def test_outputs_in_the_same_order_with_merged_or_unit_axes_are_read():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(12, 2, 16, generator=g) for _ in range(3))  # packed [T, H, D]
    cu = [0, 5, 12]
    out = sharpcheck.attention(q, k, v, layout="packed", cu_seqlens_q=cu, cu_seqlens_k=cu)
    merged = out.reshape(12, 32)  # vLLM's [tokens, heads * dim]
    assert sharpcheck.assert_attention_close(merged, q, k, v, layout="packed", cu_seqlens_q=cu, cu_seqlens_k=cu).passed
    with pytest.raises(ValueError, match="has shape"):
        sharpcheck.assert_attention_close(out.transpose(0, 1).contiguous(), q, k, v, layout="packed",
                                          cu_seqlens_q=cu, cu_seqlens_k=cu)
    q2, k2, v2 = q[:, 0], k[:, 0], v[:, 0]  # one head's matrices
    out2 = sharpcheck.attention(q2, k2, v2)
    assert sharpcheck.assert_attention_close(out2.reshape(1, 1, 12, 16), q2, k2, v2).passed


def test_the_mismatch_count_counts_elements_and_names_row_findings_apart():
    # A negated softmax once read "72 / 64 (112.5%)": the rows' sums counted as elements.
    x = np.random.default_rng(0).normal(size=(4, 16)).astype(np.float32)
    p = sharpcheck.softmax(x).astype(np.float32)
    with pytest.raises(AssertionError, match=r"Mismatched elements: 64 / 64 \(100\.0%\) outside the proven bound, "
                                             r"and \d+ row findings"):
        sharpcheck.assert_softmax_close(-p, x)
