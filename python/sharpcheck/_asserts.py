"""assert_*_close: outputs judged against the correctly rounded reference by the gate's own judge
(gate/judge_arrays.hpp), failing with an AssertionError in torch.testing.assert_close's shape plus
sharpcheck's lines, and returning a Report on success. Every call is recorded for the pytest
plugin (sharpcheck.pytest_plugin)."""

from __future__ import annotations

import functools
import inspect
import json
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _sharpcheck
from ._arrays import check_format, format_of, host
from ._references import _numbers, attention_options

# Every check made while the pytest plugin records ({"test": id or caller, "record": case record}),
# in order; the plugin turns `recording` on and reads the list. Outside it nothing accumulates.
RECORDED: List[Dict[str, Any]] = []
recording = False
# The running test's id, set by the pytest plugin (None outside pytest).
current_test: Optional[str] = None


def _number(value: Any) -> float:
    # The report writes non-finite figures as "inf" or "nan", which float() reads; a figure nlohmann
    # wrote as null (a NaN that reached JSON unconverted) is NaN too.
    return float("nan") if value is None else float(value)


class Report:
    """What a check found: the gate's case record (to_json()) with its figures as attributes."""

    def __init__(self, record: Dict[str, Any], notes: List[str]):
        self.record = record
        self.notes = list(notes)
        # The reference the verdict used, where the assert was asked for it (return_reference).
        self.reference: Optional[Tuple[Any, Any, Any, Any]] = None
        tiers = record["tiers"]
        self.status: str = record["status"]  # "pass", "fail" or "inconclusive"
        self.passed: bool = self.status != "fail"
        self.inconclusive: bool = self.status == "inconclusive"
        self.format: str = record["format"]
        self.elements: int = record["elements"]
        self.max_ulp: int = record["max_ulps"]
        self.mean_ulp: float = record["mean_ulps"]
        self.bound_ratio: float = _number(tiers["proven"]["max_bound_ratio"])
        self.statistical_ratio: float = _number(tiers["statistical"]["max_bound_ratio"])
        self.bias_ratio: float = _number(tiers["statistical"]["max_bias_ratio"])
        # Elements outside the proven bound, and those (elements, or rows by their bias) within it
        # but outside the statistical tier; mismatched counts both.
        self.proven_mismatched: int = tiers["proven"]["violations"]
        self.statistical_mismatched: int = tiers["statistical"]["violations"]
        self.mismatched: int = self.proven_mismatched + self.statistical_mismatched
        self.max_abs_error: float = _number(record["max_absolute_error"])
        self.max_rel_error: float = _number(record["max_relative_error"])
        worst = record["worst"]
        self.worst_array: str = worst.get("array", "")
        self.worst_index: Tuple[int, ...] = tuple(worst.get("full_index", []))
        self.failures: List[str] = record["failures"]
        # Attention: the precision recipe the verdict is under, and how it was chosen ("pass as
        # flash_bf16: ..."; metrics/recipes.hpp), and the row-scale test's worst ratio.
        self.recipe: str = record.get("recipe", "")
        self.recipe_note: str = record.get("recipe_note", "")
        self.row_scale_ratio: float = _number(record.get("max_row_scale_ratio", 0.0))

    def to_json(self) -> str:
        return json.dumps(self.record, indent=2)

    def __repr__(self) -> str:
        recipe = f", recipe={self.recipe!r}" if self.recipe else ""
        # The bound ratio leads: it is the verdict (ulps near zero can be large for honest kernels).
        return (f"Report(status={self.status!r}, bound_ratio={self.bound_ratio:.3g}, "
                f"statistical_ratio={self.statistical_ratio:.3g}{recipe}, format={self.format!r}, "
                f"elements={self.elements}, max_ulp={self.max_ulp})")

    def message(self, what: str, tolerance: str) -> str:
        """assert_close's lines (count, greatest differences, where), then sharpcheck's."""
        worst = self.record["worst"]
        where = f"{self.worst_array} at index {self.worst_index}" if self.worst_index else f"row {worst['row']}"
        # Elements only (rows judged by their sum are findings too, counted in the next clause).
        elements_out = self.record["tiers"]["proven"].get("mismatched_elements", self.proven_mismatched)
        rows_out = self.proven_mismatched - elements_out
        share = 100.0 * elements_out / self.elements if self.elements else 0.0
        ulps = "no ulp distance (NaN)" if worst["ulps"] is None else f"{worst['ulps']} ulp"
        non_finite = self.record.get("non_finite", 0)
        finite_only = f" (over finite elements; {non_finite} NaN or Inf where the result is finite)" if non_finite else ""
        lines = [
            f"{what} are not close to the correctly rounded reference!",
            "",
            f"Mismatched elements: {elements_out} / {self.elements} ({share:.1f}%) outside the proven "
            f"bound" + (f", and {rows_out} row findings (a sum off 1, a moved argmax)" if rows_out else "") +
            f"; {self.statistical_mismatched} more findings (elements, or rows by their bias or scale) "
            "within it but outside the statistical tier",
            f"Greatest absolute difference: {self.max_abs_error:.6g}" + finite_only,
            f"Greatest relative difference: {self.max_rel_error:.6g}" + finite_only,
            f"Worst element: {where}: expected {worst['expected']}, got {worst['actual']} ({ulps}, "
            f"allowed |error| {_number(worst['allowed']):.6g})",
            f"Max ulp: {self.max_ulp}, mean ulp {self.mean_ulp:.3g}",
            f"Bound ratio: proven tier {self.bound_ratio:.4g}, statistical tier {self.statistical_ratio:.4g}, "
            f"bias {self.bias_ratio:.4g}, row scale {self.row_scale_ratio:.4g} (each fails above 1)",
            f"Format {self.format}, " + (f"recipe {self.recipe}" if self.recipe else
                                         f"precision model (tolerance entry) {tolerance}"),
        ]
        tensors = self.record.get("tensors", [])
        if tensors:
            proven_only = bool(self.record.get("proven_only"))
            lines.append("Per tensor: " + "; ".join(_tensor_verdict(t, proven_only) for t in tensors))
        lines += [f"sharpcheck: {failure}" for failure in self.failures]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _tensor_verdict(tensor: Dict[str, Any], proven_only: bool = False) -> str:
    """"dk fails (proven 144, statistical 144; 16 findings)" for a report's per-tensor line; under
    proven_only a tensor whose findings are all statistical passes (as the verdict says)."""
    proven, statistical = _number(tensor["proven_ratio"]), _number(tensor["statistical_ratio"])
    findings = tensor.get("proven_violations", tensor["violations"]) if proven_only else tensor["violations"]
    failed = findings > 0 or tensor["non_finite"] > 0
    text = f"{tensor['name']} {'fails' if failed else 'passes'} (proven {proven:.3g}, statistical {statistical:.3g}"
    if tensor["non_finite"]:
        text += f"; {tensor['non_finite']} NaN or Inf"
    return text + (f"; {findings} findings)" if failed else ")")


_PACKAGE_DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def _inputs_format(q: Any) -> Optional[str]:
    """The inputs' format from q's dtype (which recipes a default judgement tries), or None for
    integer bit patterns (then the outputs' format stands for both)."""
    try:
        return format_of(q, "q")
    except TypeError:
        return None


def _lse_format(lse: Any) -> Optional[str]:
    """A log-sum-exp handed over in bf16 or fp16 is judged in that format; any other (fp32, or wider
    values of fp32 computations) in fp32, as kernels keep it."""
    if lse is None:
        return None
    try:
        fmt = format_of(lse, "lse")
    except TypeError:
        return None
    return fmt if fmt in ("bf16", "fp16") else None


def _caller_name() -> str:
    """The running test (under the plugin), else the function that called the assert."""
    if current_test is not None:
        return current_test
    frame = inspect.currentframe()
    while frame is not None:
        if os.path.dirname(os.path.abspath(frame.f_code.co_filename)) != _PACKAGE_DIRECTORY:
            return frame.f_code.co_name
        frame = frame.f_back
    return "python"


def _judged(judge: Callable[[Dict[str, Any]], Any], options: Dict[str, Any], what: str, tolerance: str,
            notes: List[str], msg: Optional[str]) -> Report:
    options.setdefault("name", _caller_name())
    result = judge(options)
    # A judge asked for its reference too returns (record, reference): computed once, kept on the Report.
    text, reference = result if isinstance(result, tuple) else (result, None)
    record = json.loads(text)
    record["rerun"] = f"pytest {current_test}" if current_test else ""
    record["tolerance_entry"] = record.get("recipe") or tolerance
    record["proven_only"] = bool(options.get("proven_only", False))
    if notes:
        record["notes"] = record.get("notes", []) + [n for n in notes if n not in record.get("notes", [])]
    if recording:
        RECORDED.append({"test": current_test or options["name"], "record": record})
    report = Report(record, notes)
    report.reference = reference
    if report.inconclusive:  # not a failure, but never a silent pass
        warnings.warn(f"sharpcheck: {what} inconclusive: only {record.get('informative_elements', '?')} of "
                      f"{report.elements} expected values can discriminate (0, 1, at the format's floor, "
                      "or with an allowance reaching |expected|)", stacklevel=3)
    if not report.passed:
        text = report.message(what, tolerance)
        error = AssertionError(f"{msg}\n\n{text}" if msg else text)
        error.report = report  # type: ignore[attr-defined]  # its figures (and reference) for the caller
        raise error
    return report


def assert_softmax_close(actual: Any, logits: Any, *, dim: int = -1, theta: float = 1.0,
                         format: Optional[str] = None, input_format: Optional[str] = None,
                         tolerance: Optional[str] = None, proven_only: bool = False, log_softmax: bool = False,
                         name: Optional[str] = None, msg: Optional[str] = None, threads: int = 0) -> Report:
    """actual ~ softmax(logits / theta) along dim, judged against the correctly rounded reference
    under a tolerance entry (default plugin_softmax: any sound fp32-accumulating kernel). format
    defaults to actual's dtype; integer arrays are bit patterns of format (bf16 as int16, fp8 as
    uint8) or quantized codes (format "int8"/"uint8")."""
    notes: List[str] = []
    fmt = check_format(format or format_of(actual, "actual"))
    out, x = host(actual, "actual", notes), host(logits, "logits", notes)
    entry = tolerance or (fmt if fmt in ("int8", "uint8") else "plugin_softmax")
    options = {"format": fmt, "dim": dim, "theta": theta, "tolerance": entry, "proven_only": proven_only,
               "log_softmax": log_softmax, "threads": threads, "input_format": input_format, "name": name}
    options = {key: value for key, value in options.items() if value is not None}
    what = "Log-softmax outputs" if log_softmax else "Softmax outputs"
    return _judged(lambda o: _sharpcheck.judge_softmax(out, x, o), options, what, entry, notes, msg)


def assert_log_softmax_close(actual: Any, logits: Any, *, dim: int = -1, theta: float = 1.0,
                             format: Optional[str] = None, input_format: Optional[str] = None,
                             tolerance: Optional[str] = None, proven_only: bool = False, name: Optional[str] = None,
                             msg: Optional[str] = None, threads: int = 0) -> Report:
    """actual ~ log_softmax(logits / theta) along dim; the keywords of assert_softmax_close."""
    return assert_softmax_close(actual, logits, dim=dim, theta=theta, format=format, input_format=input_format,
                                tolerance=tolerance, proven_only=proven_only, log_softmax=True, name=name,
                                msg=msg, threads=threads)


def assert_attention_close(out: Any, q: Any, k: Any, v: Any, *, lse: Any = None, causal: bool = False,
                           align: str = "top-left", scale: Optional[float] = None,
                           window: Optional[Tuple[int, int]] = None, softcap: float = 0.0, sinks: Any = None,
                           alibi_slopes: Any = None, attn_mask: Any = None, layout: str = "bhsd",
                           query_lengths: Any = None, key_lengths: Any = None, cu_seqlens_q: Any = None,
                           cu_seqlens_k: Any = None, lse_base2: bool = False, theta: float = 1.0,
                           fully_masked: str = "zeros", format: Optional[str] = None,
                           input_format: Optional[str] = None, tolerance: Optional[str] = None,
                           proven_only: bool = False, name: Optional[str] = None, msg: Optional[str] = None,
                           threads: int = 0) -> Report:
    """out (and lse, if given: natural log or base 2, judged in its dtype's format) ~ attention of q, k, v, judged head by
    head against the correctly rounded reference under a precision recipe (tolerance=: attention_fp32,
    flash_bf16, flash_fp16, math_bf16, math_fp16, ...; default: every recipe the formats allow, the
    first that fits, reported as Report.recipe).
    Layouts bhsd (SDPA), bshd (flash_attn_func), packed (varlen, with cu_seqlens) or 2-D matrices of
    one head; GQA/MQA from k's head count; causal top-left (SDPA's is_causal) or bottom-right
    (FlashAttention); attn_mask as SDPA takes it (bool keeps, float adds)."""
    notes: List[str] = []
    fmt = check_format(format or format_of(out, "out"))
    arrays = [host(a, n, notes) for a, n in ((out, "out"), (q, "q"), (k, "k"), (v, "v"))]
    lse_array = None if lse is None else host(lse, "lse", notes)
    options = attention_options(causal=causal, align=align, scale=scale, window=window, softcap=softcap,
                                sinks=sinks, alibi_slopes=alibi_slopes, attn_mask=attn_mask, layout=layout,
                                query_lengths=query_lengths, key_lengths=key_lengths, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, lse_base2=lse_base2, theta=theta,
                                fully_masked=fully_masked, threads=threads, notes=notes)
    entry = tolerance or "every recipe the formats allow"
    lse_format = _lse_format(lse)
    if lse_format is not None:
        notes.append(f"the log-sum-exp is judged in {lse_format}, its dtype (its own rounding allowed)")
    extra = {"format": fmt, "tolerance": tolerance, "proven_only": proven_only,
             "input_format": input_format or _inputs_format(q), "name": name, "lse_format": lse_format}
    options.update({key: value for key, value in extra.items() if value is not None})
    judge = lambda o: _sharpcheck.judge_attention(*arrays, lse_array, o)  # noqa: E731
    return _judged(judge, options, "Attention outputs", entry, notes, msg)


def assert_attention_backward_close(dq: Any, dk: Any, dv: Any, q: Any, k: Any, v: Any, dout: Any, *,
                                    d_lse: Any = None, d_sinks: Any = None, d: Any = None, causal: bool = False,
                                    align: str = "top-left", scale: Optional[float] = None,
                                    window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
                                    sinks: Any = None, alibi_slopes: Any = None, attn_mask: Any = None,
                                    layout: str = "bhsd", query_lengths: Any = None, key_lengths: Any = None,
                                    cu_seqlens_q: Any = None, cu_seqlens_k: Any = None, theta: float = 1.0,
                                    format: Optional[str] = None, input_format: Optional[str] = None,
                                    tolerance: Optional[str] = None, proven_only: bool = False,
                                    name: Optional[str] = None, msg: Optional[str] = None,
                                    threads: int = 0, return_reference: bool = False) -> Report:
    """dq, dk, dv (and d_sinks, if given) ~ the gradients of attention of q, k, v against dout (and
    d_lse), and D = rowsum(dO * O) in fp32 if the kernel exposes it (d, laid out as the log-sum-exp),
    judged head by head against the correctly rounded gradients under a backward tolerance
    recipe (tolerance=: attention_backward_flash, backward_flash_bf16/fp16, backward_math_bf16/fp16;
    default: every recipe the formats allow, the first that fits) or a kernel's entry such as
    attention_backward_plain (P materialised in fp32). Layouts, masks and modifiers as
    sharpcheck.attention_backward; padded positions are not judged. With return_reference=True the
    correctly rounded gradients the verdict used, (dq, dk, dv, d_sinks) as sharpcheck.attention_backward
    returns them, are kept as report.reference (computed once; on a failure the AssertionError
    carries the report as .report)."""
    notes: List[str] = []
    fmt = check_format(format or format_of(dq, "dq"))
    grads = [host(a, n, notes) for a, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
    inputs = [host(a, n, notes) for a, n in ((q, "q"), (k, "k"), (v, "v"), (dout, "dout"))]
    lse_gradient = None if d_lse is None else host(d_lse, "d_lse", notes)
    options = attention_options(causal=causal, align=align, scale=scale, window=window, softcap=softcap,
                                sinks=sinks, alibi_slopes=alibi_slopes, attn_mask=attn_mask, layout=layout,
                                query_lengths=query_lengths, key_lengths=key_lengths, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, lse_base2=False, theta=theta, fully_masked="zeros",
                                threads=threads, notes=notes)
    entry = tolerance or "every backward recipe the formats allow"
    extra = {"format": fmt, "tolerance": tolerance, "proven_only": proven_only,
             "input_format": input_format or _inputs_format(q), "name": name}
    options.update({key: value for key, value in extra.items() if value is not None})
    sink_gradients = _numbers(d_sinks)
    d_rows = None if d is None else host(d, "d", notes)
    judge = lambda o: _sharpcheck.judge_attention_backward(  # noqa: E731
        tuple(grads), tuple(inputs), lse_gradient, sink_gradients, d_rows, o, return_reference)
    return _judged(judge, options, "Attention gradients", entry, notes, msg)


def ops() -> List[Dict[str, Any]]:
    """Every operation sharpcheck judges, as `sharpcheck ops --json` lists them: name, summary,
    tensors (name, role, shape, format, meaning), options (name, kind, default, meaning), allowance,
    built-in kernels, plugin entry, and where each can be judged."""
    return json.loads(_sharpcheck.ops_json())


@functools.lru_cache(maxsize=None)
def _operation_specs() -> Dict[str, Dict[str, Any]]:
    """ops() by name, read once (the registry is fixed for the process); callers do not mutate it."""
    return {o["name"]: o for o in ops()}


def operation_spec(op: str) -> Optional[Dict[str, Any]]:
    return _operation_specs().get(op)


def _check_option_kind(key: str, value: Any, kind: Optional[str]) -> None:
    """A value of the Python type the schema's kind takes (the C++ schema parses text, so theta="1",
    proven_only="true" or key_lengths=[8.0] were accepted as 1, true and 8 where the assert_* functions
    refuse them): flags bool, reals int or float, integers int, counts whole ints, text str (a window
    as a pair of counts)."""
    def whole(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)
    ok = {"flag": lambda: isinstance(value, bool),
          "real": lambda: whole(value) or isinstance(value, float),
          "integer": lambda: whole(value),
          "counts": lambda: whole(value) or (isinstance(value, (list, tuple))
                                             and all(x is None or whole(x) for x in value)),
          "text": lambda: isinstance(value, str) or (isinstance(value, (list, tuple))
                                                      and all(x is None or whole(x) for x in value))}
    expected = {"flag": "True or False", "real": "a number", "integer": "an integer",
                "counts": "a list of whole counts (ints)", "text": "a string"}
    if kind in ok and not ok[kind]():
        raise ValueError(f"{key}: expected {expected[kind]}, got {value!r} ({type(value).__name__})")


def _option_text(key: str, value: Any, kind: Optional[str] = None) -> str:
    """An option's value as the schema's text: flags true/false, reals exactly (hex), lists of
    counts comma-separated (None in a window: -1, unbounded); NumPy scalars as their Python value.
    `kind` (the schema's: flag, real, integer, counts, text) refuses a value of another type."""
    if hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        value = value.item()
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) == 1 and "int" in str(getattr(value, "dtype", "")):
        value = value.tolist()  # a 1-D integer array as a list of counts (cu_seqlens as flash-attn takes it)
    if hasattr(value, "shape") or hasattr(value, "__dlpack__"):
        raise ValueError(f"{key} is an array but not a tensor of this operation; sharpcheck.ops() lists its tensors")
    if isinstance(value, (list, tuple)):
        value = [item.item() if hasattr(item, "dtype") and getattr(item, "shape", None) == () else item
                 for item in value]
    _check_option_kind(key, value, kind)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, (list, tuple)):
        value = [item.item() if hasattr(item, "dtype") and getattr(item, "shape", None) == () else item
                 for item in value]  # NumPy or torch scalars as their Python value
        for item in value:
            if item is not None and (isinstance(item, bool) or not isinstance(item, (int, float)) or int(item) != item):
                raise ValueError(f"{key}: expected whole counts (or None for unbounded), got {item!r}")
        return ",".join("-1" if item is None else str(int(item)) for item in value)
    if isinstance(value, (int, str)):
        return str(value)
    raise TypeError(f"{key}: expected a number, a flag, a string or a list of counts, got {type(value).__name__}")


def judge(op: str, *, msg: Optional[str] = None, **tensors_and_options: Any) -> Report:
    """Judges arrays of any operation sharpcheck.ops() lists, by its tensors' and options' names:
    sharpcheck.judge("linear_attention", q=q, k=k, v=v, out=out, causal=True). format defaults to
    the judged tensor's dtype; an unknown keyword or a wrong value is a ValueError naming it.
    AssertionError when the results do not fit the operation's allowance, as assert_*_close."""
    spec = operation_spec(op)
    if spec is None:
        raise ValueError(f"no operation named {op!r}; sharpcheck.ops() lists them: "
                         + ", ".join(o["name"] for o in ops()))
    tensor_names = [t["name"] for t in spec["tensors"]]
    option_kinds = {o["name"]: o["kind"] for o in spec.get("options", [])}
    notes: List[str] = []
    tensors: Dict[str, Any] = {}
    options: Dict[str, Any] = {}
    for key, value in tensors_and_options.items():
        if value is None:
            continue
        if key in tensor_names:
            tensors[key] = host(value, key, notes)
        else:
            options[key] = _option_text(key, value, option_kinds.get(key))
    judged = [t["name"] for t in spec["tensors"] if t["role"] == "judged" and t["name"] in tensors]
    if "format" not in options and judged:
        options["format"] = check_format(format_of(tensors_and_options[judged[0]], judged[0]))
    # A log-sum-exp handed over in bf16 or fp16 is judged in that format (as assert_attention_close).
    for t in spec["tensors"]:
        if t["format"] == "lse_format" and t["name"] in tensors and "lse_format" not in options:
            lse_format = _lse_format(tensors_and_options[t["name"]])
            if lse_format is not None:
                options["lse_format"] = lse_format
                notes.append(f"{t['name']} is judged in {lse_format}, its dtype (its own rounding allowed)")
    tolerance = options.get("tolerance", "the operation's default")
    return _judged(lambda o: _sharpcheck.judge_op(op, tensors, o), options, f"{op} results", tolerance, notes, msg)
