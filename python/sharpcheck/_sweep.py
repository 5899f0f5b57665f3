"""The gate's stress sweep for a kernel written in Python (issue 34): the cases the gate runs on a
plugin (near-overflow rows, ties, spikes, masked entries, every size; attention at temperature 2,
causal, and the scenarios: bottom-right causal with MQA, sliding windows, GQA with soft-capping,
ALiBi, sinks, key padding, packed variable lengths, a KV-cache decode row, a late dominant key),
each handed to the kernel as torch tensors (or NumPy arrays) and judged against the correctly
rounded reference by the operation's own judge.

    report = sharpcheck.sweep(my_attention, "attention", format="bf16", features={"causal", "align"})
    report.check()                       # AssertionError listing every failing case

    @pytest.mark.parametrize("case", sharpcheck.cases("softmax", format="bf16"), ids=str)
    def test_my_softmax(case):
        case.judge(my_softmax(*case.args, **case.kwargs))

Case ids are the gate's (kernel/input/modifiers/n=N, the kernel named python:<op>:<format>), and
the same seed gives the same inputs, so a failing id reruns alone."""

import copy
import json
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import _sharpcheck
from ._arrays import host
from ._asserts import Report, judge, operation_spec

DEFAULT_SEED = 20241008  # the gate's default --seed
# Every feature a case may need (gate/operation.hpp's ExternalCase::needs).
FEATURES = frozenset({"theta", "causal", "align", "window", "softcap", "gqa", "alibi_slopes", "sinks",
                      "key_lengths", "query_lengths", "cu_seqlens", "d_lse"})

_TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "int64": "int64"}
_NUMPY_DTYPES = {"fp64": "float64", "fp32": "float32", "tf32": "float32", "fp16": "float16", "int64": "int64"}


def _spec(op: str) -> Dict[str, Any]:
    spec = operation_spec(op)
    if spec is None:
        raise ValueError(f"no operation named {op!r}; sharpcheck.ops() lists them")
    return spec


def _converter(fmt: str, array: str) -> Callable[[Any], Any]:
    """float64 NumPy values of the format as the kernel's arrays: exact (every value is one of fmt)."""
    import numpy as np

    if array == "numpy":
        if fmt not in _NUMPY_DTYPES:
            raise ValueError(f"array='numpy' cannot hold {fmt}; use array='torch'")
        return lambda values: values.astype(_NUMPY_DTYPES[fmt])
    if array != "torch":
        raise ValueError(f"array must be 'torch' or 'numpy', got {array!r}")
    import torch

    dtype = getattr(torch, _TORCH_DTYPES.get(fmt, ""), None)
    if dtype is None:
        raise ValueError(f"this torch ({torch.__version__}) has no dtype for {fmt}")
    return lambda values: torch.from_numpy(np.ascontiguousarray(values)).to(dtype)


def _copy(value: Any) -> Any:
    clone = getattr(value, "clone", None) or getattr(value, "copy", None)
    return clone() if callable(clone) and hasattr(value, "shape") else value


def _dtype_format(value: Any) -> Optional[str]:
    name = str(getattr(value, "dtype", "")).replace("torch.", "")
    return {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name)


class Case:
    """One case of the sweep: `args` (the input tensors, positional, in the operation's order) and
    `kwargs` (optional tensors such as sinks, and the options: scale, causal, window, ...) are what
    the kernel is called with, fresh copies at every access (a kernel that writes into its inputs
    cannot move the reference: judge(result) judges against the case's own untouched inputs).
    output_format: the format the results must come back in (default: the case's format; a kernel
    returning another dtype is an error, not judged in the looser format)."""

    def __init__(self, op: str, fmt: str, entry: Dict[str, Any], array: str, output_format: Optional[str] = None):
        spec = _spec(op)
        convert = _converter(fmt, array)
        self.op = op
        self.format = fmt
        # tf32 inputs (values of tf32 in float32) come out of a kernel as fp32 results.
        self.output_format = output_format or ("fp32" if fmt == "tf32" else fmt)
        self.id: str = entry["id"]
        self.needs: Tuple[str, ...] = tuple(entry["needs"])
        self.options: Dict[str, Any] = json.loads(entry["options"])
        self.judge_options: Dict[str, Any] = json.loads(entry["judge_options"])  # not the kernel's
        for key, value in self.options.items():
            if isinstance(value, list) and key == "window":
                self.options[key] = tuple(value)
        stored_as = entry["stored_as"]
        self.inputs: Dict[str, Any] = {
            name: (_converter(stored_as[name], array) if name in stored_as else convert)(values)
            for name, values in entry["tensors"].items()}
        self._required = [t["name"] for t in spec["tensors"] if t["role"] == "input"]
        self._results = [t["name"] for t in spec["tensors"] if t["role"] in ("judged", "optional judged")]
        # Results stored in the output's format (out, probs, dq, ...), whose dtype must match it.
        self._in_output_format = {t["name"] for t in spec["tensors"] if t["format"] == "format"}
        # A batch-invariance case: the same requests again in other batches, each a call of its own
        # (its name in rerun.name); sweep() compares them with the first call request by request.
        self.reruns: List["Case"] = []
        for rerun in entry.get("reruns", []):
            self.reruns.append(Case(op, fmt, rerun, array, output_format))
            self.reruns[-1].name = rerun["name"]
        self.name = "first call"
        self.outputs: Tuple[str, ...] = tuple(entry.get("outputs", ()))  # what an invariance case compares
        self.sizes: List[int] = []
        self.seed = DEFAULT_SEED

    @property
    def args(self) -> Tuple[Any, ...]:
        return tuple(_copy(self.inputs[name]) for name in self._required if name in self.inputs)

    @property
    def kwargs(self) -> Dict[str, Any]:
        kwargs = {name: _copy(value) for name, value in self.inputs.items() if name not in self._required}
        kwargs.update(copy.deepcopy(self.options))  # a kernel rewriting cu_seqlens_q cannot move the judge
        return kwargs

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"Case({self.id!r})"

    def results(self, result: Any) -> Dict[str, Any]:
        """What the kernel returned, by the operation's result names: one array is the first (out,
        probs, ...), a tuple or list is them in order (out, lse), a dict is by name."""
        if isinstance(result, dict):
            unknown = sorted(set(result) - set(self._results))
            if unknown:
                raise ValueError(f"{self.id}: the kernel returned {unknown}; {self.op} returns {self._results}")
            return dict(result)
        if isinstance(result, (tuple, list)):
            if not 1 <= len(result) <= len(self._results):
                raise ValueError(f"{self.id}: the kernel returned {len(result)} values; {self.op} returns "
                                 f"{self._results} (the first required)")
            return dict(zip(self._results, result))
        return {self._results[0]: result}

    def checked_results(self, result: Any) -> Dict[str, Any]:
        """results(result), each result in the output's format checked (TypeError naming it)."""
        results = self.results(result)
        for name, value in results.items():
            got = _dtype_format(value)
            expected = "fp32" if self.output_format == "tf32" else self.output_format  # tf32 lives in float32
            if name in self._in_output_format and got is not None and got != expected:
                raise TypeError(f"{self.id}: {name} came back as {got} where {self.output_format} was asked "
                                f"(output_format={got!r} judges a {got} output)")
        return results

    def judge(self, result: Any, **judge_options: Any) -> Report:
        """Judges the kernel's result on this case (AssertionError when it does not fit, as judge).
        A batch-invariance case (reruns) is judged only by calling the kernel on every rerun:
        sharpcheck.sweep(kernel, op, match=case.id); judge() refuses it rather than skip the check."""
        if self.reruns:
            raise ValueError(f"{self.id} is a batch-invariance case: its {len(self.reruns)} reruns must run "
                             f"too; judge it with sharpcheck.sweep(kernel, {self.op!r}, match={self.id!r})")
        options = dict(self.options)
        options.update(self.judge_options)
        options.update(judge_options)
        options.setdefault("input_format", self.format)
        options.setdefault("name", self.id)
        results = self.checked_results(result)
        options.setdefault("format", self.output_format)
        return judge(self.op, **self.inputs, **results, **options)


def _sizes(sizes: Sequence[int]) -> List[int]:
    if isinstance(sizes, (str, bytes)):
        raise TypeError(f"sizes: expected a sequence of whole numbers, got the string {sizes!r}")
    checked: List[int] = []
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, (int, float)) or int(n) != n or not 1 <= n <= 1 << 20:
            raise ValueError(f"sizes: each size must be a whole number from 1 to 1,048,576, got {n!r}")
        if int(n) not in checked:
            checked.append(int(n))
    return checked


def cases(op: str, *, format: str = "fp32", sizes: Sequence[int] = (), seed: int = DEFAULT_SEED,
          features: Iterable[str] = (), array: str = "torch", match: Optional[str] = None,
          output_format: Optional[str] = None) -> List[Case]:
    """The gate's sweep of `op` for a kernel outside it, as Case objects (for pytest.mark.parametrize:
    ids=str). Cases needing a feature the kernel does not declare in `features` are left out: theta,
    causal, align (bottom-right), window, softcap, gqa, alibi_slopes, sinks, key_lengths,
    cu_seqlens (packed), d_lse (attention_backward: a gradient through the log-sum-exp).
    match: a case id (that case alone), else only the cases whose id contains it. sizes: default 16 to 16,384, as the gate's."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
        raise ValueError(f"seed: expected a whole number from 0 to 2^64 - 1, got {seed!r}")
    if not isinstance(format, str):
        raise TypeError(f"format: expected a format name such as 'bf16', got {format!r}")
    if format.startswith("fp8"):
        raise ValueError(f"format {format}: fp8 tensors cannot cross into the judge yet (DLPack has no fp8 "
                         "type here); sweep an fp8 kernel with format='bf16' inputs and judge its output "
                         "through sharpcheck.judge with integer bit patterns")
    entries = _sharpcheck.external_cases(op, format, _sizes(sizes), seed)
    declared = set(features)
    unknown = sorted(declared - FEATURES)
    if unknown:  # one kernel's capability set serves every operation, so only misspellings are refused
        raise ValueError(f"features: {unknown} unknown; the features are {sorted(FEATURES)}")
    exact = match is not None and any(entry["id"] == match for entry in entries)
    chosen = [entry for entry in entries if set(entry["needs"]) <= declared and
              (match is None or (entry["id"] == match if exact else match in entry["id"]))]
    if match is not None and not chosen:
        raise ValueError(f"match: no case of {op} at these sizes and features has an id containing {match!r}")
    chosen_cases = [Case(op, format, entry, array, output_format) for entry in chosen]
    for case in chosen_cases:  # what judge_invariance_case regenerates the case from
        case.sizes, case.seed = _sizes(sizes), seed
    return chosen_cases


class SweepResult:
    """One case's outcome: status pass, fail, inconclusive, crash (the kernel raised) or error (its
    result was not an answer: wrong shape, wrong count)."""

    def __init__(self, case_id: str, status: str, message: str = "", report: Optional[Report] = None):
        self.id = case_id
        self.status = status
        self.message = message
        self.report = report

    def __repr__(self) -> str:
        return f"SweepResult({self.id!r}, {self.status!r})"


class SweepReport:
    """Every case's result; passed when no case failed, crashed or errored."""

    def __init__(self, op: str, kernel_name: str, results: List[SweepResult]):
        self.op = op
        self.kernel = kernel_name
        self.results = results
        self.failures = [r for r in results if r.status in ("fail", "crash", "error")]
        self.passed = not self.failures

    def counts(self) -> Dict[str, int]:
        counted: Dict[str, int] = {}
        for result in self.results:
            counted[result.status] = counted.get(result.status, 0) + 1
        return counted

    def __repr__(self) -> str:
        return f"SweepReport({self.kernel!r} on {self.op}: {self.counts()})"

    def __str__(self) -> str:
        lines = [f"sharpcheck.sweep: {self.kernel} on {self.op}, {len(self.results)} cases: "
                 + ", ".join(f"{count} {status}" for status, count in sorted(self.counts().items()))]
        for result in self.failures:
            first = result.message.strip().splitlines()
            detail = next((line for line in first if line.startswith("Worst element")), first[0] if first else "")
            lines.append(f"  {result.status}: {result.id}: {detail}")
        return "\n".join(lines)

    def check(self) -> "SweepReport":
        """AssertionError listing every failing case, else self."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


def sweep(kernel: Callable[..., Any], op: str, *, format: str = "fp32", sizes: Sequence[int] = (),
          seed: int = DEFAULT_SEED, features: Iterable[str] = (), array: str = "torch", match: Optional[str] = None,
          output_format: Optional[str] = None, **judge_options: Any) -> SweepReport:
    """Runs `kernel(*case.args, **case.kwargs)` on every case of cases(op, ...) and judges each
    result (judge_options: tolerance=, proven_only=, ...). A kernel that raises is a crash of that
    case, and the sweep goes on; KeyboardInterrupt stops it. Returns a SweepReport (check() asserts)."""
    results: List[SweepResult] = []
    for case in cases(op, format=format, sizes=sizes, seed=seed, features=features, array=array, match=match,
                      output_format=output_format):
        try:
            result = kernel(*case.args, **case.kwargs)
            if case.reruns:
                results.append(_judge_invariance(kernel, case, result))
                continue
        except Exception as error:  # noqa: BLE001 - any exception of the kernel is its case's crash
            results.append(SweepResult(case.id, "crash", f"{type(error).__name__}: {error}"))
            continue
        try:
            report = case.judge(result, **judge_options)
            results.append(SweepResult(case.id, report.status, "", report))
        except AssertionError as failure:  # its report (the case record) kept for the caller
            results.append(SweepResult(case.id, "fail", str(failure), getattr(failure, "report", None)))
        except (ValueError, TypeError, ArithmeticError) as error:  # ArithmeticError: UndecidedRounding
            results.append(SweepResult(case.id, "error", f"{type(error).__name__}: {error}"))
    return SweepReport(op, getattr(kernel, "__name__", repr(kernel)), results)


def probes(kernel: Callable[..., Any], op: str = "attention", *, format: str = "bf16", sizes: Sequence[int] = (),
           seed: int = DEFAULT_SEED, features: Iterable[str] = (), array: str = "torch",
           **judge_options: Any) -> SweepReport:
    """The sweep's exact probes alone: cases whose reference is exactly known (attention: V constant,
    every output that constant; Q zero, every weight 1/n and the LSE ln n), which catch the bugs
    no tolerance sees (a row sum of its neighbour's, a denominator off by a rounding). ValueError
    when `op` has none."""
    return sweep(kernel, op, format=format, sizes=sizes, seed=seed, features=features, array=array, match="probe",
                 **judge_options)


def _judge_invariance(kernel: Callable[..., Any], case: Case, result: Any) -> SweepResult:
    """A batch-invariance case: the kernel called on every rerun too, then every request's outputs
    compared bit for bit with the first call's and the calls that differ judged, by the gate's own
    check (judge_invariance_case). Judged under the operation's default allowance."""
    notes: List[str] = []

    def kept(call: Case, result: Any) -> Dict[str, Any]:
        # Each result copied to the host at once: a kernel reusing one output buffer (CUDA graphs,
        # out=) overwrites it on the next call.
        results = call.checked_results(result)
        extra = sorted(set(results) - set(call.outputs))
        if extra:
            notes.append(f"{extra} returned too: the invariance case compares and judges {list(call.outputs)} "
                         "only (the operation's other cases judge the rest)")
        return {name: _copy(host(value, name, notes)) for name, value in results.items() if name in call.outputs}

    try:
        calls = [kept(case, result)]
    except (ValueError, TypeError) as error:
        return SweepResult(case.id, "error", f"{type(error).__name__} in the first call: {error}")
    for rerun in case.reruns:
        try:
            rerun_result = kernel(*rerun.args, **rerun.kwargs)
        except Exception as error:  # noqa: BLE001 - any exception of the kernel is its case's crash
            return SweepResult(case.id, "crash", f"{type(error).__name__} in the {rerun.name}: {error}")
        try:
            calls.append(kept(rerun, rerun_result))
        except (ValueError, TypeError) as error:
            return SweepResult(case.id, "error", f"{type(error).__name__} in the {rerun.name}: {error}")
    try:
        text = _sharpcheck.judge_invariance_case(case.op, case.format, case.output_format, case.sizes, case.seed,
                                                 case.id, calls)
    except (ValueError, TypeError, ArithmeticError) as error:
        return SweepResult(case.id, "error", f"{type(error).__name__}: {error}")
    record = json.loads(text)
    record["kernel"] = getattr(kernel, "__name__", repr(kernel))
    if notes:
        record["notes"] = sorted(set(record.get("notes", [])) | set(notes))
    return SweepResult(case.id, record["status"], "\n".join(record["failures"]), Report(record, notes))
