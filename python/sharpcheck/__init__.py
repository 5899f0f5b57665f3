"""sharpcheck from Python: softmax and attention outputs (NumPy, PyTorch, JAX, anything with DLPack
or the buffer protocol) judged against the correctly rounded reference.

    import sharpcheck
    y = torch.softmax(x, dim=-1)
    sharpcheck.assert_softmax_close(y, x)          # AssertionError naming the worst element

References (every value the exact result rounded once to the format): softmax, log_softmax,
logsumexp, entropy, attention, and the backward softmax_backward, log_softmax_backward. Asserts: assert_softmax_close, assert_log_softmax_close,
assert_attention_close, each returning a Report; any operation of sharpcheck.ops() (softmax and
its backward, attention and its backward, the escapes) by sharpcheck.judge(op, **tensors_and_options).
The gate's stress sweep for a kernel written in Python: sharpcheck.sweep(kernel, op, format=...,
features=...) and, for pytest.mark.parametrize, sharpcheck.cases(op, ...). Can your own test fail?
sharpcheck.audit_tolerance(op, check or atol=/rtol=/cosine=/rmse=) lists the canonical wrong
outputs it lets through. pytest: `-p sharpcheck.pytest_plugin
--sharpcheck-report FILE` writes every check of a run as the gate's JSON report.
"""

from ._sharpcheck import UndecidedRounding
from ._arrays import FORMATS
from ._references import (attention, attention_backward, entropy, log_softmax, log_softmax_backward, logsumexp,
                          softmax, softmax_backward)
from ._asserts import (Report, assert_attention_backward_close, assert_attention_close, assert_log_softmax_close,
                       assert_softmax_close, judge, ops)
from ._sweep import Case, SweepReport, SweepResult, cases, probes, sweep
from ._audit import AuditEntry, AuditReport, audit_tolerance
from ._invariance import Difference, InvarianceReport, batch_invariance

__all__ = [
    "AuditEntry",
    "AuditReport",
    "Case",
    "Difference",
    "FORMATS",
    "InvarianceReport",
    "Report",
    "SweepReport",
    "SweepResult",
    "UndecidedRounding",
    "assert_attention_backward_close",
    "assert_attention_close",
    "assert_log_softmax_close",
    "assert_softmax_close",
    "attention",
    "attention_backward",
    "audit_tolerance",
    "batch_invariance",
    "cases",
    "entropy",
    "judge",
    "log_softmax",
    "log_softmax_backward",
    "logsumexp",
    "ops",
    "softmax",
    "softmax_backward",
    "probes",
    "sweep",
]
