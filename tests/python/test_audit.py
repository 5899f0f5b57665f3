"""sharpcheck.audit_tolerance (issue 34): a user's check run on canonical wrong outputs and on honest
ones. A check that passes everything lets every wrong output through; one that fails everything
rejects every honest output; sharpcheck's own column and the peers' rules are reported beside."""

import pytest
import torch

import sharpcheck


def test_a_check_that_always_passes_lets_every_wrong_output_through():
    audit = sharpcheck.audit_tolerance("softmax", lambda actual, expected: True)
    assert audit.caught == [] and audit.honest_rejected == []
    assert set(audit.passed_wrong) == {"uniform", "half_scaled", "neighbouring_row", "bf16_accumulation",
                                       "no_max_subtraction", "ignored_temperature"}


def test_a_check_that_always_fails_rejects_every_honest_output():
    def never(actual, expected):
        raise AssertionError("never")

    audit = sharpcheck.audit_tolerance("softmax", never, format="fp32")
    assert audit.passed_wrong == []
    assert len(audit.honest_rejected) == 6  # three problems, two honest outputs each


def test_assert_close_loose_tolerances_miss_wrong_attention_outputs_that_sharpcheck_catches():
    audit = sharpcheck.audit_tolerance("attention", atol=2e-2, rtol=2e-2)
    assert audit.honest_rejected == []
    assert "dropped_sink" in audit.passed_wrong  # the sinks' ~2% of the weight moves each element < 2e-2
    assert "dropped_sink" not in audit.sharpcheck_missed
    assert {"half_scaled", "zeros", "gqa_by_modulo", "swapped_causal_alignment"} <= set(audit.caught)
    assert audit.sharpcheck_rejected_honest == []
    # sharpcheck's default (no recipe named, no LSE) catches every wrong output, a denominator summed
    # in bf16 and a P rounded to e4m3 included: the math path's recipe, which the default also tries,
    # emulates its scores instead of charging their roundings as noise (docs/verdicts.md).
    assert audit.sharpcheck_missed == []
    table = str(audit)
    assert "| dropped_sink (wrong) |" in table and "passes (!)" in table


def test_a_check_returning_false_or_raising_another_error_rejects_and_inputs_reach_a_three_argument_check():
    seen = []

    def check(actual, expected, inputs):
        seen.append(sorted(inputs))
        return False

    audit = sharpcheck.audit_tolerance("softmax", check, format="fp32")
    assert audit.passed_wrong == [] and len(audit.honest_rejected) == 6
    assert ["logits"] in seen and ["logits", "theta"] in seen
    with pytest.raises(ValueError, match="ZeroDivisionError"):  # a broken check is not a false alarm
        sharpcheck.audit_tolerance("softmax", lambda a, e: 1 / 0, format="fp32")


def test_a_check_cannot_change_sharpchecks_column_and_keyword_tolerances_stay_keywords():
    def vandal(actual, expected, inputs):
        actual.copy_(expected.to(actual.dtype))  # would make every wrong output the right one
        inputs["logits"].zero_()
        return True

    audit = sharpcheck.audit_tolerance("softmax", vandal, format="fp32")
    assert len(audit.sharpcheck_missed) == 0 and audit.sharpcheck_rejected_honest == []

    def close(actual, expected, *, rtol=1e-2):
        return torch.allclose(actual.double(), expected, rtol=rtol, atol=1e-3)

    keyword = sharpcheck.audit_tolerance("softmax", close)
    assert keyword.honest_rejected == [] and "half_scaled" in keyword.caught


def test_cosine_and_rmse_budgets_are_checks_too():
    cosine = sharpcheck.audit_tolerance("softmax", cosine=0.999)
    assert "half_scaled" in cosine.passed_wrong  # cosine similarity cannot see a scale
    rmse = sharpcheck.audit_tolerance("softmax", rmse=1e-3)
    assert "bf16_accumulation" in rmse.passed_wrong  # rows off by ~1% move weights of 1/2048 by 5e-6


def test_misuse_is_refused_by_name():
    with pytest.raises(ValueError, match="exactly one"):
        sharpcheck.audit_tolerance("softmax")
    with pytest.raises(ValueError, match="exactly one"):
        sharpcheck.audit_tolerance("softmax", lambda a, e: True, atol=1e-3)
    with pytest.raises(ValueError, match="op must be"):
        sharpcheck.audit_tolerance("linear_attention", atol=1e-3)
    with pytest.raises(ValueError, match="format"):
        sharpcheck.audit_tolerance("softmax", atol=1e-3, format="fp8_e4m3")
