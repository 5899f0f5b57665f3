"""Can your test fail? sharpcheck.audit_tolerance runs a user's own check (a callable, or atol/rtol,
a cosine-similarity threshold, an RMSE budget) on a catalogue of canonical wrong outputs computed
from realistic inputs, and reports which of them the check lets through, beside what sharpcheck's
own judge catches; and on honest outputs, which the check must let through (issue 34).

    audit = sharpcheck.audit_tolerance("attention", atol=1e-2, rtol=1e-2)
    audit.passed_wrong      # ['half_scaled'?, 'window_off_by_one', ...]: wrong outputs your check passes
    audit.caught            # those it fails
    audit.honest_rejected   # honest outputs it fails (false alarms)
    print(audit)            # the table

Every wrong output is a bug class real ports had. Those that change the problem (a swapped causal
alignment, a dropped sink, a window off by one, GQA by modulo, an ignored soft-cap) are the
correctly rounded answer of the wrong problem, so nothing but the bug separates them from the
truth; the arithmetic ones (a bf16 denominator, a skipped rescale, P in fp8) are computed in torch
the way a kernel computes them. The golden a check is handed is the correctly rounded result in
fp64 (as `expected`), the output under test in the inputs' format (as `actual`)."""

import inspect
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _references
from ._asserts import assert_attention_close, assert_softmax_close


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------------------------------------
# The user's check as one callable: (actual, expected, inputs) -> passed?


def _user_check(check: Optional[Callable[..., Any]], atol: Optional[float], rtol: Optional[float],
                cosine: Optional[float], rmse: Optional[float]) -> Tuple[str, Callable[..., bool]]:
    given = [name for name, value in (("check", check), ("atol/rtol", atol if atol is not None else rtol),
                                       ("cosine", cosine), ("rmse", rmse)) if value is not None]
    if len(given) != 1:
        raise ValueError("audit_tolerance: give exactly one of check=, atol=/rtol=, cosine=, rmse= "
                         f"(got {given or 'none'})")
    torch = _torch()
    if check is not None:
        # inputs are passed only to a check whose third positional parameter has no default (or
        # that takes *args): a keyword-only or defaulted tolerance is never filled by accident.
        parameters = inspect.signature(check).parameters.values()
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                      and p.default is p.empty]
        takes_inputs = len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in parameters)

        def run(actual, expected, inputs):
            # Copies: a check that writes into what it is given cannot change sharpcheck's column.
            actual, expected = actual.clone(), expected.clone()
            inputs = {key: (value.clone() if hasattr(value, "clone") else value) for key, value in inputs.items()}
            result = check(actual, expected, inputs) if takes_inputs else check(actual, expected)
            if result is None:
                return True
            if hasattr(result, "all") and hasattr(result, "shape") and getattr(result, "shape", ()) != ():
                raise TypeError("the check returned an array; return a bool (or raise AssertionError)")
            return bool(result)

        return getattr(check, "__name__", "check"), run
    if cosine is not None:
        def run(actual, expected, inputs):
            a, e = actual.double().flatten(), expected.double().flatten()
            value = torch.nn.functional.cosine_similarity(a, e, dim=0).item()
            return math.isfinite(value) and value >= cosine

        return f"cosine >= {cosine}", run
    if rmse is not None:
        def run(actual, expected, inputs):
            value = (actual.double() - expected.double()).pow(2).mean().sqrt().item()
            return math.isfinite(value) and value <= rmse

        return f"rmse <= {rmse}", run
    atol_value, rtol_value = float(atol or 0.0), float(rtol or 0.0)

    def run(actual, expected, inputs):
        torch.testing.assert_close(actual.double(), expected.double(), atol=atol_value, rtol=rtol_value)
        return True

    return f"assert_close(atol={atol_value:g}, rtol={rtol_value:g})", run


def _verdict(run: Callable[..., bool], actual, expected, inputs, honest: bool) -> Tuple[bool, str]:
    """(passed, why not): an AssertionError or False is a rejection. Any other exception on a wrong
    output rejects it too (a check may break on NaN); on an honest output it means the check itself
    is broken, and is raised rather than counted as a false alarm."""
    try:
        return (True, "") if run(actual, expected, inputs) else (False, "returned False")
    except AssertionError as failure:
        first = str(failure).strip().splitlines()
        return False, first[0] if first else "AssertionError"
    except Exception as error:  # noqa: BLE001 - a check that breaks on a wrong output rejects it
        if honest:
            raise ValueError(f"audit_tolerance: the check raised {type(error).__name__} on an honest output "
                             f"(the correctly rounded result or an honest kernel's): {error}") from error
        return False, f"{type(error).__name__}: {error}"


# ---------------------------------------------------------------------------------------------
# Attention: problems, honest kernels and the catalogue of wrong outputs.


def _round_e4m3(x):
    """x rounded to fp8 e4m3 (nearest-even on the 3-bit mantissa, subnormal step 2^-9, 448 max)."""
    torch = _torch()
    x = x.double()
    exponent = torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -9))).clamp_min(-6)
    step = torch.pow(2.0, exponent - 3)
    return (torch.round(x / step) * step).clamp(-448, 448).float()


def _flash(q, k, v, options, *, p_format=None, denominator=None, skip_rescale=False, block=64):
    """FlashAttention-2's forward as a user writes it in torch: fp32 arithmetic, key blocks with a
    running max, P rounded to the inputs' format (or by `p_format`) before P V, the row sum of the
    fp32 exponentials (or summed by `denominator`); skip_rescale forgets to rescale the accumulator
    when a later block raises the max."""
    torch = _torch()
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    heads, kv_heads = q.shape[1], k.shape[1]
    index = options.get("_kv_index", torch.arange(heads) // (heads // kv_heads))
    k, v = k[:, index], v[:, index]
    s = (q @ k.transpose(-1, -2)) * options["scale"]
    if options.get("softcap"):
        s = options["softcap"] * torch.tanh(s / options["softcap"])
    s = s.masked_fill(_masked(s.shape[-2], s.shape[-1], options), -math.inf)
    round_p = p_format or (lambda p: p.to(dtype).float())
    rows = s.shape[:-1]
    m = torch.full(rows + (1,), -math.inf)
    if options.get("sinks") is not None:
        m = options["sinks"].float().view(1, -1, 1, 1).expand(rows + (1,)).clone()
    l = torch.zeros(rows + (1,))
    if options.get("sinks") is not None:
        l = torch.ones(rows + (1,))
    acc = torch.zeros(rows + (v.shape[-1],))
    for start in range(0, s.shape[-1], block):
        tile = s[..., start:start + block]
        m_new = torch.maximum(m, tile.amax(-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        factor = torch.exp(m - safe)
        p = torch.exp(tile - safe)
        if not skip_rescale:
            acc = acc * factor
        l = l * factor + (denominator(p) if denominator else p.sum(-1, keepdim=True))
        acc = acc + round_p(p) @ v[..., start:start + block, :]
        m = m_new
    return (acc / l).nan_to_num(0.0).to(dtype)


def _bf16_sum(p):
    """A row sum accumulated in bf16, one key at a time (the denominator of a bf16-accumulating port)."""
    torch = _torch()
    total = torch.zeros(p.shape[:-1] + (1,), dtype=torch.bfloat16)
    for j in range(p.shape[-1]):
        total = total + p[..., j:j + 1].bfloat16()
    return total.float()


def _masked(rows: int, cols: int, options: Dict[str, Any]):
    torch = _torch()
    i = torch.arange(rows)[:, None]
    j = torch.arange(cols)[None, :]
    offset = cols - rows if options.get("align") == "bottom-right" else 0
    masked = torch.zeros(rows, cols, dtype=torch.bool)
    if options.get("causal"):
        masked |= j > i + offset
    window = options.get("window")
    if window is not None:
        masked |= j < i + offset - window[0]
    return masked


def _attention_problems(fmt: str, seed: int) -> Dict[str, Dict[str, Any]]:
    """Realistic inputs: 4 query heads over 2 KV heads (GQA), 64 queries, 256 keys, d = 64, normal
    entries in the format; each problem adds the feature its wrong outputs get wrong."""
    torch = _torch()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[fmt]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 64, 64, generator=g).to(dtype)
    k = torch.randn(1, 2, 256, 64, generator=g).to(dtype)
    v = torch.randn(1, 2, 256, 64, generator=g).to(dtype)
    plain = {"scale": 0.125}
    return {
        "plain": {"inputs": (q, k, v), "options": plain},
        "causal": {"inputs": (q, k, v), "options": {**plain, "causal": True, "align": "bottom-right"}},
        "sinks": {"inputs": (q, k, v), "options": {**plain, "sinks": torch.tensor([2.0, 0.5, 3.0, 1.0],
                                                                                   dtype=torch.float64)}},
        "window": {"inputs": (q, k, v), "options": {**plain, "causal": True, "align": "bottom-right",
                                                    "window": (63, 0)}},
        "softcap": {"inputs": ((q.float() * 6).to(dtype), k, v), "options": {**plain, "softcap": 30.0}},
    }


def _reference(q, k, v, options, fmt):
    public = {key: value for key, value in options.items() if not key.startswith("_")}
    return _references.attention(q, k, v, format=fmt, **public)


def _attention_catalogue(fmt: str, seed: int) -> List[Tuple[str, str, str, Callable[[], Any]]]:
    """(name, what it is, problem, the wrong output)."""
    torch = _torch()
    problems = _attention_problems(fmt, seed)

    def ref(problem, fmt_out=fmt, **changes):
        q, k, v = problems[problem]["inputs"]
        return _reference(q, k, v, {**problems[problem]["options"], **changes}, fmt_out)

    def flash(problem, **bugs):
        q, k, v = problems[problem]["inputs"]
        return _flash(q, k, v, problems[problem]["options"], **bugs)

    def modulo_gqa():
        q, k, v = problems["plain"]["inputs"]
        index = torch.arange(q.shape[1]) % k.shape[1]  # heads 0, 2 share KV head 0 instead of 0, 1
        return _reference(q, k[:, index], v[:, index], problems["plain"]["options"], fmt)

    wrong = [
        ("constant", "every element the output's mean", "plain", lambda: torch.full_like(ref("plain"),
                                                                                          ref("plain").double().mean().item())),
        ("half_scaled", "the output times 0.5", "plain", lambda: ref("plain") * 0.5),
        ("neighbouring_row", "each query given the next query's output", "plain",
         lambda: ref("plain").roll(1, dims=-2)),
        ("zeros", "an output never written (zeros)", "plain", lambda: torch.zeros_like(ref("plain"))),
        ("bf16_denominator", "the softmax denominator accumulated in bf16", "plain",
         lambda: flash("plain", denominator=_bf16_sum)),
        ("skipped_rescale", "the accumulator not rescaled when a later key block raises the max", "plain",
         lambda: flash("plain", skip_rescale=True)),
        ("p_in_fp8", "P rounded to e4m3 before P V (a coarser P than the kernel's design)", "plain",
         lambda: flash("plain", p_format=_round_e4m3)),
        ("gqa_by_modulo", "query head h reading KV head h % kv_heads instead of h // group", "plain", modulo_gqa),
        ("swapped_causal_alignment", "causal top-left where bottom-right is asked", "causal",
         lambda: ref("causal", align="top-left")),
        ("dropped_sink", "the attention sink left out of the softmax", "sinks",
         lambda: ref("sinks", sinks=None)),
        ("window_off_by_one", "a sliding window one key wider", "window", lambda: ref("window", window=(64, 0))),
        ("ignored_softcap", "the soft-cap not applied", "softcap", lambda: ref("softcap", softcap=0.0)),
    ]
    return [(name, what, problem, build) for name, what, problem, build in wrong]


# ---------------------------------------------------------------------------------------------
# Softmax.


def _softmax_problems(fmt: str, seed: int) -> Dict[str, Dict[str, Any]]:
    torch = _torch()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[fmt]
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(32, 2048, generator=g) * 2).to(dtype)
    large = (torch.randn(32, 2048, generator=g) + 90.0).to(dtype)  # exp overflows fp32 past 88.7
    return {"plain": {"inputs": (logits,), "options": {}},
            "large": {"inputs": (large,), "options": {}},
            "theta": {"inputs": (logits,), "options": {"theta": 2.0}}}


def _softmax_catalogue(fmt: str, seed: int) -> List[Tuple[str, str, str, Callable[[], Any]]]:
    torch = _torch()
    problems = _softmax_problems(fmt, seed)
    dtype = problems["plain"]["inputs"][0].dtype

    def ref(problem, **changes):
        options = {**problems[problem]["options"], **changes}
        return _references.softmax(problems[problem]["inputs"][0], format=fmt, **options)

    def bf16_accumulation():
        x = problems["plain"]["inputs"][0].float()
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return (e / _bf16_sum(e)).to(dtype)

    def no_max_subtraction():
        x = problems["large"]["inputs"][0].float()
        e = torch.exp(x)
        return (e / e.sum(-1, keepdim=True)).to(dtype)

    return [
        ("uniform", "every weight 1/n", "plain", lambda: torch.full_like(ref("plain"), 1.0 / 2048)),
        ("half_scaled", "the weights times 0.5", "plain", lambda: ref("plain") * 0.5),
        ("neighbouring_row", "each row given the next row's weights", "plain", lambda: ref("plain").roll(1, dims=0)),
        ("bf16_accumulation", "the row sum accumulated in bf16", "plain", bf16_accumulation),
        ("no_max_subtraction", "exp(x) without the row max subtracted (overflow)", "large", no_max_subtraction),
        ("ignored_temperature", "theta = 2 asked, theta = 1 computed", "theta", lambda: ref("theta", theta=1.0)),
    ]


# ---------------------------------------------------------------------------------------------


class AuditEntry:
    def __init__(self, name: str, what: str, problem: str, check_passed: bool, check_note: str,
                 sharpcheck_passed: bool, honest: bool = False):
        self.name = name
        self.what = what
        self.problem = problem
        self.check_passed = check_passed
        self.check_note = check_note
        self.sharpcheck_passed = sharpcheck_passed
        self.honest = honest

    def __repr__(self) -> str:
        return f"AuditEntry({self.name!r}, check_passed={self.check_passed}, sharpcheck_passed={self.sharpcheck_passed})"


class AuditReport:
    """What the check let through: passed_wrong (wrong outputs it passes: it cannot see them),
    caught (wrong outputs it fails), honest_rejected (honest outputs it fails: false alarms), and
    beside each, sharpcheck's own verdict (sharpcheck_missed: wrong outputs sharpcheck passes)."""

    def __init__(self, op: str, fmt: str, check_name: str, entries: List[AuditEntry]):
        self.op = op
        self.format = fmt
        self.check = check_name
        self.entries = entries
        wrong = [e for e in entries if not e.honest]
        honest = [e for e in entries if e.honest]
        self.passed_wrong = [e.name for e in wrong if e.check_passed]
        self.caught = [e.name for e in wrong if not e.check_passed]
        self.honest_rejected = [e.name for e in honest if not e.check_passed]
        self.sharpcheck_missed = [e.name for e in wrong if e.sharpcheck_passed]
        self.sharpcheck_rejected_honest = [e.name for e in honest if not e.sharpcheck_passed]

    def __repr__(self) -> str:
        return (f"AuditReport({self.check!r} on {self.op} {self.format}: passes {len(self.passed_wrong)} of "
                f"{len(self.passed_wrong) + len(self.caught)} wrong outputs, rejects "
                f"{len(self.honest_rejected)} honest)")

    def __str__(self) -> str:
        lines = [repr(self), "", "| output | what | your check | sharpcheck | your check's reason |",
                 "|---|---|---|---|---|"]
        for e in self.entries:
            kind = "honest" if e.honest else "wrong"
            mine = "passes" if e.check_passed else "fails"
            theirs = "passes" if e.sharpcheck_passed else "fails"
            flag = " (!)" if e.check_passed != e.honest else ""
            lines.append(f"| {e.name} ({kind}) | {e.what} | {mine}{flag} | {theirs} | {e.check_note} |")
        return "\n".join(lines)


def audit_tolerance(op: str, check: Optional[Callable[..., Any]] = None, *, atol: Optional[float] = None,
                    rtol: Optional[float] = None, cosine: Optional[float] = None, rmse: Optional[float] = None,
                    format: str = "bf16", seed: int = 0) -> AuditReport:
    """Runs the user's check on canonical wrong outputs of `op` ("attention" or "softmax") and on
    honest ones. check(actual, expected[, inputs]) returns truthy (or None) to pass and False or an
    AssertionError to fail; `expected` is the correctly rounded result in fp64, `actual` is in the
    inputs' format (bf16, fp16 or fp32), `inputs` a dict of the problem's tensors and options.
    Or: atol/rtol (torch.testing.assert_close against the fp64 result), cosine (similarity at
    least), rmse (root mean square error at most)."""
    if op not in ("attention", "softmax"):
        raise ValueError(f"audit_tolerance: op must be 'attention' or 'softmax', got {op!r}")
    if format not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"audit_tolerance: format must be bf16, fp16 or fp32, got {format!r}")
    check_name, run = _user_check(check, atol, rtol, cosine, rmse)
    if op == "attention":
        return _audit_attention(check_name, run, format, seed)
    return _audit_softmax(check_name, run, format, seed)


def _entries(judged: Callable[..., Tuple[bool, bool, str]], honest: List[Tuple[str, str, str, Any]],
             wrong: List[Tuple[str, str, str, Callable[[], Any]]]) -> List[AuditEntry]:
    """Each honest output (name, what, problem, output) and each wrong one (name, what, problem,
    build) judged by the user's check and by sharpcheck."""
    entries: List[AuditEntry] = []
    for name, what, problem, output in honest:
        passed, ours, note = judged(output, problem, honest=True)
        entries.append(AuditEntry(name, what, problem, passed, note, ours, honest=True))
    for name, what, problem, build in wrong:
        passed, ours, note = judged(build(), problem)
        entries.append(AuditEntry(name, what, problem, passed, note, ours))
    return entries


def _audit_attention(check_name: str, run: Callable[..., bool], fmt: str, seed: int) -> AuditReport:
    problems = _attention_problems(fmt, seed)
    golden: Dict[str, Any] = {}
    for name, problem in problems.items():
        q, k, v = problem["inputs"]
        golden[name] = _reference(q, k, v, problem["options"], "fp64")

    def judged(actual, problem, honest=False) -> Tuple[bool, bool, str]:
        q, k, v = problems[problem]["inputs"]
        inputs = {"q": q, "k": k, "v": v, **problems[problem]["options"]}
        passed, note = _verdict(run, actual, golden[problem], inputs, honest)
        public = {key: value for key, value in problems[problem]["options"].items() if not key.startswith("_")}
        try:
            assert_attention_close(actual, q, k, v, **public)
            ours = True
        except AssertionError:
            ours = False
        return passed, ours, note

    honest = []
    for problem in problems:
        q, k, v = problems[problem]["inputs"]
        honest += [(f"correctly_rounded[{problem}]", "the exact result rounded once", problem,
                    _reference(q, k, v, problems[problem]["options"], fmt)),
                   (f"flash_kernel[{problem}]", "FlashAttention-2 in torch: P in the format, fp32 sums", problem,
                    _flash(q, k, v, problems[problem]["options"]))]
    return AuditReport("attention", fmt, check_name, _entries(judged, honest, _attention_catalogue(fmt, seed)))


def _audit_softmax(check_name: str, run: Callable[..., bool], fmt: str, seed: int) -> AuditReport:
    torch = _torch()
    problems = _softmax_problems(fmt, seed)
    golden = {name: _references.softmax(p["inputs"][0], format="fp64", **p["options"]) for name, p in problems.items()}

    def judged(actual, problem, honest=False) -> Tuple[bool, bool, str]:
        logits = problems[problem]["inputs"][0]
        passed, note = _verdict(run, actual, golden[problem], {"logits": logits, **problems[problem]["options"]},
                                honest)
        try:
            assert_softmax_close(actual, logits, **problems[problem]["options"])
            ours = True
        except AssertionError:
            ours = False
        return passed, ours, note

    honest = []
    for problem, spec in problems.items():
        logits = spec["inputs"][0]
        theta = spec["options"].get("theta", 1.0)
        honest += [(f"correctly_rounded[{problem}]", "the exact result rounded once", problem,
                    _references.softmax(logits, format=fmt, **spec["options"])),
                   (f"torch_softmax[{problem}]", "torch.softmax in fp32, rounded to the format", problem,
                    torch.softmax(logits.float() / theta, -1).to(logits.dtype))]
    return AuditReport("softmax", fmt, check_name, _entries(judged, honest, _softmax_catalogue(fmt, seed)))
