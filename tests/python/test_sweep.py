"""sharpcheck.sweep and sharpcheck.cases (issue 34): the gate's stress sweep for kernels written in
Python. Honest kernels pass it; Python versions of the built-in twins fail it on the cases that
expose them; a kernel that raises is a crash of its case, not of the sweep."""

import math

import pytest
import torch

import sharpcheck

FEATURES = {"causal", "align", "window", "softcap", "gqa", "alibi_slopes", "sinks", "key_lengths"}


def attention(q, k, v, scale, causal=False, align="top-left", window=None, softcap=0.0, alibi_slopes=None,
              sinks=None, key_lengths=None, bug=""):
    """SDPA as a user writes it in torch (fp32 arithmetic, P rounded to the inputs' format before P V),
    with one of the bug classes of real ports when `bug` names it."""
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads:
        index = torch.arange(heads) % kv_heads if bug == "gqa_modulo" else torch.arange(heads) // (heads // kv_heads)
        k, v = k[:, index], v[:, index]
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap and bug != "ignored_softcap":
        s = softcap * torch.tanh(s / softcap)
    rows, cols = s.shape[-2:]
    i = torch.arange(rows)[:, None]
    j = torch.arange(cols)[None, :]
    offset = cols - rows if align == "bottom-right" else 0
    if alibi_slopes is not None:
        s = s - alibi_slopes.float().view(1, -1, 1, 1) * (i + offset - j).abs()
    masked = torch.zeros(rows, cols, dtype=torch.bool)
    if causal and bug != "ignored_causal":
        masked |= j > i + offset
    if window is not None:
        left, right = window
        masked |= (j < i + offset - left) if left >= 0 else torch.zeros_like(masked)
        masked |= (j > i + offset + right) if right >= 0 else torch.zeros_like(masked)
    s = s.masked_fill(masked, -math.inf)
    if key_lengths is not None:
        for b, n in enumerate(key_lengths):
            s[b, :, :, n:] = -math.inf
    if sinks is not None:
        s = torch.cat([s, sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, rows, 1)], -1)
    p = torch.softmax(s, -1)
    if sinks is not None:
        p = p[..., :-1]
    out = (p.to(dtype).float() if dtype != torch.float32 else p) @ v
    return out.to(dtype)


def torch_softmax(x, theta=1.0):
    return torch.softmax(x.float() / theta, -1).to(x.dtype)


def bf16_accumulation(x):  # the running sum kept in bf16: the built-in twin bf16acc
    e = torch.exp(x.float() - x.float().amax(-1, keepdim=True))
    total = torch.zeros(x.shape[:-1] + (1,), dtype=torch.bfloat16)
    for j in range(e.shape[-1]):
        total = total + e[..., j:j + 1].bfloat16()
    return (e / total.float()).bfloat16()


def naive_overflow(x):  # exp without the max subtracted
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16"])
def test_torch_softmax_passes_the_whole_row_sweep(fmt):
    report = sharpcheck.sweep(torch_softmax, "softmax", format=fmt, features={"theta"}, sizes=(16, 256, 4096))
    assert report.passed, str(report)
    assert len(report.results) == 8 * 3 + 2 * 2 * 3  # every row kind, and the scaled rows at theta 4 and 1/4


@pytest.mark.parametrize("twin,failing_input", [(bf16_accumulation, "random_normal"),
                                                (naive_overflow, "near_overflow")])
def test_softmax_twins_fail_on_the_cases_that_expose_them(twin, failing_input):
    report = sharpcheck.sweep(twin, "softmax", format="bf16", sizes=(256, 1024))
    assert not report.passed
    assert any(failing_input in r.id for r in report.failures), str(report)
    with pytest.raises(AssertionError, match=failing_input):
        report.check()


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_an_honest_torch_attention_passes_every_scenario_it_declares(fmt):
    report = sharpcheck.sweep(attention, "attention", format=fmt, features=FEATURES, sizes=(16, 512))
    assert report.passed, str(report)
    ids = [r.id for r in report.results]
    assert any("sinks" in i for i in ids) and any("window" in i for i in ids) and any("alibi" in i for i in ids)


@pytest.mark.parametrize("bug,exposed_by", [("ignored_causal", "causal"), ("ignored_softcap", "softcap_2"),
                                            ("gqa_modulo", "gqa_4_2")])
def test_attention_twins_fail_where_their_feature_is_swept(bug, exposed_by):
    report = sharpcheck.sweep(lambda *a, **kw: attention(*a, bug=bug, **kw), "attention", format="bf16",
                              features=FEATURES, sizes=(64,), match=exposed_by)
    assert report.failures and all(exposed_by in r.id for r in report.results), str(report)
    alone = sharpcheck.sweep(lambda *a, **kw: attention(*a, bug=bug, **kw), "attention", format="bf16",
                             features=FEATURES, sizes=(64,), match=report.failures[0].id)
    assert [r.id for r in alone.results] == [report.failures[0].id] and not alone.passed  # the id reruns alone


def test_a_kernel_that_raises_is_a_crash_of_each_case_and_the_sweep_goes_on():
    calls = []

    def flaky(x):
        calls.append(x.shape[-1])
        if x.shape[-1] == 16:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return torch_softmax(x)

    report = sharpcheck.sweep(flaky, "softmax", format="fp32", sizes=(16, 32))
    assert {r.status for r in report.results if "n=16" in r.id} == {"crash"}
    assert {r.status for r in report.results if "n=32" in r.id} == {"pass"}
    assert "illegal memory access" in str(report) and not report.passed
    assert len(calls) == 16


def test_a_result_of_the_wrong_shape_or_count_is_an_error_not_a_pass():
    report = sharpcheck.sweep(lambda x: torch_softmax(x)[..., :-1], "softmax", format="fp32", sizes=(16,))
    assert {r.status for r in report.results} == {"error"}
    report = sharpcheck.sweep(lambda q, k, v, scale: (q, q, q), "attention", format="fp32", sizes=(16,))
    assert {r.status for r in report.results} == {"error"}


def test_cases_are_stable_reproducible_and_named_as_the_gate_names_cases():
    first = sharpcheck.cases("attention", format="bf16", sizes=(32,), features=FEATURES)
    again = sharpcheck.cases("attention", format="bf16", sizes=(32,), features=FEATURES)
    other_seed = sharpcheck.cases("attention", format="bf16", sizes=(32,), features=FEATURES, seed=7)
    assert [str(c) for c in first] == [str(c) for c in again]
    assert len({str(c) for c in first}) == len(first)
    assert all(torch.equal(a.args[0], b.args[0]) for a, b in zip(first, again))
    assert not torch.equal(first[0].args[0], other_seed[0].args[0])
    assert str(first[0]) == "python:attention:bf16/attention_normal/n=32"
    plain = sharpcheck.cases("attention", format="bf16", sizes=(32,))
    assert len(plain) < len(first) and all(not c.needs for c in plain)


def test_a_case_judges_a_result_by_itself_as_pytest_parametrize_uses_it():
    case = sharpcheck.cases("softmax", format="bf16", sizes=(64,))[0]
    assert case.judge(torch_softmax(*case.args, **case.kwargs)).passed
    with pytest.raises(AssertionError):
        case.judge(bf16_accumulation(*case.args) * 1.02)


def test_unknown_features_operations_and_formats_are_refused_by_name():
    with pytest.raises(ValueError, match="casual"):
        sharpcheck.cases("attention", features={"casual"})
    with pytest.raises(ValueError, match="attn"):
        sharpcheck.sweep(torch_softmax, "attn")
    assert all(sharpcheck.cases(op["name"], sizes=[16]) for op in sharpcheck.ops())  # every operation has a sweep
    with pytest.raises(ValueError, match="int8"):
        sharpcheck.cases("softmax", format="int8")
    with pytest.raises(ValueError, match="no case"):
        sharpcheck.cases("softmax", match="no such id")


def flash_backward(q, k, v, d_out, scale, causal=False, align="top-left", bug=""):
    """FlashAttention 2's backward as a user writes it in torch (fp32): P from the scores, D =
    rowsum(dO * O), dS = P (dP - D); `bug="stale_d"` forms D from half of dO (a D computed before
    dO was fully written)."""
    dtype = q.dtype
    q, k, v, d_out = (t.float() for t in (q, k, v, d_out))
    s = (q @ k.transpose(-1, -2)) * scale
    rows, cols = s.shape[-2:]
    if causal:
        offset = cols - rows if align == "bottom-right" else 0
        s = s.masked_fill(torch.arange(cols)[None, :] > torch.arange(rows)[:, None] + offset, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    out = p @ v
    written = d_out.clone()
    if bug == "stale_d":
        written[..., d_out.shape[-1] // 2:] = 0
    d = (written * out).sum(-1, keepdim=True)
    dp = d_out @ v.transpose(-1, -2)
    ds = p * (dp - d)
    return tuple(t.to(dtype) for t in (ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ d_out))


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_the_backward_sweep_passes_an_honest_backward_and_fails_a_stale_d(fmt):
    honest = sharpcheck.sweep(flash_backward, "attention_backward", format=fmt, features={"causal"})
    assert honest.passed, str(honest)
    assert len(honest.results) >= 5
    stale = sharpcheck.sweep(lambda *a, **kw: flash_backward(*a, bug="stale_d", **kw), "attention_backward",
                             format=fmt, features={"causal"})
    assert len(stale.failures) == len(stale.results), str(stale)  # every problem shows it


def test_exact_probes_are_cases_and_catch_a_row_sum_that_drops_a_key():
    probes = [c for c in sharpcheck.cases("attention", format="fp32", sizes=(64,)) if "probe" in c.id]
    assert {c.id for c in probes} == {"python:attention:fp32/attention_probe_constant_v/n=64",
                                      "python:attention:fp32/attention_probe_zero_q/n=64"}
    ones = next(c for c in probes if "constant_v" in c.id)
    assert bool((ones.args[2] == 3).all())

    def short_row_sum(q, k, v, scale):  # the denominator summed over all keys but the last
        p = torch.exp((q @ k.transpose(-1, -2)) * scale)
        return (p @ v) / p[..., :-1].sum(-1, keepdim=True)

    report = sharpcheck.sweep(short_row_sum, "attention", format="fp32", sizes=(64,), match="probe")
    assert any("probe_constant_v" in r.id for r in report.failures), str(report)
    assert sharpcheck.sweep(attention, "attention", format="fp32", sizes=(64,), match="probe").passed


def test_a_kernel_returning_out_and_lse_has_both_judged():
    def with_lse(q, k, v, scale):
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)

    assert sharpcheck.sweep(with_lse, "attention", format="fp32", sizes=(64,), match="attention_normal").passed
    off = sharpcheck.sweep(lambda *a, **kw: (with_lse(*a, **kw)[0], with_lse(*a, **kw)[1] + 1e-3), "attention",
                           format="fp32", sizes=(64,), match="attention_normal")
    assert len(off.failures) == len(off.results)  # an LSE off by 1e-3 fails every case


def test_a_kernel_writing_into_its_inputs_is_judged_against_the_untouched_inputs():
    def scale_twice(q, k, v, scale):  # q scaled in place, then scaled again by the attention
        q.mul_(scale)
        return attention(q, k, v, scale)

    def constant_v(q, k, v, scale):  # V overwritten with 3: the output is 3 everywhere
        v.fill_(3.0)
        return attention(q, k, v, scale)

    for kernel in (scale_twice, constant_v):
        report = sharpcheck.sweep(kernel, "attention", format="fp32", sizes=(64,), match="attention_normal")
        assert len(report.failures) == len(report.results), str(report)


def test_a_result_in_another_format_than_asked_is_an_error_unless_declared():
    bf16_out = lambda x: torch.softmax(x.float(), -1).bfloat16()  # noqa: E731
    report = sharpcheck.sweep(bf16_out, "softmax", format="fp32", sizes=(64,))
    assert {r.status for r in report.results} == {"error"} and "bf16 where fp32 was asked" in str(report)
    fp32_out = lambda q, k, v, scale: attention(q, k, v, scale).float()  # noqa: E731 - bf16 in, fp32 out
    assert sharpcheck.sweep(fp32_out, "attention", format="bf16", output_format="fp32", sizes=(64,),
                            match="attention_normal").passed


def test_sizes_and_seeds_are_checked():
    for sizes, kind in (("16", TypeError), ([16.5], ValueError), ([0], ValueError), ([1 << 40], ValueError)):
        with pytest.raises(kind):
            sharpcheck.cases("softmax", sizes=sizes)
    with pytest.raises(ValueError, match="seed"):
        sharpcheck.cases("softmax", seed=-1)
    assert len(sharpcheck.cases("softmax", sizes=[17, 17])) == len(sharpcheck.cases("softmax", sizes=[17]))


def test_tf32_sweeps_take_float32_results_and_an_id_reruns_alone_and_fp8_is_refused():
    assert sharpcheck.sweep(lambda x: torch.softmax(x, -1), "softmax", format="tf32", sizes=(16,)).passed
    one = sharpcheck.cases("softmax", match="python:softmax:fp32/random_normal/n=16")
    assert [c.id for c in one] == ["python:softmax:fp32/random_normal/n=16"]  # not n=16384 too
    assert sharpcheck.cases("attention", features={"causal", "theta"}, sizes=(16,))  # theta: another op's feature
    with pytest.raises(ValueError, match="fp8"):
        sharpcheck.cases("softmax", format="fp8_e4m3")


def _autograd(forward):
    def kernel(logits, dy, **options):
        x = logits.double().requires_grad_()
        forward(x).backward(dy.double())
        return x.grad.to(logits.dtype)
    return kernel


def _ssmax(logits, theta=1.0, **options):
    n = logits.shape[-1] - int(torch.isinf(logits).sum())  # n counts the keys a row sees
    return torch.softmax(logits.double() * math.log(n) / theta, -1).to(logits.dtype)


def _linear(q, k, v, causal=False):
    phi_q, phi_k = torch.nn.functional.elu(q.double()) + 1, torch.nn.functional.elu(k.double()) + 1
    w = phi_q @ phi_k.T
    w = torch.tril(w) if causal else w
    return ((w / w.sum(-1, keepdim=True)) @ v.double()).to(q.dtype)


def _differential(logits, logits2, **options):  # "lambda" is a Python keyword: it comes in options
    return (torch.softmax(logits.double(), -1) - options["lambda"] * torch.softmax(logits2.double(), -1)).to(logits.dtype)


@pytest.mark.parametrize("op, kernel", [
    ("softmax_backward", _autograd(lambda x: torch.softmax(x, -1))),
    ("log_softmax_backward", _autograd(lambda x: torch.log_softmax(x, -1))),
    ("scalable_softmax", _ssmax),
    ("linear_attention", _linear),
    ("differential_attention", _differential),
])
def test_every_operation_is_swept_for_a_python_kernel(op, kernel):
    """The sweeps issue 31's operations gained: autograd's backward, SSMax, linear and Differential
    attention written in torch pass every case; each twin below fails."""
    report = sharpcheck.sweep(kernel, op, format="fp32", sizes=[16, 256], features={"theta", "causal"})
    assert report.passed, str(report)
    assert len(report.results) >= 2


def test_the_new_sweeps_catch_their_twins():
    forgot_the_sum = lambda logits, dy, **o: (torch.softmax(logits.double(), -1) * dy.double()).to(logits.dtype)  # noqa: E731
    assert not sharpcheck.sweep(forgot_the_sum, "softmax_backward", format="fp32", sizes=[16]).passed
    no_log_n = lambda logits, theta=1.0, **o: torch.softmax(logits.double() / theta, -1).to(logits.dtype)  # noqa: E731
    assert not sharpcheck.sweep(no_log_n, "scalable_softmax", format="fp32", sizes=[16], features={"theta"}).passed
    unnormalised = lambda q, k, v, causal=False: ((torch.nn.functional.elu(q.double()) + 1)  # noqa: E731
                                                  @ (torch.nn.functional.elu(k.double()) + 1).T @ v.double()).to(q.dtype)
    assert not sharpcheck.sweep(unnormalised, "linear_attention", format="fp32", features={"causal"}).passed


def test_probes_are_the_exact_cases_alone():
    """sharpcheck.probes: V constant and Q zero, whose references are exact. A kernel dividing by its
    neighbour row's sum fails the first (rows differ) and passes the second (every row sums to n)."""
    def attention(q, k, v, scale=None, **options):
        return (torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, -1) @ v.float()).to(q.dtype)

    def neighbour_row_sum(q, k, v, scale=None, **options):
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        w = torch.exp(s - s.amax(-1, keepdim=True))
        return ((w @ v.float()) / torch.roll(w.sum(-1, keepdim=True), 1, dims=-2)).to(q.dtype)

    honest = sharpcheck.probes(attention, "attention", format="bf16", sizes=[64])
    assert honest.passed and len(honest.results) == 2 and all("probe" in r.id for r in honest.results)
    broken = sharpcheck.probes(neighbour_row_sum, "attention", format="bf16", sizes=[64])
    assert [r.status for r in broken.results] == ["fail", "pass"], broken.counts()
    with pytest.raises(ValueError, match="probe"):
        sharpcheck.probes(attention, "softmax", sizes=[64])
