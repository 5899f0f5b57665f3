"""The correctly rounded references: every value returned is the exact real result rounded to
nearest-even in the requested format (the C++ reference's contract, README "The reference's
contract"); they raise ValueError/TypeError on bad input and UndecidedRounding where the
reference cannot decide (never a guess). Inputs are read as values of their dtype, or, with
input_format, integer arrays as that format's bit patterns (fp8 codes as uint8, bf16 as int16)
or codes ("int8"/"uint8"), so that fp8 inputs can be taken to an fp32 result."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from . import _sharpcheck
from ._arrays import as_result, check_format, format_of, host, mask_and_bias


def _row_reference(operation: str, logits: Any, dim: int, theta: float, format: Optional[str],
                   fully_masked_gives_zeros: bool, threads: int, input_format: Optional[str] = None) -> Any:
    notes: List[str] = []
    x = host(logits, "logits", notes)
    fmt = check_format(format or format_of(logits, "logits"))
    options: Dict[str, Any] = {"format": fmt, "dim": dim, "theta": theta, "threads": threads,
                               "fully_masked_gives_zeros": fully_masked_gives_zeros}
    if input_format is not None:
        options["input_format"] = check_format(input_format)
    values = _sharpcheck.reference_rows(operation, x, options)
    return as_result(values, fmt, logits)


def softmax(logits: Any, dim: int = -1, *, theta: float = 1.0, format: Optional[str] = None,
            fully_masked_gives_zeros: bool = False, threads: int = 0,
            input_format: Optional[str] = None) -> Any:
    """softmax(logits / theta) along dim, correctly rounded to format (default: the logits' dtype).
    -inf logits are masked (exactly 0)."""
    return _row_reference("softmax", logits, dim, theta, format, fully_masked_gives_zeros, threads,
                          input_format)


def log_softmax(logits: Any, dim: int = -1, *, theta: float = 1.0, format: Optional[str] = None,
                fully_masked_gives_zeros: bool = False, threads: int = 0,
                input_format: Optional[str] = None) -> Any:
    """log_softmax(logits / theta) along dim, correctly rounded (-inf where masked)."""
    return _row_reference("log_softmax", logits, dim, theta, format, fully_masked_gives_zeros, threads,
                          input_format)


def logsumexp(logits: Any, dim: int = -1, *, theta: float = 1.0, format: Optional[str] = None,
              fully_masked_gives_zeros: bool = False, threads: int = 0,
              input_format: Optional[str] = None) -> Any:
    """theta * log(sum(exp(logits / theta))) along dim (the axis removed), correctly rounded."""
    return _row_reference("logsumexp", logits, dim, theta, format, fully_masked_gives_zeros, threads,
                          input_format)


def entropy(logits: Any, dim: int = -1, *, theta: float = 1.0, format: Optional[str] = None,
            fully_masked_gives_zeros: bool = False, threads: int = 0,
            input_format: Optional[str] = None) -> Any:
    """The entropy in nats of softmax(logits / theta) along dim (the axis removed), correctly
    rounded; UndecidedRounding where the reference's argument is incomplete (README)."""
    return _row_reference("entropy", logits, dim, theta, format, fully_masked_gives_zeros, threads,
                          input_format)


def _backward_reference(operation: str, dy: Any, logits: Any, dim: int, theta: float, format: Optional[str],
                        fully_masked_gives_zeros: bool, threads: int, input_format: Optional[str] = None) -> Any:
    notes: List[str] = []
    fmt = check_format(format or format_of(dy, "dy"))
    options: Dict[str, Any] = {"format": fmt, "dim": dim, "theta": theta, "threads": threads,
                               "fully_masked_gives_zeros": fully_masked_gives_zeros}
    if input_format is not None:
        options["input_format"] = check_format(input_format)
    values = _sharpcheck.reference_backward(operation, host(dy, "dy", notes), host(logits, "logits", notes), options)
    return as_result(values, fmt, dy)


def softmax_backward(dy: Any, logits: Any, dim: int = -1, *, theta: float = 1.0, format: Optional[str] = None,
                     fully_masked_gives_zeros: bool = False, threads: int = 0,
                     input_format: Optional[str] = None) -> Any:
    """The gradient of sum(dy * softmax(logits / theta)) with respect to the logits, along dim:
    y (dy - <dy, y>) / theta, correctly rounded (exactly 0 where it is 0; masked entries 0)."""
    return _backward_reference("softmax_backward", dy, logits, dim, theta, format, fully_masked_gives_zeros, threads,
                               input_format)


def log_softmax_backward(dy: Any, logits: Any, dim: int = -1, *, theta: float = 1.0, format: Optional[str] = None,
                         fully_masked_gives_zeros: bool = False, threads: int = 0,
                         input_format: Optional[str] = None) -> Any:
    """The gradient of sum(dy * log_softmax(logits / theta)) with respect to the logits, along dim:
    (dy - y sum(dy)) / theta, correctly rounded."""
    return _backward_reference("log_softmax_backward", dy, logits, dim, theta, format, fully_masked_gives_zeros,
                               threads, input_format)


def attention_options(*, causal: bool, align: str, scale: Optional[float], window: Any, softcap: float,
                      sinks: Any, alibi_slopes: Any, attn_mask: Any, layout: str, query_lengths: Any,
                      key_lengths: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, lse_base2: bool, theta: float,
                      fully_masked: str, threads: int, notes: List[str]) -> Dict[str, Any]:
    """The C++ core's options for an attention problem (shared by attention and its assert)."""
    keep, bias = mask_and_bias(attn_mask, notes)
    given = {"causal": causal, "align": align, "scale": scale, "window": window, "softcap": softcap,
             "sinks": _numbers(sinks), "alibi_slopes": _numbers(alibi_slopes), "mask": keep, "bias": bias,
             "layout": layout, "query_lengths": _numbers(query_lengths), "key_lengths": _numbers(key_lengths),
             "cu_seqlens_q": _numbers(cu_seqlens_q), "cu_seqlens_k": _numbers(cu_seqlens_k),
             "lse_base2": lse_base2, "theta": theta, "fully_masked": fully_masked, "threads": threads}
    return {key: value for key, value in given.items() if value is not None}


def _numbers(values: Any) -> Optional[list]:
    if values is None:
        return None
    if hasattr(values, "tolist"):
        if hasattr(values, "detach"):
            values = values.detach().cpu()
        return values.tolist()
    return list(values)


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, align: str = "top-left",
              scale: Optional[float] = None, window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
              sinks: Any = None, alibi_slopes: Any = None, attn_mask: Any = None, layout: str = "bhsd",
              query_lengths: Any = None, key_lengths: Any = None, cu_seqlens_q: Any = None,
              cu_seqlens_k: Any = None, return_lse: bool = False, lse_base2: bool = False, theta: float = 1.0,
              fully_masked: str = "zeros", format: Optional[str] = None, threads: int = 0,
              return_weights: bool = False, input_format: Optional[str] = None) -> Any:
    """softmax(scale * q k^T + masks and modifiers) v, correctly rounded to format, for one head's
    2-D matrices or bhsd / bshd / packed tensors (GQA from k's head count); with return_lse, the
    pair (out, lse) with lse in fp32 (natural log, or base 2). With return_weights, the attention
    weights P come last ((out, p) or (out, lse, p)), each correctly rounded to format, shaped
    [batch, heads, queries, keys] ([queries, keys] for 2-D inputs; packed batches padded to the
    longest lengths); unseen keys and padding hold 0, and a sink's share is not listed."""
    notes: List[str] = []
    fmt = check_format(format or format_of(q, "q"))
    options = attention_options(causal=causal, align=align, scale=scale, window=window, softcap=softcap,
                                sinks=sinks, alibi_slopes=alibi_slopes, attn_mask=attn_mask, layout=layout,
                                query_lengths=query_lengths, key_lengths=key_lengths, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, lse_base2=lse_base2, theta=theta,
                                fully_masked=fully_masked, threads=threads, notes=notes)
    options.update(format=fmt, return_lse=return_lse, return_weights=bool(return_weights))
    if input_format is not None:
        options["input_format"] = check_format(input_format)
    out, lse, weights = _sharpcheck.reference_attention(host(q, "q", notes), host(k, "k", notes),
                                                        host(v, "v", notes), options)
    results = [as_result(out, fmt, q)]
    if return_lse:
        results.append(as_result(lse, "fp32", q))
    if return_weights:
        results.append(as_result(weights, fmt, q))
    return tuple(results) if len(results) > 1 else results[0]


def attention_backward(q: Any, k: Any, v: Any, dout: Any, *, d_lse: Any = None, causal: bool = False,
                       align: str = "top-left", scale: Optional[float] = None,
                       window: Optional[Tuple[int, int]] = None, softcap: float = 0.0, sinks: Any = None,
                       alibi_slopes: Any = None, attn_mask: Any = None, layout: str = "bhsd",
                       query_lengths: Any = None, key_lengths: Any = None, cu_seqlens_q: Any = None,
                       cu_seqlens_k: Any = None, theta: float = 1.0, format: Optional[str] = None,
                       threads: int = 0, input_format: Optional[str] = None) -> Tuple[Any, Any, Any, Any]:
    """(dq, dk, dv, d_sinks): the gradients of attention's output against dout (and of its
    log-sum-exp against d_lse, if given), correctly rounded to format, with every layout, mask and
    modifier of sharpcheck.attention (GQA: dk and dv sum over the heads sharing them). Padded
    positions get 0, and so do queries that see no key. d_sinks (per head) is None without sinks,
    and for a batch above 1 (each sums over the batch and would not be rounded once)."""
    notes: List[str] = []
    fmt = check_format(format or format_of(q, "q"))
    options = attention_options(causal=causal, align=align, scale=scale, window=window, softcap=softcap,
                                sinks=sinks, alibi_slopes=alibi_slopes, attn_mask=attn_mask, layout=layout,
                                query_lengths=query_lengths, key_lengths=key_lengths, cu_seqlens_q=cu_seqlens_q,
                                cu_seqlens_k=cu_seqlens_k, lse_base2=False, theta=theta, fully_masked="zeros",
                                threads=threads, notes=notes)
    options.update(format=fmt)
    if input_format is not None:
        options["input_format"] = check_format(input_format)
    lse_gradient = None if d_lse is None else host(d_lse, "d_lse", notes)
    dq, dk, dv, d_sinks = _sharpcheck.reference_attention_backward(
        host(q, "q", notes), host(k, "k", notes), host(v, "v", notes), host(dout, "dout", notes), lse_gradient,
        options)
    return as_result(dq, fmt, q), as_result(dk, fmt, k), as_result(dv, fmt, v), d_sinks
