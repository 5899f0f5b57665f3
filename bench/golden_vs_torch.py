#!/usr/bin/env python3
"""sharpcheck's correctly rounded attention references and judgements against the "golden" that
peers compute instead: PyTorch's math path in fp64 (matmul, softmax, matmul; autograd for the
gradients), in one process, on the same inputs, medians of --repeats runs each.

Rows: the forward reference (sharpcheck.attention) and judgement (assert_attention_close with the
LSE) against torch's fp64 forward; the backward reference (sharpcheck.attention_backward) and
judgement (assert_attention_backward_close) against torch's fp64 forward plus autograd backward.
The kernel judged is torch's own fp32 math path rounded to the inputs' format (an honest kernel,
so the judgement runs to the end). Inputs: bf16 normal(0, 1) Q, K, V, dO, causal, [B, H, S, D].

    PYTHONPATH=build/python python3 bench/golden_vs_torch.py --shape 1 8 2048 128

Threads: torch and sharpcheck both use every core (torch.get_num_threads(), sharpcheck's
threads=0 and OpenBLAS's own pool). The machine's load average is printed beside the table:
compare the ratios, which are taken within one run.
"""
import argparse
import os
import statistics
import time

import numpy as np
import torch

import sharpcheck


def median_seconds(work, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_forward(q, k, v, mask, scale):
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def torch_fp64_backward(q, k, v, dout, mask, scale):
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out = torch_forward(q64, k64, v64, mask, scale)
    out.backward(dout.double())
    return q64.grad, k64.grad, v64.grad


def kernel_outputs(q, k, v, dout, mask, scale):
    """An fp32 math-path kernel: its output, LSE and gradients, rounded to bf16 (LSE in fp32)."""
    q32, k32, v32 = (x.float().requires_grad_() for x in (q, k, v))
    s = ((q32 @ k32.transpose(-1, -2)) * scale).masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ v32
    out.backward(dout.float())
    return (out.detach().bfloat16(), lse.detach(),
            q32.grad.bfloat16(), k32.grad.bfloat16(), v32.grad.bfloat16())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=4, default=[1, 8, 2048, 128], metavar=("B", "H", "S", "D"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default="forward,backward", help="forward, backward or both")
    args = parser.parse_args()
    b, h, s, d = args.shape
    generator = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(b, h, s, d, generator=generator).bfloat16() for _ in range(4))
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    scale = d ** -0.5
    out, lse, dq, dk, dv = kernel_outputs(q, k, v, dout, mask, scale)
    rows = []
    if "forward" in args.rows:
        golden = median_seconds(lambda: torch_forward(q.double(), k.double(), v.double(), mask, scale), args.repeats)
        reference = median_seconds(lambda: sharpcheck.attention(q, k, v, causal=True, format="bf16"), args.repeats)
        judgement = median_seconds(
            lambda: sharpcheck.assert_attention_close(out, q, k, v, lse=lse, causal=True), args.repeats)
        rows += [("torch fp64 forward (math path)", golden, 1.0),
                 ("sharpcheck.attention (reference, bf16)", reference, reference / golden),
                 ("assert_attention_close (judgement, with LSE)", judgement, judgement / golden)]
    if "backward" in args.rows:
        golden = median_seconds(lambda: torch_fp64_backward(q, k, v, dout, mask, scale), args.repeats)
        reference = median_seconds(
            lambda: sharpcheck.attention_backward(q, k, v, dout, causal=True, format="bf16"), args.repeats)
        judgement = median_seconds(
            lambda: sharpcheck.assert_attention_backward_close(dq, dk, dv, q, k, v, dout, causal=True), args.repeats)
        rows += [("torch fp64 forward + autograd backward", golden, 1.0),
                 ("sharpcheck.attention_backward (reference, bf16)", reference, reference / golden),
                 ("assert_attention_backward_close (judgement)", judgement, judgement / golden)]
    print(f"shape [{b}, {h}, {s}, {d}] causal bf16, medians of {args.repeats}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    print("| what | median | vs torch fp64 |")
    print("|---|---:|---:|")
    for name, seconds, ratio in rows:
        print(f"| {name} | {seconds:.2f} s | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
