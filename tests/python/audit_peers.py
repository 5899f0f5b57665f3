"""The table of docs/verdicts.md "Can your test fail?": sharpcheck.audit_tolerance on the checks
kernel engineers use (torch.testing.assert_close with bf16 defaults, atol = rtol = 1e-2,
FlashAttention's 2x rule against a bf16 PyTorch computation), bf16 attention and softmax, beside
sharpcheck's own verdict. Prints a Markdown table; exits 1 if any check rejects an honest output
that sharpcheck passes while claiming to be the peers' rule (a broken harness), never on findings."""

import math
import sys

import torch

import sharpcheck
from sharpcheck._audit import _masked


def assert_close_bf16_defaults(actual, expected):
    torch.testing.assert_close(actual, expected.to(actual.dtype))  # bf16: rtol 1.6e-2, atol 1e-5


def flash_attention_2x(actual, expected, inputs):
    """FlashAttention's tests: max |out - ref| <= 2 max |out_pt - ref| (+ 1e-5), ref the fp32 (here
    fp64) result and out_pt PyTorch's computation in the inputs' precision."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    index = torch.arange(q.shape[1]) // (q.shape[1] // k.shape[1])
    k, v = k[:, index], v[:, index]
    s = (q @ k.transpose(-1, -2)) * inputs["scale"]
    if inputs.get("softcap"):
        s = (inputs["softcap"] * torch.tanh(s.float() / inputs["softcap"])).to(q.dtype)
    s = s.masked_fill(_masked(s.shape[-2], s.shape[-1], inputs), -math.inf)
    if inputs.get("sinks") is not None:
        s = torch.cat([s, inputs["sinks"].to(s.dtype).view(1, -1, 1, 1).expand(s.shape[:-1] + (1,))], -1)
    p = torch.softmax(s.float(), -1).to(q.dtype)
    if inputs.get("sinks") is not None:
        p = p[..., :-1]
    reference_error = ((p @ v).double() - expected).abs().max().item()
    return (actual.double() - expected).abs().max().item() <= 2 * reference_error + 1e-5


def softmax_2x(actual, expected, inputs):
    logits = inputs["logits"]
    reference_error = (torch.softmax(logits / inputs.get("theta", 1.0), -1).double() - expected).abs().max().item()
    return (actual.double() - expected).abs().max().item() <= 2 * reference_error + 1e-5


def main() -> int:
    rows = []
    for op, checks in (("attention", [("assert_close, bf16 defaults", {"check": assert_close_bf16_defaults}),
                                      ("atol = rtol = 1e-2", {"atol": 1e-2, "rtol": 1e-2}),
                                      ("FlashAttention 2x", {"check": flash_attention_2x})]),
                       ("softmax", [("assert_close, bf16 defaults", {"check": assert_close_bf16_defaults}),
                                    ("atol = rtol = 1e-2", {"atol": 1e-2, "rtol": 1e-2}),
                                    ("FlashAttention 2x", {"check": softmax_2x})])):
        audits = [(name, sharpcheck.audit_tolerance(op, format="bf16", **kw)) for name, kw in checks]
        entries = audits[0][1].entries
        print(f"\n{op}, bf16 (the audit's problems, seed 0)\n")
        print("| output | " + " | ".join(name for name, _ in audits) + " | sharpcheck (default) |")
        print("|---|" + "---|" * (len(audits) + 1))
        for i, entry in enumerate(entries):
            kind = "honest" if entry.honest else "wrong"
            cells = []
            for _, audit in audits + [("sharpcheck", None)]:
                passed = audit.entries[i].check_passed if audit else entry.sharpcheck_passed
                verdict = "pass" if passed else "fail"
                cells.append(f"**{verdict}**" if passed == (not entry.honest) else verdict)
            print(f"| {entry.name} ({kind}) | " + " | ".join(cells) + " |")
        for name, audit in audits:
            rows.append((op, name, len(audit.passed_wrong), len(audit.honest_rejected)))
    print("\n| op | check | wrong outputs it passes | honest outputs it fails |\n|---|---|---|---|")
    for op, name, passed_wrong, rejected in rows:
        print(f"| {op} | {name} | {passed_wrong} | {rejected} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
