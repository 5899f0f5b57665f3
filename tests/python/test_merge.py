"""attention_merge (issue 35): partial states (o_i, lse_i) of a split-KV or cascade kernel merged
as o = sum_i exp(lse_i - L) o_i, L = logsumexp lse_i, judged against the correctly rounded merge
(the one-query attention it is). Honest merges pass, in both layouts, bf16 storage and with empty
partials; the bug classes the serving peers filed fail."""

import math

import numpy as np
import pytest
import torch

import sharpcheck

TOKENS, HEADS, KEYS, DIM, SPLITS = 8, 2, 256, 32, 4


def partials(seed=1, lse_shift=0.0):
    """Partial states from a real split of attention: each chunk's correctly rounded fp32 output and
    LSE, as [T, S, H, D] and [T, S, H] (FlashInfer's merge_states layout)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, HEADS, n, DIM, generator=g) for n in (TOKENS, KEYS, KEYS))
    chunk = KEYS // SPLITS
    outs, lses = [], []
    for c in range(SPLITS):
        o, lse = sharpcheck.attention(q, k[:, :, c * chunk:(c + 1) * chunk], v[:, :, c * chunk:(c + 1) * chunk],
                                      return_lse=True, format="fp32")
        outs.append(o[0].permute(1, 0, 2))
        lses.append(lse[0].permute(1, 0) + lse_shift)
    return torch.stack(outs, 1), torch.stack(lses, 1), (q, k, v)


def merge(po, pl, *, bug=""):
    """A merge kernel as vLLM's or FlashInfer's computes it (fp32), with a bug class when named."""
    pl = pl.float()
    if bug == "max_not_logsumexp":
        big = pl.amax(1)
    else:
        big = pl.amax(1)
        big = big + torch.log(torch.exp(pl - big[:, None]).nan_to_num(0.0).sum(1))
    if bug == "fixed_max":
        w = torch.exp(pl) / torch.exp(pl).sum(1, keepdim=True)  # no max subtracted: overflows past 88
    else:
        w = torch.exp(pl - big[:, None])
    if bug != "nan_on_empty":
        w = w.nan_to_num(0.0)
        po = torch.where(torch.isinf(pl)[..., None], torch.zeros_like(po), po)
    out = (w[..., None] * po.float()).sum(1)
    if bug == "wrong_lse_slot":
        big = big.flip(1)
    return out, big


def test_an_honest_merge_passes_and_equals_the_unsplit_attention():
    po, pl, (q, k, v) = partials()
    out, lse = merge(po, pl)
    assert sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, lse=lse).passed
    full, full_lse = sharpcheck.attention(q, k, v, return_lse=True, format="fp32")
    assert (full[0].permute(1, 0, 2) - out).abs().max() < 1e-6  # the end-to-end identity, to fp32 merging
    assert (full_lse[0].permute(1, 0) - lse).abs().max() < 1e-5


@pytest.mark.parametrize("bug", ["max_not_logsumexp", "wrong_lse_slot"])
def test_merge_twins_fail(bug):
    po, pl, _ = partials()
    out, lse = merge(po, pl, bug=bug)
    with pytest.raises(AssertionError):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, lse=lse)


def test_a_fixed_max_merge_overflows_where_the_partials_lse_are_large():
    po, pl, _ = partials(lse_shift=90.0)  # LSEs of 90 and more: exp overflows fp32
    honest, lse = merge(po, pl)
    assert sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=honest, lse=lse).passed
    out, _ = merge(po, pl, bug="fixed_max")  # inf / inf: every weight NaN, zeroed as a kernel's guard does
    with pytest.raises(AssertionError, match=r"out at index \(\d+, \d+, \d+\)"):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, lse=lse)


def test_empty_partials_are_ignored_and_nan_from_two_empty_partials_fails():
    po, pl, _ = partials()
    pl[0, :, :] = -math.inf  # token 0: every partial empty (o = 0, L = -inf)
    pl[1, 2, :] = -math.inf  # token 1: one partial empty
    po[0] = float("nan")      # an empty partial's output is garbage and must not be read
    po[1, 2] = float("nan")
    out, lse = merge(po, pl)
    assert out[0].abs().max() == 0 and torch.isinf(lse[0]).all()
    assert sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, lse=lse).passed
    bad, _ = merge(po, pl, bug="nan_on_empty")
    with pytest.raises(AssertionError):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=bad, lse=lse)


def test_plus_infinity_marks_empty_only_when_asked_and_nan_is_refused_by_element():
    po, pl, _ = partials()
    out, lse = merge(po, pl)
    marked = pl.clone()
    marked[3, 1, 0] = math.inf
    with pytest.raises(ValueError, match=r"partial_lse at \[3, 1, 0\] is \+inf"):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=marked, out=out, lse=lse)
    ref_pl = marked.clone()
    ref_pl[3, 1, 0] = -math.inf
    out2, lse2 = merge(po, ref_pl)
    assert sharpcheck.judge("attention_merge", partial_out=po, partial_lse=marked, out=out2, lse=lse2,
                            empty="any_inf").passed
    marked[2, 0, 1] = float("nan")
    with pytest.raises(ValueError, match=r"partial_lse at \[2, 0, 1\] is NaN"):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=marked, out=out, lse=lse, empty="any_inf")


def test_splits_first_layout_base_2_and_bf16_storage():
    po, pl, _ = partials()
    out, lse = merge(po, pl)
    first = sharpcheck.judge("attention_merge", partial_out=po.transpose(0, 1), partial_lse=pl.transpose(0, 1),
                             out=out, lse=lse, layout="sthd")
    assert first.passed
    with pytest.raises(AssertionError):  # the same memory read as the other layout is wrong
        sharpcheck.judge("attention_merge", partial_out=po.transpose(0, 1).contiguous().view(po.shape),
                         partial_lse=pl.transpose(0, 1).contiguous().view(pl.shape), out=out, lse=lse)
    base2 = pl.double() / math.log(2)
    out2, lse2 = merge(po, base2 * math.log(2))
    assert sharpcheck.judge("attention_merge", partial_out=po, partial_lse=base2, out=out2,
                            lse=lse2.double() / math.log(2), lse_base2=True).passed
    with pytest.raises(AssertionError):  # a base-e LSE handed back where base 2 is declared
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=base2, out=out2, lse=lse2, lse_base2=True)
    pb = po.bfloat16()
    outb, lseb = merge(pb, pl)
    assert sharpcheck.judge("attention_merge", partial_out=pb, partial_lse=pl, out=outb.bfloat16(), lse=lseb).passed


def test_shapes_that_disagree_are_refused_by_name():
    po, pl, _ = partials()
    out, lse = merge(po, pl)
    with pytest.raises(ValueError, match="partial_lse must be"):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl[:, :3], out=out)
    with pytest.raises(ValueError, match="out must be"):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out[:, :1])
    with pytest.raises(ValueError, match="layout wants"):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, layout="bhsd")


def test_the_merge_sweep_passes_an_honest_merge_and_fails_the_twins_where_they_break():
    def honest(partial_out, partial_lse):
        out, lse = merge(partial_out, partial_lse)
        return out.to(partial_out.dtype), lse  # the output in the partials' format, the LSE in fp32

    report = sharpcheck.sweep(honest, "attention_merge", format="fp32")
    assert report.passed, str(report)
    ids = {r.id for r in report.results}
    assert "python:attention_merge:fp32/merge_splits_133/n=1064" in ids and len(ids) == 7
    assert "python:attention_merge:fp32/merge_probe_identical_partials/n=1064" in ids
    assert sharpcheck.sweep(honest, "attention_merge", format="bf16").passed
    nan_on_empty = sharpcheck.sweep(lambda po, pl: merge(po, pl, bug="nan_on_empty"), "attention_merge")
    assert {r.id.split("/")[1] for r in nan_on_empty.failures} == {"merge_empty_partials"}
    fixed_max = sharpcheck.sweep(lambda po, pl: merge(po, pl, bug="fixed_max"), "attention_merge")
    assert "merge_large_lse" in {r.id.split("/")[1] for r in fixed_max.failures}
    wrong_slot = sharpcheck.sweep(lambda po, pl: merge(po, pl, bug="wrong_lse_slot"), "attention_merge")
    assert len(wrong_slot.failures) == 7


def test_a_nan_in_a_partial_that_is_not_empty_is_named_in_the_users_order():
    po, pl, _ = partials()
    out, lse = merge(po, pl)
    po[2, 0, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"partial_out at \[2, 0, 1, 3\] is NaN"):
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, lse=lse)
    with pytest.raises(ValueError, match=r"partial_out at \[0, 2, 1, 3\] is NaN"):
        sharpcheck.judge("attention_merge", partial_out=po.transpose(0, 1), partial_lse=pl.transpose(0, 1),
                         out=out, lse=lse, layout="sthd")


def test_a_bf16_merged_lse_is_judged_in_bf16():
    po, pl, _ = partials()
    out, lse = merge(po, pl)
    report = sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, lse=lse.bfloat16())
    assert report.passed and any("bf16" in note for note in report.notes)
    with pytest.raises(AssertionError):  # an LSE off by about five bf16 steps
        sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out,
                         lse=(lse * (1 + 2 ** -5)).bfloat16())


def test_compare_names_the_worst_element_in_the_users_shape(tmp_path):
    import json
    import os
    import subprocess

    import numpy as np

    program = os.environ.get("SHARPCHECK_PROGRAM")
    if not program:
        pytest.skip("SHARPCHECK_PROGRAM is set by ctest")
    po, pl, _ = partials()
    out, lse = merge(po, pl)
    out[2, 1, 5] += 0.5
    for name, array in (("po", po), ("pl", pl), ("out", out), ("lse", lse)):
        np.save(tmp_path / f"{name}.npy", array.numpy())
    report = tmp_path / "r.json"
    subprocess.run([program, "compare", "--op", "attention_merge", f"partial_out={tmp_path / 'po.npy'}",
                    f"partial_lse={tmp_path / 'pl.npy'}", f"out={tmp_path / 'out.npy'}",
                    f"lse={tmp_path / 'lse.npy'}", "--json", str(report)], check=False, capture_output=True)
    worst = json.loads(report.read_text())["cases"][0]["worst"]
    assert worst["full_index"] == [2, 1, 5]


def test_a_base_2_merge_is_correctly_rounded_with_the_real_ln_2():
    """Base-2 partials are scores of lse_i ln 2 with the real ln 2 (it entered rounded to a double, so
    two partials of -1 merged to a log-sum-exp of about 2^-55 instead of 0). Against mpmath at 200
    bits: the correctly rounded fp32 output and base-2 LSE, handed over as the kernel's, are 0 ulps
    off (a 1-ulp change is seen)."""
    import mpmath
    mpmath.mp.prec = 200
    rng = np.random.default_rng(3)
    cases = [np.array([[[-1.0]], [[-1.0]]]), rng.normal(0, 4, (3, 1, 1)), np.array([[[0.0]], [[1.0]], [[3.0]]])]
    for partial in cases:  # [splits, heads = 1, 1] base-2 LSEs; one token
        splits = partial.shape[0]
        po = rng.normal(0, 1, (1, splits, 1, 4)).astype(np.float32)
        pl = partial.reshape(1, splits, 1)
        weights = [mpmath.mpf(2) ** mpmath.mpf(float(l)) for l in pl.ravel()]
        total = sum(weights)
        out = np.array([[[float(np.float32(float(sum(w * mpmath.mpf(float(po[0, s, 0, c]))
                                                     for s, w in enumerate(weights)) / total)))
                          for c in range(4)]]], dtype=np.float32)
        lse = np.array([[float(np.float32(float(mpmath.log(total, 2))))]], dtype=np.float32)
        report = sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out, lse=lse,
                                  lse_base2=True)
        assert report.passed and report.record["max_ulps"] == 0, (partial.ravel(), report.record["worst"])
        if splits == 2:  # two partials of -1: the merged base-2 LSE is 0 exactly
            assert lse[0, 0] == 0
            off = sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=out,
                                   lse=np.nextafter(lse, np.float32(1)), lse_base2=True)
            assert off.record["max_ulps"] >= 1


def test_a_base_2_merge_on_a_rational_midpoint_is_rounded_not_refused():
    """Partials of base-2 LSE 0, -1, -1 weigh 1/2, 1/4, 1/4 (rational, as every integer spacing of
    base-2 LSEs makes them): outputs 1, 2^-24, 2^-24 merge to 1/2 + 2^-25, fp32's midpoint of 1/2 and
    its successor, rounded to even (1/2); the merged LSE is log2 2 = 1. Refused (undecided at 131072
    bits) once ln 2 was exact and before the exact base-2 case."""
    po = np.zeros((1, 3, 1, 1), np.float32)
    po[0, :, 0, 0] = [1.0, 2.0**-24, 2.0**-24]
    pl = np.array([[[0.0], [-1.0], [-1.0]]])
    report = sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl, out=np.array([[[0.5]]], np.float32),
                              lse=np.array([[1.0]], np.float32), lse_base2=True)
    assert report.passed and report.record["max_ulps"] == 0
    off = sharpcheck.judge("attention_merge", partial_out=po, partial_lse=pl,
                           out=np.array([[[np.nextafter(np.float32(0.5), np.float32(1))]]], np.float32),
                           lse=np.array([[1.0]], np.float32), lse_base2=True)
    assert off.record["max_ulps"] == 1
