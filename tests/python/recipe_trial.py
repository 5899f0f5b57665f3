#!/usr/bin/env python3
"""A user trial of sharpcheck on attention kernels written the way kernel engineers write them:
PyTorch on the CPU, FlashAttention-2-style tiled forwards and backwards, PyTorch's math path in
bf16/fp16, fp32 autograd, and buggy twins (each one small mutation of an honest kernel). Every
kernel's outputs are judged side by side by

  sc-default   sharpcheck.assert_attention_close / assert_attention_backward_close, no tolerance=
  sc-declared  the same with tolerance=<the recipe the design implies> ("n/a" where the build
               refuses the name with anything but an AssertionError)
  assert_close torch.testing.assert_close(out, ref64.to(out.dtype)) with the dtype's defaults
  FA-rule      FlashAttention's tests: max|out - ref64| <= 2 max|math_lowp - ref64| + 1e-5
               (gradients 3x)
  SDPA-rule    test_transformers.py's get_tolerances: atol/rtol from the low-precision math
               path's deviation times fudge factors (out 4, dQ 180, dK 16, dV 4)

The torch judges see the output (or the gradients) only, never the log-sum-exp, as those tests do.
Honest kernels must pass, buggy ones fail; the script exits 1 when sharpcheck's default judgement
gets any kernel wrong (or errors), else 0.

    PYTHONPATH=build/python python3 tests/python/recipe_trial.py [--quick] [--markdown F] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python"))


def import_sharpcheck(tries: int = 10, wait_s: float = 30.0):
    """The module may be rebuilt while this runs: retry a failed import a few times."""
    for attempt in range(tries):
        try:
            import sharpcheck  # noqa: F401
            return sharpcheck
        except ImportError as error:
            if attempt == tries - 1:
                raise
            print(f"import sharpcheck failed ({error}); retrying in {wait_s:.0f} s", file=sys.stderr)
            time.sleep(wait_s)


sharpcheck = import_sharpcheck()
torch.set_num_threads(2)

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
NAME = {BF16: "bf16", FP16: "fp16", FP32: "fp32", FP64: "fp64"}
LOG2E = 1.0 / math.log(2.0)


# ----------------------------------------------------------------------------------------------
# Problem options (the semantics sharpcheck is told, and the references compute)
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Opts:
    causal: bool = False
    align: str = "top-left"                  # or "bottom-right"
    window: Optional[Tuple[int, int]] = None  # FlashAttention's window_size (left, right)
    softcap: float = 0.0
    sinks: Optional[Tuple[float, ...]] = None        # one per query head, natural-log units
    alibi: Optional[Tuple[float, ...]] = None        # one per query head
    layout: str = "bhsd"                     # how the kernel's tensors are stored ("bshd": flash_attn_func)
    # The math path as PyTorch before 2.5 computes it: q and k each scaled by sqrt(scale) in the
    # input format, then one product rounded to it (instead of the product, then the scale).
    prescale: bool = False

    def sharpcheck_kwargs(self) -> Dict[str, Any]:
        kw: Dict[str, Any] = {"causal": self.causal, "align": self.align, "layout": self.layout}
        if self.window is not None:
            kw["window"] = self.window
        if self.softcap:
            kw["softcap"] = self.softcap
        if self.sinks is not None:
            kw["sinks"] = list(self.sinks)
        if self.alibi is not None:
            kw["alibi_slopes"] = list(self.alibi)
        return kw


def visible(sq: int, sk: int, o: Opts, align: Optional[str] = None, window_left_shift: int = 0) -> torch.Tensor:
    """[sq, sk] bool: query i sees key j (tensor/head_scores.hpp's definition)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = 0 if (align or o.align) == "top-left" else sk - sq
    vis = torch.ones(sq, sk, dtype=torch.bool)
    if o.causal:
        vis &= j <= i + diag
    if o.window is not None:
        left, right = o.window
        if left is not None:
            vis &= j >= i + diag - left + window_left_shift
        if right is not None:
            vis &= j <= i + diag + right
    return vis


def alibi_bias(sq: int, sk: int, slopes, align: str) -> torch.Tensor:
    """[H, sq, sk] float64: -slope_h |i + diag - j|."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    diag = 0 if align == "top-left" else sk - sq
    dist = (i + diag - j).abs().to(FP64)
    return -torch.tensor(slopes, dtype=FP64)[:, None, None] * dist


def to_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.transpose(1, 2) if layout == "bshd" else x


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.shape[1], dim=1) if x.shape[1] != heads else x


# ----------------------------------------------------------------------------------------------
# The math path (PyTorch's SDPA math: scores in the tensors' dtype, softmax in fp32, rounded)
# ----------------------------------------------------------------------------------------------

def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in the tensors' dtype with fp32 accumulation, rounded once, as a GPU GEMM (cuBLAS) does
    for bf16 and fp16. Not torch's own CPU GEMM: torch 1.13's bf16 `a @ b` and `a.T @ b` accumulate
    in bf16 (up to 68 units of relative error against the fp32-accumulated product on 64 x 64 tiles),
    which is a different design (a bf16 accumulator) from the math path the recipes describe;
    autograd through the fp32 product rounds each gradient to the dtype once, as that GEMM would."""
    return (a.float() @ b.float()).to(a.dtype) if a.dtype in (BF16, FP16) else a @ b


def math_attention(q, k, v, o: Opts, dtype, return_lse=False):
    """q, k, v bhsd (any dtype, converted to dtype with autograd kept). fp64: a plain fp64 reference;
    bf16/fp16: the math path, every tensor in dtype (each elementwise op computed in fp32 and
    rounded, as torch's bf16/fp16 kernels do) and the softmax in fp32, rounded; fp32: fp32 throughout."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    lowp = dtype in (BF16, FP16)
    work = FP32 if lowp else dtype
    rnd = (lambda x: x.to(dtype)) if lowp else (lambda x: x)  # noqa: E731
    heads, sq, sk = q.shape[1], q.shape[2], k.shape[2]
    k, v = expand_kv(k, heads), expand_kv(v, heads)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if o.prescale and lowp:
        root = math.sqrt(scale)
        s = mm(rnd(q.to(work) * root), rnd(k.to(work) * root).transpose(-1, -2))
    else:
        s = rnd(mm(q, k.transpose(-1, -2)).to(work) * scale)
    if o.softcap:
        s = rnd(rnd(torch.tanh(rnd(s.to(work) / o.softcap)).to(work)).to(work) * o.softcap)
    if o.alibi is not None:
        s = rnd(s.to(work) + alibi_bias(sq, sk, o.alibi, o.align).to(dtype).to(work))
    s = s.masked_fill(~visible(sq, sk, o), float("-inf"))
    if o.sinks is not None:
        sink = torch.tensor(o.sinks, dtype=dtype)[None, :, None, None].expand(s.shape[0], heads, sq, 1)
        s = torch.cat([s, sink], dim=-1)
    soft_dtype = FP64 if dtype == FP64 else FP32
    p = torch.softmax(s.to(soft_dtype), dim=-1).to(dtype)
    if o.sinks is not None:
        p = p[..., :-1]
    out = mm(p, v)
    if return_lse:
        return out, torch.logsumexp(s.to(soft_dtype), dim=-1)
    return out


def math_gradients(q, k, v, dout, o: Opts, dtype):
    """(out, dq, dk, dv) by autograd on the math path in dtype (grads in dtype)."""
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out = math_attention(*leaves, o, dtype)
    out.backward(dout.to(dtype))
    return (out.detach(),) + tuple(leaf.grad.detach() for leaf in leaves)


# ----------------------------------------------------------------------------------------------
# The kernels
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bug:
    """The mutations; every field off is the honest kernel."""
    half_do_in_d: bool = False       # (a) D = rowsum(dO * O) over the first half of the head dim
    dq_scaled_batch2: float = 0.0   # (b) dq[1:] *= 1 + this (0: no bug)
    nan_tails: bool = False          # (c) output rows past the last full 128 block are NaN
    swapped_align: bool = False      # (d) bottom-right causal when asked top-left
    cap_after_mask: bool = False     # (e) masked with -1e4, then soft-capped
    gqa_modulo: bool = False         # (f) query head h reads KV head h % kv_heads
    lse_log2: bool = False           # (g) LSE in base 2
    sink_log2e: bool = False         # (h) sink multiplied by log2(e)
    window_off_by_one: bool = False  # (i) left window one key short
    alibi_reversed: bool = False     # (j) slopes in reverse head order
    skip_late_rescale: bool = False  # (k) acc not rescaled when the max grows in tile >= 2
    l_bf16: bool = False             # (l) running denominator rounded to bf16 after every element
    lse_offset: bool = False         # (m) lse + 1e-3
    acc_fp16: bool = False           # (n) accumulator kept in fp16
    view_strides: bool = False       # (o) bshd read as bhsd with .view


HONEST = Bug()


def fa2_forward(q, k, v, o: Opts, *, block=64, out_dtype=None, bug: Bug = HONEST):
    """FlashAttention-2 forward: tiles of keys, online softmax in fp32, P rounded to the input dtype
    before P V (fp32 accumulation), out = acc / l, lse = m + log(l) (natural log, fp32)."""
    dtype = q.dtype
    out_dtype = out_dtype or dtype
    if o.layout == "bshd":
        if bug.view_strides:  # the bug: the [B, S, H, D] storage read as [B, H, S, D]
            q, k, v = (x.reshape(x.shape[0], x.shape[2], x.shape[1], x.shape[3]) for x in (q, k, v))
        else:
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    batch, heads, sq, d = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    head_index = torch.arange(heads)
    kv_of = head_index % kv_heads if bug.gqa_modulo else head_index // (heads // kv_heads)
    qf, kf, vf = q.float(), k.float()[:, kv_of], v.float()[:, kv_of]
    scale = 1.0 / math.sqrt(d)
    align = o.align
    if bug.swapped_align:
        align = "bottom-right" if align == "top-left" else "top-left"
    vis_all = visible(sq, sk, o, align=align, window_left_shift=1 if bug.window_off_by_one else 0)
    if o.alibi is not None:
        slopes = tuple(reversed(o.alibi)) if bug.alibi_reversed else o.alibi
        bias_all = alibi_bias(sq, sk, slopes, align).float()
    m = torch.full((batch, heads, sq, 1), float("-inf"))
    l = torch.zeros(batch, heads, sq, 1)
    acc = torch.zeros(batch, heads, sq, vf.shape[-1])
    for tile, t0 in enumerate(range(0, sk, block)):
        t1 = min(t0 + block, sk)
        s = (qf @ kf[:, :, t0:t1].transpose(-1, -2)) * scale
        vis = vis_all[:, t0:t1]
        if bug.cap_after_mask:
            s = s.masked_fill(~vis, -1e4)
            s = o.softcap * torch.tanh(s / o.softcap)
        else:
            if o.softcap:
                s = o.softcap * torch.tanh(s / o.softcap)
            if o.alibi is not None:
                s = s + bias_all[:, :, t0:t1]
            s = s.masked_fill(~vis, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe)
        if bug.l_bf16:
            l = (alpha * l).bfloat16().float()
            for j in range(p.shape[-1]):
                l = (l + p[..., j:j + 1]).bfloat16().float()
        else:
            l = alpha * l + p.sum(dim=-1, keepdim=True)
        pv = p.to(dtype).float() @ vf[:, :, t0:t1]
        if bug.skip_late_rescale and tile >= 2:
            acc = acc + pv
        else:
            acc = acc * alpha + pv
        if bug.acc_fp16:
            acc = acc.half().float()
        m = m_new
    if o.sinks is not None:
        sinks = torch.tensor(o.sinks, dtype=FP32)
        if bug.sink_log2e:
            sinks = sinks * LOG2E
        sinks = sinks[None, :, None, None]
        m_final = torch.maximum(m, sinks)
        l = l * torch.exp(m - m_final) + torch.exp(sinks - m_final)
        acc = acc * torch.exp(m - m_final)
        m = m_final
    out = (acc / l).to(out_dtype)
    lse = (m + torch.log(l)).squeeze(-1)
    if bug.lse_log2:
        lse = lse * LOG2E
    if bug.lse_offset:
        lse = lse + 1e-3
    if bug.nan_tails and sq % 128:
        out[:, :, (sq // 128) * 128:] = float("nan")
    if o.layout == "bshd":
        out = (out.reshape(batch, sq, heads, -1) if bug.view_strides else out.transpose(1, 2)).contiguous()
    return out, lse


def fa2_backward(q, k, v, dout, o: Opts, *, bug: Bug = HONEST):
    """FlashAttention-2 backward (causal and GQA; bhsd): P recomputed from the forward's LSE in fp32,
    dV = P^T dO with P in the input dtype, D = rowsum(dO * O) with O the forward's rounded output,
    dS = P (dP - D) rounded to the input dtype before dQ and dK; fp32 accumulation, results rounded."""
    dtype = q.dtype
    out, lse = fa2_forward(q, k, v, o)
    batch, heads, sq, d = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    group = heads // kv_heads
    qf, kf, vf = q.float(), expand_kv(k, heads).float(), expand_kv(v, heads).float()
    dof = dout.float()
    scale = 1.0 / math.sqrt(d)
    s = (qf @ kf.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible(sq, sk, o), float("-inf"))
    p = torch.exp(s - lse[..., None])
    dv = p.to(dtype).float().transpose(-1, -2) @ dof
    dp = dof @ vf.transpose(-1, -2)
    do_for_d = dof
    if bug.half_do_in_d:
        do_for_d = dof.clone()
        do_for_d[..., d // 2:] = 0
    big_d = (do_for_d * out.float()).sum(dim=-1, keepdim=True)
    ds = (p * (dp - big_d)).to(dtype).float()
    dq = (ds @ kf) * scale
    dk = (ds.transpose(-1, -2) @ qf) * scale
    if bug.dq_scaled_batch2:
        dq[1:] *= 1 + bug.dq_scaled_batch2
    fold = lambda g: g.view(batch, kv_heads, group, sk, -1).sum(dim=2)  # noqa: E731
    return dq.to(dtype), fold(dk).to(dtype), fold(dv).to(dtype)


def math_forward(q, k, v, o: Opts):
    return math_attention(to_bhsd(q, o.layout), to_bhsd(k, o.layout), to_bhsd(v, o.layout), o, q.dtype), None


def math_backward(q, k, v, dout, o: Opts):
    return math_gradients(q, k, v, dout, o, q.dtype)[1:]


# ----------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    batch: int = 2
    heads: int = 2
    kv_heads: int = 2
    sq: int = 256
    sk: Optional[int] = None
    d: int = 64


def make_inputs(seed: int, dtype, shape: Shape, special: str = "", layout: str = "bhsd"):
    g = torch.Generator().manual_seed(seed)
    sk = shape.sk or shape.sq
    q = torch.randn(shape.batch, shape.heads, shape.sq, shape.d, generator=g)
    k = torch.randn(shape.batch, shape.kv_heads, sk, shape.d, generator=g)
    v = torch.randn(shape.batch, shape.kv_heads, sk, shape.d, generator=g)
    dout = torch.randn(shape.batch, shape.heads, shape.sq, shape.d, generator=g)
    if special == "large_logits":  # logits of standard deviation ~20: where a soft-cap matters
        q, k = q * 4.5, k * 4.5
    elif special == "late_max":  # a key near the end that every query scores highly: the max grows late
        u = torch.randn(shape.d, generator=g)
        u = u / u.norm()
        q = q + 2.0 * u
        k[:, :, sk - 7] = 16.0 * u
    elif special == "big_v":  # values around 4000: the unnormalised accumulator passes fp16's 65504
        v = 4000.0 + 200.0 * v
    q, k, v, dout = (x.to(dtype) for x in (q, k, v, dout))
    if layout == "bshd":
        q, k, v, dout = (x.transpose(1, 2).contiguous() for x in (q, k, v, dout))
    return q, k, v, dout


# ----------------------------------------------------------------------------------------------
# The cases
# ----------------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    design: str            # "fa2", "fa2-bwd", "math", "math-bwd", "fp32", "fp32-bwd"
    honest: bool
    dtype: Any
    shape: Shape
    opts: Opts = Opts()
    seed: int = 0
    special: str = ""
    backward: bool = False
    quick: bool = False
    bug: Bug = HONEST
    block: int = 64
    out_dtype: Any = None
    pass_lse: bool = True
    note: str = ""
    twin: str = ""         # a bug's honest kernel

    def recipe(self) -> str:
        t = NAME[self.dtype]
        if self.design.startswith("fp32"):
            return "attention_backward_flash" if self.backward else "attention_fp32"
        kind = "flash" if self.design.startswith("fa2") else "math"
        return f"backward_{kind}_{t}" if self.backward else f"{kind}_{t}"

    def run(self, q, k, v, dout):
        if self.design == "fa2":
            out, lse = fa2_forward(q, k, v, self.opts, block=self.block, out_dtype=self.out_dtype, bug=self.bug)
            return {"out": out, "lse": lse if self.pass_lse else None}
        if self.design in ("math", "fp32"):
            return {"out": math_forward(q, k, v, self.opts)[0], "lse": None}
        if self.design == "fa2-bwd":
            return dict(zip(("dq", "dk", "dv"), fa2_backward(q, k, v, dout, self.opts, bug=self.bug)))
        if self.design in ("math-bwd", "fp32-bwd"):
            return dict(zip(("dq", "dk", "dv"), math_backward(q, k, v, dout, self.opts)))
        raise ValueError(self.design)


S = Shape()
S200 = Shape(sq=200)
S300 = Shape(sq=300)
GQA200 = Shape(heads=4, kv_heads=2, sq=200)
GQA256 = Shape(heads=4, kv_heads=2)
RECT = Shape(sq=200, sk=256)
C = Opts(causal=True)
SOFTCAP = Opts(causal=True, softcap=30.0)
SINKS = Opts(sinks=(2.0, 1.0))
WINDOW = Opts(window=(64, 0))
ALIBI = Opts(causal=True, alibi=(2.0 ** -4, 2.0 ** -8))
BSHD = Opts(layout="bshd")
PRESCALE = Opts(prescale=True)
PRESCALE_CAUSAL = Opts(causal=True, prescale=True)


def cases() -> List[Case]:
    fa = lambda name, dtype, shape, **kw: Case(name, "fa2", True, dtype, shape, **kw)  # noqa: E731
    honest = [
        fa("fa2_bf16", BF16, S, seed=1, quick=True),
        fa("fa2_bf16_causal_s200_b128", BF16, S200, opts=C, seed=2, block=128, quick=True),
        fa("fa2_fp16_s300", FP16, S300, seed=3),
        fa("fa2_bf16_out_fp32", BF16, S, seed=4, out_dtype=FP32),
        fa("fa2_fp16_out_fp32_causal_s200", FP16, S200, opts=C, seed=5, out_dtype=FP32, quick=True),
        fa("fa2_bf16_gqa_causal_s200", BF16, GQA200, opts=C, seed=6),
        fa("fa2_fp16_gqa", FP16, GQA256, seed=7),
        fa("fa2_bf16_causal_200x256", BF16, RECT, opts=C, seed=8),
        fa("fa2_bf16_softcap30_causal", BF16, S, opts=SOFTCAP, seed=9, special="large_logits"),
        fa("fa2_bf16_sinks", BF16, S, opts=SINKS, seed=10),
        fa("fa2_bf16_window64_0", BF16, S, opts=WINDOW, seed=11),
        fa("fa2_bf16_alibi_causal", BF16, S, opts=ALIBI, seed=12),
        fa("fa2_bf16_late_max", BF16, S, seed=13, special="late_max", quick=True),
        fa("fa2_fp16_big_v", FP16, S, seed=14, special="big_v"),
        fa("fa2_bf16_bshd", BF16, S, opts=BSHD, seed=15, pass_lse=False),
        Case("math_bf16", "math", True, BF16, S, seed=16, quick=True),
        Case("math_prescaled_bf16", "math", True, BF16, S, opts=PRESCALE, seed=26),
        Case("math_prescaled_fp16_causal_s300", "math", True, FP16, S300, opts=PRESCALE_CAUSAL, seed=27),
        Case("math_fp16_causal_s200", "math", True, FP16, S200, opts=C, seed=17),
        Case("fp32_autograd", "fp32", True, FP32, S, seed=18, quick=True),
        Case("fa2_bwd_bf16_s200", "fa2-bwd", True, BF16, S200, seed=19, backward=True, quick=True),
        Case("fa2_bwd_fp16_causal_s200", "fa2-bwd", True, FP16, S200, opts=C, seed=20, backward=True),
        Case("fa2_bwd_bf16_gqa_causal_s200", "fa2-bwd", True, BF16, GQA200, opts=C, seed=21, backward=True),
        Case("math_bwd_bf16_s200", "math-bwd", True, BF16, S200, seed=22, backward=True),
        Case("math_bwd_fp16_causal_s200", "math-bwd", True, FP16, S200, opts=C, seed=23, backward=True),
        Case("fp32_autograd_bwd_s200", "fp32-bwd", True, FP32, S200, seed=24, backward=True),
    ]
    def bug(name: str, base: Case, note: str, b: Bug, quick: bool = False, **kw: Any) -> Case:
        return replace(base, name=name, honest=False, bug=b, note=note, quick=quick, twin=base.name, **kw)

    by = {c.name: c for c in honest}
    bugs = [
        bug("bug_a_bwd_half_do_in_d", by["fa2_bwd_bf16_s200"], "(a) D from a half-written dO",
            Bug(half_do_in_d=True), quick=True),
        bug("bug_b_bwd_dq_x1.01_batch2", by["fa2_bwd_bf16_s200"], "(b) dQ scaled 1.01 at batch >= 2",
            Bug(dq_scaled_batch2=0.01)),
        bug("bug_b_bwd_dq_x1.05_batch2", by["fa2_bwd_bf16_s200"], "(b) dQ scaled 1.05 at batch >= 2",
            Bug(dq_scaled_batch2=0.05)),
        bug("bug_c_nan_tails_s200", by["fa2_bf16_causal_s200_b128"], "(c) NaN rows past the last 128 block",
            Bug(nan_tails=True), quick=True),
        bug("bug_d_causal_bottom_right", by["fa2_bf16_causal_200x256"], "(d) bottom-right causal for top-left",
            Bug(swapped_align=True)),
        bug("bug_e_softcap_after_mask", by["fa2_bf16_softcap30_causal"], "(e) mask -1e4, then soft-cap 30",
            Bug(cap_after_mask=True)),
        bug("bug_f_gqa_modulo", by["fa2_bf16_gqa_causal_s200"], "(f) KV head h % kv_heads",
            Bug(gqa_modulo=True)),
        bug("bug_g_lse_log2", by["fa2_bf16"], "(g) LSE in base 2, judged as natural", Bug(lse_log2=True)),
        bug("bug_h_sink_times_log2e", by["fa2_bf16_sinks"], "(h) sink multiplied by log2(e)",
            Bug(sink_log2e=True)),
        bug("bug_i_window_off_by_one", by["fa2_bf16_window64_0"], "(i) left window one key short",
            Bug(window_off_by_one=True)),
        bug("bug_j_alibi_reversed", by["fa2_bf16_alibi_causal"], "(j) ALiBi slopes reversed",
            Bug(alibi_reversed=True)),
        bug("bug_k_skip_late_rescale", by["fa2_bf16_late_max"], "(k) acc not rescaled in tiles >= 2",
            Bug(skip_late_rescale=True), quick=True),
        bug("bug_l_l_bf16_with_lse", by["fa2_bf16"], "(l) denominator accumulated in bf16, LSE given",
            Bug(l_bf16=True)),
        bug("bug_l_l_bf16_no_lse", by["fa2_bf16"], "(l) denominator accumulated in bf16, no LSE",
            Bug(l_bf16=True), pass_lse=False, quick=True),
        bug("bug_m_lse_plus_1e-3", by["fa2_bf16"], "(m) LSE + 1e-3", Bug(lse_offset=True), quick=True),
        bug("bug_n_fp16_acc_overflow", by["fa2_fp16_big_v"], "(n) fp16 accumulator overflows (V ~ 4000)",
            Bug(acc_fp16=True)),
        bug("bug_o_bshd_read_as_bhsd", by["fa2_bf16_bshd"], "(o) bshd read with .view as bhsd",
            Bug(view_strides=True), quick=True),
    ]
    return honest + bugs


# ----------------------------------------------------------------------------------------------
# The judges
# ----------------------------------------------------------------------------------------------

DEFAULT_ATOL = {FP16: 1e-3, BF16: 1e-3, FP32: 1e-5, FP64: 1e-7}   # test_transformers.py
DEFAULT_RTOL = {FP16: 1e-3, BF16: 1.6e-2, FP32: 1.3e-6, FP64: 1e-7}
FUDGE = {"out": 4.0, "dq": 180.0, "dk": 16.0, "dv": 4.0}


@dataclass
class Verdict:
    passed: Optional[bool]           # None: the judge could not judge (error / n/a)
    ratio: Optional[float] = None    # sharpcheck's proven-tier bound ratio (Report.bound_ratio) on a pass
    statistical: Optional[float] = None  # Report.statistical_ratio (the verdict fails above 1 on either)
    detail: str = ""                 # first lines of the failure message, or the error
    seconds: float = 0.0
    inconclusive: bool = False

    def cell(self, honest: bool) -> str:
        if self.passed is None:
            return "n/a" if self.detail.startswith("n/a") else "ERR"
        text = "PASS" if self.passed else "FAIL"
        if self.passed and self.inconclusive:
            text = "PASS(inconcl.)"
        if self.ratio is not None and self.passed:
            text += f" {self.ratio:.2g}"
        if self.passed != honest:
            text += " ✗"
        return text

    def wrong(self, honest: bool) -> bool:
        return self.passed is not None and self.passed != honest


def sharpcheck_judge(case: Case, result, q, k, v, dout, tolerance: Optional[str]) -> Verdict:
    kw = case.opts.sharpcheck_kwargs()
    if tolerance is not None:
        kw["tolerance"] = tolerance
    start = time.perf_counter()
    try:
        if case.backward:
            report = sharpcheck.assert_attention_backward_close(result["dq"], result["dk"], result["dv"],
                                                                q, k, v, dout, name=case.name, **kw)
        else:
            report = sharpcheck.assert_attention_close(result["out"], q, k, v, lse=result["lse"],
                                                       name=case.name, **kw)
    except AssertionError as error:
        return Verdict(False, detail="\n".join(str(error).splitlines()[:12]),
                       seconds=time.perf_counter() - start)
    except Exception as error:  # noqa: BLE001 -- an unknown recipe, a refused input: not a verdict
        tag = "n/a: " if tolerance is not None else ""
        return Verdict(None, detail=f"{tag}{type(error).__name__}: {error}", seconds=time.perf_counter() - start)
    return Verdict(True, ratio=report.bound_ratio, statistical=report.statistical_ratio,
                   inconclusive=report.inconclusive, detail=getattr(report, "recipe_note", ""),
                   seconds=time.perf_counter() - start)


def rtol_of(true64: torch.Tensor, lowp: torch.Tensor, dtype) -> float:
    deviation = ((true64 - lowp.double()) / true64).abs()
    deviation = torch.nan_to_num(deviation, nan=DEFAULT_RTOL[dtype])
    return deviation.max().item()


def torch_judges(case: Case, got: Dict[str, torch.Tensor], ref64: Dict[str, torch.Tensor],
                 lowp: Dict[str, torch.Tensor]) -> Dict[str, Verdict]:
    """assert_close, FlashAttention's rule and PyTorch SDPA's fudge-factor rule over the output (or
    the three gradients)."""
    verdicts: Dict[str, Verdict] = {}
    # assert_close: the tensor in its own dtype against the fp64 reference rounded to it.
    start = time.perf_counter()
    try:
        for key, tensor in got.items():
            torch.testing.assert_close(tensor, ref64[key].to(tensor.dtype))
        verdicts["assert_close"] = Verdict(True)
    except AssertionError as error:
        verdicts["assert_close"] = Verdict(False, detail=str(error).splitlines()[0])
    verdicts["assert_close"].seconds = time.perf_counter() - start
    # FlashAttention: 2x (3x for gradients) the math path's own deviation from the fp64 reference.
    factor = 3.0 if case.backward else 2.0
    ok, why = True, []
    for key, tensor in got.items():
        err = (tensor.double() - ref64[key]).abs().max().item()
        base = (lowp[key].double() - ref64[key]).abs().max().item()
        if not err <= factor * base + 1e-5:
            ok = False
            why.append(f"{key}: {err:.3g} > {factor:g} * {base:.3g} + 1e-5")
    verdicts["fa_rule"] = Verdict(ok, detail="; ".join(why))
    # PyTorch SDPA (test_transformers.py get_tolerances): tolerances from the low-precision deviation.
    ok, why = True, []
    for key, tensor in got.items():
        dt = lowp[key].dtype
        atol = (ref64[key] - lowp[key].double()).abs().max().item()
        rtol = rtol_of(ref64[key], lowp[key], dt)
        atol = FUDGE[key] * max(atol, DEFAULT_ATOL[dt])
        rtol = FUDGE[key] * max(rtol, DEFAULT_RTOL[dt])
        if rtol > 1e30:
            rtol = DEFAULT_RTOL[dt]
        if not torch.allclose(tensor.double(), ref64[key].to(tensor.dtype).double(), rtol=rtol, atol=atol):
            ok = False
            why.append(f"{key}: atol {atol:.3g} rtol {rtol:.3g}")
    verdicts["sdpa_rule"] = Verdict(ok, detail="; ".join(why))
    return verdicts


def references(case: Case, q, k, v, dout):
    """(ref64, lowp) dicts keyed like the kernel's results, bhsd."""
    o = case.opts
    qb, kb, vb, db = (to_bhsd(x, o.layout) for x in (q, k, v, dout))
    if case.backward:
        ref = dict(zip(("dq", "dk", "dv"), math_gradients(qb, kb, vb, db, o, FP64)[1:]))
        low = dict(zip(("dq", "dk", "dv"), math_gradients(qb, kb, vb, db, o, case.dtype)[1:]))
    else:
        ref = {"out": math_attention(qb, kb, vb, o, FP64)}
        low = {"out": math_attention(qb, kb, vb, o, case.dtype)}
    return ref, low


# Wrong default verdicts that are known and documented (docs/verdicts.md), each with its reason. The
# run fails on any other wrong verdict, and on a known one that no longer happens.
KNOWN_MISSES = {
}

JUDGES = ["sc_default", "sc_declared", "assert_close", "fa_rule", "sdpa_rule"]
TITLES = {"sc_default": "sharpcheck default", "sc_declared": "sharpcheck declared", "assert_close": "assert_close",
          "fa_rule": "FA rule", "sdpa_rule": "SDPA fudge rule"}


def run_case(case: Case) -> Dict[str, Any]:
    q, k, v, dout = make_inputs(case.seed, case.dtype, case.shape, case.special, case.opts.layout)
    start = time.perf_counter()
    result = case.run(q, k, v, dout)
    kernel_s = time.perf_counter() - start
    verdicts = {"sc_default": sharpcheck_judge(case, result, q, k, v, dout, None),
                "sc_declared": sharpcheck_judge(case, result, q, k, v, dout, case.recipe())}
    ref64, lowp = references(case, q, k, v, dout)
    got = {key: to_bhsd(t, case.opts.layout) for key, t in result.items() if key != "lse"}
    verdicts.update(torch_judges(case, got, ref64, lowp))
    return {"name": case.name, "design": case.design, "dtype": NAME[case.dtype],
            "out_dtype": NAME[case.out_dtype] if case.out_dtype else None, "honest": case.honest,
            "note": case.note, "twin": case.twin, "recipe": case.recipe(), "lse_passed": (not case.backward) and case.pass_lse,
            "kernel_s": kernel_s, "verdicts": verdicts}


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------

def design_text(row) -> str:
    text = f"{row['design']} {row['dtype']}"
    if row["out_dtype"]:
        text += f"->{row['out_dtype']}"
    return text


def twin_also_fails(row, judge: str, by_name) -> bool:
    """A bug failed by a judge that fails its honest twin too: the verdict does not single out the bug."""
    twin = by_name.get(row["twin"])
    return (not row["honest"] and twin is not None and row["verdicts"][judge].passed is False and
            twin["verdicts"][judge].passed is False)


def tables(rows) -> Tuple[List[List[str]], List[List[str]]]:
    by_name = {r["name"]: r for r in rows}
    header = ["kernel", "design", "truth"] + [TITLES[j] for j in JUDGES]
    main = [header]
    for row in rows:
        cells = []
        for j in JUDGES:
            cell = row["verdicts"][j].cell(row["honest"])
            cells.append(cell + " °" if twin_also_fails(row, j, by_name) else cell)
        main.append([row["name"], design_text(row), "honest" if row["honest"] else f"bug {row['note'][:3]}"] + cells)
    summary = [["judge", "false passes", "false fails", "n/a / errors", "bugs failed with their twin (°)"]]
    for j in JUDGES:
        fp = sum(1 for r in rows if not r["honest"] and r["verdicts"][j].passed is True)
        ff = sum(1 for r in rows if r["honest"] and r["verdicts"][j].passed is False)
        na = sum(1 for r in rows if r["verdicts"][j].passed is None)
        tw = sum(1 for r in rows if twin_also_fails(r, j, by_name))
        summary.append([TITLES[j], str(fp), str(ff), str(na), str(tw)])
    return main, summary


LEGEND = ("✗ wrong verdict; ° a bug failed by a judge that also fails its honest twin (the FAIL does not single "
          "out the bug); sharpcheck PASS cells show the proven-tier bound ratio; the torch judges see the "
          "output or gradients, never the LSE.")


def plain(table: List[List[str]]) -> str:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(table: List[List[str]]) -> str:
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "|".join("---" for _ in table[0]) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table[1:]]
    return "\n".join(lines)


def failure_lines(rows) -> List[str]:
    """For each kernel sharpcheck's default judge failed: the message's first line, the worst element
    and sharpcheck's first reason; and every judge error."""
    lines = []
    for row in rows:
        for j in ("sc_default", "sc_declared"):
            verdict = row["verdicts"][j]
            if verdict.passed is False and j == "sc_default":
                msg = verdict.detail.splitlines()
                worst = next((m for m in msg if m.startswith("Worst element")), "")
                reasons = [m for m in msg if m.startswith("sharpcheck:")]
                lines.append(f"{row['name']}: {msg[0] if msg else ''}")
                for extra in [worst] + reasons[:1] + reasons[-1:] * (len(reasons) > 1):
                    if extra:
                        lines.append(f"    {extra[:220]}{' ...' if len(extra) > 220 else ''}")
            elif verdict.passed is None and not verdict.detail.startswith("n/a"):
                lines.append(f"{row['name']} [{TITLES[j]}] ERROR: {verdict.detail.splitlines()[0]}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a third of the kernels (for ctest)")
    parser.add_argument("--markdown", metavar="FILE", help="write both tables as markdown")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--only", metavar="SUBSTRING", help="only the kernels whose name contains this")
    args = parser.parse_args()

    selected = [c for c in cases() if (c.quick or not args.quick) and (not args.only or args.only in c.name)]
    start = time.perf_counter()
    rows = []
    for case in selected:
        rows.append(run_case(case))
    elapsed = time.perf_counter() - start

    main_table, summary = tables(rows)
    print(plain(main_table))
    print(LEGEND)
    print()
    print(plain(summary))
    fails = failure_lines(rows)
    if fails:
        print("\nsharpcheck (default) failure messages, and judge errors:")
        print("\n".join(fails))
    na = sorted({r["verdicts"]["sc_declared"].detail.splitlines()[0] for r in rows
                 if r["verdicts"]["sc_declared"].passed is None})
    if na:
        print("\nsharpcheck declared n/a:\n  " + "\n  ".join(na))
    sc_seconds = sum(r["verdicts"][j].seconds for r in rows for j in ("sc_default", "sc_declared"))
    print(f"\n{len(rows)} kernels in {elapsed:.1f} s (sharpcheck judging {sc_seconds:.1f} s), "
          f"torch threads {torch.get_num_threads()}")

    wrong = [r["name"] for r in rows if r["verdicts"]["sc_default"].wrong(r["honest"])]
    errors = [r["name"] for r in rows if r["verdicts"]["sc_default"].passed is None]
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("## Kernels\n\n" + markdown(main_table) + "\n\n" + LEGEND + "\n\n## Summary\n\n" +
                    markdown(summary) + "\n")
    if args.json:
        out = []
        for r in rows:
            r = dict(r)
            r["verdicts"] = {j: {"passed": v.passed, "bound_ratio": v.ratio, "statistical_ratio": v.statistical,
                                 "inconclusive": v.inconclusive,
                                 "detail": v.detail, "seconds": round(v.seconds, 3),
                                 "wrong": v.wrong(r["honest"])} for j, v in r["verdicts"].items()}
            out.append(r)
        with open(args.json, "w") as f:
            json.dump({"elapsed_s": elapsed, "quick": args.quick, "rows": out}, f, indent=2)
    known = [name for name in wrong if name in KNOWN_MISSES]
    fixed = [name for name in KNOWN_MISSES if name in {r["name"] for r in rows} and name not in wrong]
    wrong = [name for name in wrong if name not in KNOWN_MISSES]
    for name in known:
        print(f"\nknown miss (docs/verdicts.md): {name}: {KNOWN_MISSES[name]}")
    if fixed:  # the list must stay true: a miss that no longer happens is taken off it
        print(f"\nno longer missed, take off KNOWN_MISSES: {fixed}")
        return 1
    if wrong or errors:
        print(f"\nsharpcheck default: wrong verdicts on {wrong}, errors on {errors}")
        return 1
    print("\nsharpcheck default: every verdict right" + (" but the known misses" if known else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
