"""Batch invariance and determinism as verdicts (issue 35): the same request must give bitwise the
same output whatever else is in the batch, and the same output twice. sharpcheck.batch_invariance
runs an attention kernel on each request alone (twice), then inside batches of other sizes (1, 15,
16 and 17 by default: either side of a power of two, where kernels switch paths and split counts),
and reports every request whose output changed, bit for bit; every output is also judged against
the correctly rounded reference, since an invariant kernel can still be wrong.

    report = sharpcheck.batch_invariance(my_attention, format="bf16", features={"causal"})
    report.check()   # AssertionError naming the batch sizes and requests that changed

Near-ties are reported too: where a request's two largest outputs in a row are within one ulp of
each other, a one-ulp batch variance can flip an argmax downstream (vLLM's determinism suite)."""

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ._asserts import Report, judge

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class Difference:
    """One request whose output inside a batch of `batch_size` differed from its output alone."""

    def __init__(self, batch_size: int, position: int, request: int, elements: int, max_abs: float):
        self.batch_size = batch_size
        self.position = position  # its index in that batch
        self.request = request
        self.elements = elements  # how many elements differ (bitwise)
        self.max_abs = max_abs

    def __repr__(self) -> str:
        return (f"Difference(batch_size={self.batch_size}, position={self.position}, request={self.request}, "
                f"elements={self.elements}, max_abs={self.max_abs:.3g})")


class InvarianceReport:
    """invariant: no request changed with the batch; deterministic: the same call twice gave the same
    bits; accurate: every output fits the reference (failures lists the cases that do not)."""

    def __init__(self, kernel: str, differences: List[Difference], nondeterministic: List[int],
                 failures: List[str], near_ties: int, runs: int):
        self.kernel = kernel
        self.differences = differences
        self.nondeterministic = nondeterministic
        self.failures = failures
        self.near_ties = near_ties
        self.runs = runs
        self.invariant = not differences
        self.deterministic = not nondeterministic
        self.accurate = not failures
        self.passed = self.invariant and self.deterministic and self.accurate

    def __repr__(self) -> str:
        return (f"InvarianceReport({self.kernel!r}: invariant={self.invariant}, deterministic={self.deterministic}, "
                f"accurate={self.accurate}, {len(self.differences)} changed requests, {self.near_ties} near-ties)")

    def __str__(self) -> str:
        lines = [repr(self)]
        for d in self.differences[:20]:
            lines.append(f"  batch of {d.batch_size}: request {d.request} at position {d.position}: "
                         f"{d.elements} elements differ from the request alone (max |diff| {d.max_abs:.3g})")
        if self.nondeterministic:
            lines.append(f"  requests {self.nondeterministic}: two identical calls gave different bits")
        lines += [f"  inaccurate: {f}" for f in self.failures[:20]]
        return "\n".join(lines)

    def check(self) -> "InvarianceReport":
        if not self.passed:
            raise AssertionError(str(self))
        return self


def _requests(count: int, fmt: str, seed: int, heads: int, kv_heads: int, queries: int, keys: int, dim: int):
    import torch

    dtype = getattr(torch, _DTYPES[fmt])
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(1, h, n, dim, generator=g).to(dtype) for h, n in
                  ((heads, queries), (kv_heads, keys), (kv_heads, keys))) for _ in range(count)]


def _bits(tensor):
    """The tensor's bit patterns (so -0 differs from +0 and NaNs compare by payload)."""
    import torch

    kinds = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.contiguous().view(kinds[tensor.element_size()])


def _near_ties(out, fmt: str) -> int:
    """Rows whose two largest outputs are within one ulp of the format (an argmax a 1-ulp change flips)."""
    import torch

    values = out.double().flatten(0, -2)
    if values.shape[-1] < 2:
        return 0
    top = values.topk(2, dim=-1).values
    ulp = {"fp32": 2.0 ** -23, "bf16": 2.0 ** -7, "fp16": 2.0 ** -10}[fmt] * top[:, 0].abs().clamp_min(1e-30)
    return int(((top[:, 0] - top[:, 1]) <= ulp).sum())


def batch_invariance(kernel: Callable[..., Any], op: str = "attention", *, format: str = "bf16",
                     batch_sizes: Sequence[int] = (1, 15, 16, 17), requests: int = 17, seed: int = 0,
                     heads: int = 4, kv_heads: int = 2, queries: int = 16, keys: int = 256, dim: int = 64,
                     options: Optional[Dict[str, Any]] = None, **judge_options: Any) -> InvarianceReport:
    """Runs kernel(q, k, v, scale=..., **options) (bhsd tensors of the format; GQA when kv_heads <
    heads) on `requests` requests alone, twice, and in batches of each size of batch_sizes (requests
    taken in turn), and reports bitwise changes, nondeterminism and accuracy (sharpcheck.judge on
    every output of the request alone; `options` and judge_options as judge takes them)."""
    import torch

    if op != "attention":
        raise ValueError(f"batch_invariance: op must be 'attention' (the serving kernels' operation), got {op!r}")
    if format not in _DTYPES:
        raise ValueError(f"batch_invariance: format must be one of {sorted(_DTYPES)}, got {format!r}")
    for name, value in [("requests", requests)] + [("batch size", b) for b in batch_sizes]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"batch_invariance: {name} must be a whole number of at least 1, got {value!r}")
    if kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"batch_invariance: kv_heads ({kv_heads}) must divide heads ({heads})")
    call_options = dict(options or {})
    call_options.setdefault("scale", dim ** -0.5)
    pool = _requests(requests, format, seed, heads, kv_heads, queries, keys, dim)
    def run(q, k, v):
        # Copies in (a kernel that writes into its inputs cannot move later runs or the reference),
        # and the result checked: one tensor of the batch's shape, in the format.
        out = kernel(q.clone(), k.clone(), v.clone(), **call_options)
        want = (q.shape[0], heads, queries, dim)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"batch_invariance: the kernel returned {type(out).__name__}; expected one tensor "
                            f"of shape {list(want)}")
        if tuple(out.shape) != want:
            raise ValueError(f"batch_invariance: the kernel returned shape {list(out.shape)} for a batch of "
                             f"{q.shape[0]}; expected {list(want)}")
        if out.dtype != q.dtype:
            raise TypeError(f"batch_invariance: the kernel returned {out.dtype} for {q.dtype} inputs")
        return out

    alone = [run(*r) for r in pool]
    nondeterministic = [i for i, r in enumerate(pool) if not torch.equal(_bits(run(*r)), _bits(alone[i]))]
    failures: List[str] = []
    for i, (q, k, v) in enumerate(pool):
        try:
            judge("attention", q=q, k=k, v=v, out=alone[i], input_format=format, name=f"request {i}",
                  **call_options, **judge_options)
        except AssertionError as failure:
            failures.append(f"request {i}: " + next((line for line in str(failure).splitlines()
                                                       if line.startswith("Worst element")), "fails"))
    differences: List[Difference] = []
    for size in batch_sizes:
        members = [(position, (position + int(size)) % requests) for position in range(int(size))]
        batch = [torch.cat([pool[r][t] for _, r in members]) for t in range(3)]
        out = run(*batch)
        for position, r in members:
            got, want = out[position:position + 1], alone[r]
            changed = _bits(got) != _bits(want)
            if bool(changed.any()):
                differences.append(Difference(int(size), position, r, int(changed.sum()),
                                              float((got.double() - want.double()).abs().max())))
    near = sum(_near_ties(o, format) for o in alone)
    return InvarianceReport(getattr(kernel, "__name__", repr(kernel)), differences, nondeterministic, failures,
                            near, len(pool) * 2 + len(batch_sizes))
