# Type stubs for editors and type checkers: the public API of the sharpcheck package.
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

ArrayLike = Any  # NumPy arrays, torch tensors, JAX/CuPy arrays (DLPack), buffers, lists
FORMATS: Tuple[str, ...]

class UndecidedRounding(ArithmeticError): ...

class Report:
    record: Dict[str, Any]
    notes: List[str]
    reference: Optional[Tuple[Any, Any, Any, Any]]
    status: str
    passed: bool
    inconclusive: bool
    format: str
    elements: int
    max_ulp: int
    mean_ulp: float
    bound_ratio: float
    statistical_ratio: float
    bias_ratio: float
    proven_mismatched: int
    statistical_mismatched: int
    mismatched: int
    max_abs_error: float
    max_rel_error: float
    worst_array: str
    worst_index: Tuple[int, ...]
    failures: List[str]
    recipe: str  # attention: the precision recipe the verdict is under ("flash_bf16", ...)
    recipe_note: str  # "pass as flash_bf16: ..." or why none fits
    row_scale_ratio: float  # the row-scale (gradient-scale) test's worst ratio, fails above 1
    def to_json(self) -> str: ...
    def message(self, what: str, tolerance: str) -> str: ...

def softmax(logits: ArrayLike, dim: int = ..., *, theta: float = ..., format: Optional[str] = ...,
            fully_masked_gives_zeros: bool = ..., threads: int = ...,
            input_format: Optional[str] = ...) -> Any: ...
def log_softmax(logits: ArrayLike, dim: int = ..., *, theta: float = ..., format: Optional[str] = ...,
                fully_masked_gives_zeros: bool = ..., threads: int = ...,
            input_format: Optional[str] = ...) -> Any: ...
def logsumexp(logits: ArrayLike, dim: int = ..., *, theta: float = ..., format: Optional[str] = ...,
              fully_masked_gives_zeros: bool = ..., threads: int = ...,
            input_format: Optional[str] = ...) -> Any: ...
def entropy(logits: ArrayLike, dim: int = ..., *, theta: float = ..., format: Optional[str] = ...,
            fully_masked_gives_zeros: bool = ..., threads: int = ...,
            input_format: Optional[str] = ...) -> Any: ...
def softmax_backward(dy: ArrayLike, logits: ArrayLike, dim: int = ..., *, theta: float = ...,
                     format: Optional[str] = ..., fully_masked_gives_zeros: bool = ..., threads: int = ...,
            input_format: Optional[str] = ...) -> Any: ...
def log_softmax_backward(dy: ArrayLike, logits: ArrayLike, dim: int = ..., *, theta: float = ...,
                         format: Optional[str] = ..., fully_masked_gives_zeros: bool = ...,
                         threads: int = ..., input_format: Optional[str] = ...) -> Any: ...
def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = ..., align: str = ...,
              scale: Optional[float] = ..., window: Optional[Tuple[Optional[int], Optional[int]]] = ...,
              softcap: float = ..., sinks: Optional[Sequence[float]] = ...,
              alibi_slopes: Optional[Sequence[float]] = ..., attn_mask: Optional[ArrayLike] = ...,
              layout: str = ..., query_lengths: Optional[Sequence[int]] = ...,
              key_lengths: Optional[Sequence[int]] = ..., cu_seqlens_q: Optional[Sequence[int]] = ...,
              cu_seqlens_k: Optional[Sequence[int]] = ..., return_lse: bool = ..., lse_base2: bool = ...,
              theta: float = ..., fully_masked: str = ..., format: Optional[str] = ...,
              threads: int = ..., return_weights: bool = ..., input_format: Optional[str] = ...) -> Any: ...
def attention_backward(q: ArrayLike, k: ArrayLike, v: ArrayLike, dout: ArrayLike, *,
                       d_lse: Optional[ArrayLike] = ..., causal: bool = ..., align: str = ...,
                       scale: Optional[float] = ..., window: Optional[Tuple[Optional[int], Optional[int]]] = ...,
                       softcap: float = ..., sinks: Optional[Sequence[float]] = ...,
                       alibi_slopes: Optional[Sequence[float]] = ..., attn_mask: Optional[ArrayLike] = ...,
                       layout: str = ..., query_lengths: Optional[Sequence[int]] = ...,
                       key_lengths: Optional[Sequence[int]] = ..., cu_seqlens_q: Optional[Sequence[int]] = ...,
                       cu_seqlens_k: Optional[Sequence[int]] = ..., theta: float = ...,
                       format: Optional[str] = ..., threads: int = ...,
                       input_format: Optional[str] = ...) -> Tuple[Any, Any, Any, Any]: ...
def assert_softmax_close(actual: ArrayLike, logits: ArrayLike, *, dim: int = ..., theta: float = ...,
                         format: Optional[str] = ..., input_format: Optional[str] = ...,
                         tolerance: Optional[str] = ..., proven_only: bool = ..., log_softmax: bool = ...,
                         name: Optional[str] = ..., msg: Optional[str] = ..., threads: int = ...) -> Report: ...
def assert_log_softmax_close(actual: ArrayLike, logits: ArrayLike, *, dim: int = ..., theta: float = ...,
                             format: Optional[str] = ..., input_format: Optional[str] = ...,
                             tolerance: Optional[str] = ..., proven_only: bool = ..., name: Optional[str] = ...,
                             msg: Optional[str] = ..., threads: int = ...) -> Report: ...
def assert_attention_close(out: ArrayLike, q: ArrayLike, k: ArrayLike, v: ArrayLike, *,
                           lse: Optional[ArrayLike] = ..., causal: bool = ..., align: str = ...,
                           scale: Optional[float] = ...,
                           window: Optional[Tuple[Optional[int], Optional[int]]] = ..., softcap: float = ...,
                           sinks: Optional[Sequence[float]] = ..., alibi_slopes: Optional[Sequence[float]] = ...,
                           attn_mask: Optional[ArrayLike] = ..., layout: str = ...,
                           query_lengths: Optional[Sequence[int]] = ..., key_lengths: Optional[Sequence[int]] = ...,
                           cu_seqlens_q: Optional[Sequence[int]] = ..., cu_seqlens_k: Optional[Sequence[int]] = ...,
                           lse_base2: bool = ..., theta: float = ..., fully_masked: str = ...,
                           format: Optional[str] = ..., input_format: Optional[str] = ...,
                           tolerance: Optional[str] = ..., proven_only: bool = ..., name: Optional[str] = ...,
                           msg: Optional[str] = ..., threads: int = ...) -> Report: ...
def assert_attention_backward_close(dq: ArrayLike, dk: ArrayLike, dv: ArrayLike, q: ArrayLike, k: ArrayLike,
                                    v: ArrayLike, dout: ArrayLike, *, d_lse: Optional[ArrayLike] = ...,
                                    d_sinks: Optional[Sequence[float]] = ..., d: Optional[ArrayLike] = ...,
                                    causal: bool = ..., align: str = ...,
                                    scale: Optional[float] = ...,
                                    window: Optional[Tuple[Optional[int], Optional[int]]] = ...,
                                    softcap: float = ..., sinks: Optional[Sequence[float]] = ...,
                                    alibi_slopes: Optional[Sequence[float]] = ...,
                                    attn_mask: Optional[ArrayLike] = ..., layout: str = ...,
                                    query_lengths: Optional[Sequence[int]] = ...,
                                    key_lengths: Optional[Sequence[int]] = ...,
                                    cu_seqlens_q: Optional[Sequence[int]] = ...,
                                    cu_seqlens_k: Optional[Sequence[int]] = ...,
                                    theta: float = ..., format: Optional[str] = ..., input_format: Optional[str] = ...,
                                    tolerance: Optional[str] = ..., proven_only: bool = ..., name: Optional[str] = ...,
                                    msg: Optional[str] = ..., threads: int = ...,
                                    return_reference: bool = ...) -> Report: ...
def ops() -> List[Dict[str, Any]]: ...
def judge(op: str, *, msg: Optional[str] = ..., **tensors_and_options: Any) -> Report: ...

class Case:
    op: str
    format: str
    output_format: str
    id: str
    needs: Tuple[str, ...]
    options: Dict[str, Any]
    judge_options: Dict[str, Any]
    inputs: Dict[str, Any]
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    def results(self, result: Any) -> Dict[str, Any]: ...
    def judge(self, result: Any, **judge_options: Any) -> Report: ...

class SweepResult:
    id: str
    status: str  # pass, fail, inconclusive, crash (the kernel raised) or error (not an answer)
    message: str
    report: Optional[Report]

class SweepReport:
    op: str
    kernel: str
    results: List[SweepResult]
    failures: List[SweepResult]
    passed: bool
    def counts(self) -> Dict[str, int]: ...
    def check(self) -> "SweepReport": ...

def cases(op: str, *, format: str = ..., sizes: Sequence[int] = ..., seed: int = ...,
          features: Iterable[str] = ..., array: str = ..., match: Optional[str] = ...,
          output_format: Optional[str] = ...) -> List[Case]: ...
def sweep(kernel: Callable[..., Any], op: str, *, format: str = ..., sizes: Sequence[int] = ..., seed: int = ...,
          features: Iterable[str] = ..., array: str = ..., match: Optional[str] = ...,
          output_format: Optional[str] = ..., **judge_options: Any) -> SweepReport: ...
def probes(kernel: Callable[..., Any], op: str = ..., *, format: str = ..., sizes: Sequence[int] = ..., seed: int = ...,
           features: Iterable[str] = ..., array: str = ..., **judge_options: Any) -> SweepReport: ...

class AuditEntry:
    name: str
    what: str
    problem: str
    check_passed: bool
    check_note: str
    sharpcheck_passed: bool
    honest: bool

class AuditReport:
    op: str
    format: str
    check: str
    entries: List[AuditEntry]
    passed_wrong: List[str]
    caught: List[str]
    honest_rejected: List[str]
    sharpcheck_missed: List[str]
    sharpcheck_rejected_honest: List[str]

def audit_tolerance(op: str, check: Optional[Callable[..., Any]] = ..., *, atol: Optional[float] = ...,
                    rtol: Optional[float] = ..., cosine: Optional[float] = ..., rmse: Optional[float] = ...,
                    format: str = ..., seed: int = ...) -> AuditReport: ...

class Difference:
    batch_size: int
    position: int
    request: int
    elements: int
    max_abs: float

class InvarianceReport:
    kernel: str
    differences: List[Difference]
    nondeterministic: List[int]
    failures: List[str]
    near_ties: int
    runs: int
    invariant: bool
    deterministic: bool
    accurate: bool
    passed: bool
    def check(self) -> "InvarianceReport": ...

def batch_invariance(kernel: Callable[..., Any], op: str = ..., *, format: str = ...,
                     batch_sizes: Sequence[int] = ..., requests: int = ..., seed: int = ..., heads: int = ...,
                     kv_heads: int = ..., queries: int = ..., keys: int = ..., dim: int = ...,
                     options: Optional[Dict[str, Any]] = ..., **judge_options: Any) -> InvarianceReport: ...
